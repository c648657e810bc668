"""The object-store behaviour suite: every test with a ``store`` argument runs on the
local directory and on the S3 server (moto over HTTP); backend-specific tests follow."""

from __future__ import annotations

import base64
import hashlib
import logging
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import ChecksumMismatch, Conflict, InvalidInput, NotFound, StorageError
from catalog.objects import open_store
from catalog.objects.base import ObjectStore, PutResult, object_key
from catalog.objects.local import LocalObjectStore
from catalog.objects.s3 import S3ObjectStore
from tests.fixtures.s3 import S3RequestCounter, s3_client

MiB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob(n: int, seed: int = 0) -> bytes:
    """``n`` deterministic pseudo-random bytes."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def overwrite_raw(store: ObjectStore, sha256: str, data: bytes) -> None:
    """Replace a stored object's bytes behind the store's back (simulated bit rot)."""
    if isinstance(store, LocalObjectStore):
        path = store.object_path(sha256)
        path.chmod(0o644)
        path.write_bytes(data)
    else:
        assert isinstance(store, S3ObjectStore)
        s3_client(store.client.meta.endpoint_url).put_object(
            Bucket=store.bucket, Key=store.key_of(sha256), Body=data
        )


def stored_keys(store: ObjectStore) -> list[str]:
    """Every key or file the backend holds, as the backend itself lists it."""
    if isinstance(store, LocalObjectStore):
        return sorted(
            p.relative_to(store.root).as_posix()
            for p in store.root.rglob("*")
            if p.is_file() and ".tmp" not in p.parts
        )
    assert isinstance(store, S3ObjectStore)
    client = s3_client(store.client.meta.endpoint_url)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


# -- layout -----------------------------------------------------------------------------
def test_object_key_layout() -> None:
    h = sha(b"x")
    assert object_key("", h) == f"objects/{h[:2]}/{h}"
    assert object_key("/lake/main/", h) == f"lake/main/objects/{h[:2]}/{h}"
    with pytest.raises(InvalidInput):
        object_key("", h.upper())
    with pytest.raises(InvalidInput):
        object_key("", h[:-1])


def test_stored_under_its_key(store: ObjectStore) -> None:
    data = b"layout"
    store.put_bytes(data)
    prefix = "lake/main/" if isinstance(store, S3ObjectStore) else ""
    assert stored_keys(store) == [f"{prefix}objects/{sha(data)[:2]}/{sha(data)}"]


# -- put / get ----------------------------------------------------------------------------
def test_put_get_round_trip(store: ObjectStore) -> None:
    data = blob(100_000)
    result = store.put_bytes(data)
    assert result.created is True
    assert result.info.sha256 == sha(data)
    assert result.info.size == len(data)
    assert store.get(sha(data)) == data
    assert store.head(sha(data)) == result.info
    assert store.exists(sha(data))
    assert store.verify(sha(data)) == result.info


def test_empty_object(store: ObjectStore) -> None:
    result = store.put_bytes(b"")
    assert result.info.size == 0
    assert store.get(sha(b"")) == b""


def test_identical_content_is_stored_once(store: ObjectStore, tmp_path: Path) -> None:
    data = blob(5000, seed=1)
    first = store.put_bytes(data)
    again = store.put_bytes(data, sha(data))
    src = tmp_path / "same.bin"
    src.write_bytes(data)
    from_file = store.put_file(src)
    assert first.created and not again.created and not from_file.created
    assert again.info == first.info == from_file.info
    assert list(store.iter_objects()) == [first.info]
    assert len(stored_keys(store)) == 1


def test_put_file_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    data = blob(300_000, seed=2)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    result = store.put_file(src, sha(data))
    assert result == PutResult(result.info, created=True)
    assert store.get(sha(data)) == data


def test_wrong_supplied_sha256_stores_nothing(store: ObjectStore, tmp_path: Path) -> None:
    data, other = b"the bytes", sha(b"other bytes")
    with pytest.raises(ChecksumMismatch) as info:
        store.put_bytes(data, other)
    assert info.value.details["sha256"] == other
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    with pytest.raises(ChecksumMismatch):
        store.put_file(src, other)
    with pytest.raises(InvalidInput):
        store.put_bytes(data, "not-a-sha")
    assert not store.exists(sha(data)) and not store.exists(other)
    assert list(store.iter_objects()) == []
    assert stored_keys(store) == []
    # The object is stored, but this file of the same size is not its content.
    store.put_bytes(data)
    src.write_bytes(data.upper())
    with pytest.raises(ChecksumMismatch):
        store.put_file(src, sha(data))
    assert store.get(sha(data)) == data


def test_put_file_missing_source(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        store.put_file(tmp_path / "absent.bin")


def test_ranged_get(store: ObjectStore) -> None:
    data = blob(10_000, seed=3)
    h = store.put_bytes(data).info.sha256
    assert store.get_range(h, 0, 10) == data[:10]
    assert store.get_range(h, 1234, 4000) == data[1234:5234]
    assert store.get_range(h, 9_999, 1) == data[-1:]
    assert store.get_range(h, 10_000, 0) == b""
    for offset, length in [(9_000, 2_000), (10_000, 1), (-1, 5), (0, -1)]:
        with pytest.raises(InvalidInput):
            store.get_range(h, offset, length)
    with pytest.raises(NotFound):
        store.get_range(sha(b"absent"), 0, 1)


def test_missing_object(store: ObjectStore, tmp_path: Path) -> None:
    h = sha(b"never stored")
    assert store.head(h) is None
    assert not store.exists(h)
    for call in (store.get, store.verify, lambda x: store.download(x, tmp_path / "d")):
        with pytest.raises(NotFound) as info:
            call(h)
        assert info.value.details["sha256"] == h
    assert not (tmp_path / "d").exists()
    with pytest.raises(InvalidInput):
        store.head("xyz")


# -- verification -------------------------------------------------------------------------
def test_download_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    data = blob(200_000, seed=4)
    h = store.put_bytes(data).info.sha256
    dest = tmp_path / "out" / "latent.bin"
    assert store.download(h, dest).size == len(data)
    assert dest.read_bytes() == data
    dest.write_bytes(b"stale")  # a second download replaces whatever was there
    store.download(h, dest)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["latent.bin"]


@pytest.mark.parametrize("corruption", ["same-size", "truncated"])
def test_corruption_is_detected(store: ObjectStore, tmp_path: Path, corruption: str) -> None:
    data = blob(50_000, seed=5)
    h = store.put_bytes(data).info.sha256
    bad = bytes([data[0] ^ 1]) + data[1:] if corruption == "same-size" else data[:-1]
    overwrite_raw(store, h, bad)

    for call in (store.get, store.verify):
        with pytest.raises(ChecksumMismatch) as info:
            call(h)
        assert info.value.details["sha256"] == h
    dest = tmp_path / "dl" / "x.bin"
    with pytest.raises(ChecksumMismatch):
        store.download(h, dest)
    assert list(dest.parent.iterdir()) == []  # neither the file nor its temp file
    # A put of the true bytes must not pass the corrupt object off as stored: the size
    # is always checked, the content with verify_existing (and locally when cheap).
    strict = pickle.loads(pickle.dumps(store))
    strict.verify_existing = True
    checked = (
        [strict, store] if corruption == "truncated" or store.url.startswith("file:") else [strict]
    )
    for s in checked:
        with pytest.raises(ChecksumMismatch):
            s.put_bytes(data)


# -- named keys ---------------------------------------------------------------------------
def test_named_keys_are_create_only(store: ObjectStore) -> None:
    store.put_key("manifests/v000001.json", b'{"version": 1}')
    with pytest.raises(Conflict) as info:
        store.put_key("manifests/v000001.json", b'{"version": "other"}')
    assert info.value.details["key"] == "manifests/v000001.json"
    with pytest.raises(Conflict):
        store.put_key("manifests/v000001.json", b'{"version": 1}')  # same bytes, too
    assert store.get_key("manifests/v000001.json") == b'{"version": 1}'
    assert store.key_exists("manifests/v000001.json")
    assert not store.key_exists("manifests/v000002.json")
    with pytest.raises(NotFound):
        store.get_key("manifests/v000002.json")
    with pytest.raises(NotFound):
        store.get_key("manifests")  # a "directory" is not a key


@pytest.mark.parametrize(
    "key", ["", "/abs", "a/../b", "..", ".hidden", "a//b", "a/", "objects/ab/cd", "a b", "a\\b"]
)
def test_invalid_named_keys(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidInput):
        store.put_key(key, b"x")
    with pytest.raises(InvalidInput):
        store.get_key(key)
    assert stored_keys(store) == []


def test_list_keys(store: ObjectStore) -> None:
    names = ["manifests/v000002.json", "manifests/v000001.json", "restores/r1.json", "top.json"]
    for name in names:
        store.put_key(name, name.encode())
    store.put_bytes(b"an object, not a key")
    assert store.list_keys("") == sorted(names)
    assert store.list_keys("manifests/") == ["manifests/v000001.json", "manifests/v000002.json"]
    assert store.list_keys("manifests/v000002") == ["manifests/v000002.json"]
    assert store.list_keys("ma") == ["manifests/v000001.json", "manifests/v000002.json"]
    assert store.list_keys("t") == ["top.json"]
    assert store.list_keys("nothing/") == []
    assert store.list_keys("objects/") == []
    assert store.list_keys("../") == []


# -- inventory and deletion -----------------------------------------------------------------
def test_iter_objects(store: ObjectStore) -> None:
    infos = {store.put_bytes(blob(i * 100, seed=i)).info for i in range(1, 6)}
    store.put_key("manifests/v000001.json", b"{}")
    assert set(store.iter_objects()) == infos
    assert len(list(store.iter_objects())) == 5


def test_delete_logs_its_reason(store: ObjectStore, caplog: pytest.LogCaptureFixture) -> None:
    h = store.put_bytes(b"taken down").info.sha256
    keep = store.put_bytes(b"kept").info.sha256
    with pytest.raises(InvalidInput):
        store.delete(h, reason="  ")
    assert store.exists(h)
    with caplog.at_level(logging.WARNING, logger="vidlake.objects"):
        assert store.delete(h, reason="hard takedown T-42") is True
    [record] = [r for r in caplog.records if r.name == "vidlake.objects"]
    assert record.levelno == logging.WARNING
    assert "hard takedown T-42" in record.getMessage() and h in record.getMessage()
    assert not store.exists(h)
    assert store.delete(h, reason="again") is False
    assert [i.sha256 for i in store.iter_objects()] == [keep]


# -- processes, threads, pickling -------------------------------------------------------------
def test_pickle_round_trip(store: ObjectStore) -> None:
    h = store.put_bytes(b"before pickling").info.sha256
    clone = pickle.loads(pickle.dumps(store))
    assert type(clone) is type(store)
    assert clone.url == store.url
    assert clone.get(h) == b"before pickling"
    assert clone.put_bytes(b"after pickling").created
    assert store.exists(sha(b"after pickling"))
    if isinstance(store, S3ObjectStore):
        assert store._client is not None
        assert pickle.loads(pickle.dumps(store))._client is None  # no live client travels


def test_reopen_from_url(store: ObjectStore) -> None:
    h = store.put_bytes(b"by url").info.sha256
    extra: dict[str, Any] = {}
    if isinstance(store, S3ObjectStore):
        extra["endpoint_url"] = store.endpoint_url
    assert open_store(store.url, **extra).get(h) == b"by url"


def _race(n: int, fn: Callable[[], Any]) -> list[Any]:
    barrier = threading.Barrier(n)

    def run() -> Any:
        barrier.wait()
        try:
            return fn()
        except Conflict as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: run(), range(n)))


def test_concurrent_puts_create_once(store: ObjectStore) -> None:
    data = blob(256 * 1024, seed=6)
    results = _race(8, lambda: store.put_bytes(data))
    assert sorted(r.created for r in results) == [False] * 7 + [True]
    assert {r.info for r in results} == {store.head(sha(data))}
    assert len(stored_keys(store)) == 1
    assert store.get(sha(data)) == data


def test_concurrent_put_key_has_one_winner(store: ObjectStore) -> None:
    results = _race(8, lambda: store.put_key("manifests/v000007.json", os.urandom(64)))
    winners = [r for r in results if r is None]
    assert len(winners) == 1
    assert all(isinstance(r, Conflict) for r in results if r is not None)
    assert len(store.get_key("manifests/v000007.json")) == 64


def _put_in_child(root: str, data: bytes, out: Any) -> None:
    out.put(LocalObjectStore(root).put_bytes(data).created)


def test_local_concurrent_processes_create_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    data = blob(2 * MiB, seed=7)
    procs = [ctx.Process(target=_put_in_child, args=(str(tmp_path), data, out)) for _ in range(4)]
    for p in procs:
        p.start()
    created = sorted(out.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert created == [False, False, False, True]
    assert LocalObjectStore(tmp_path).verify(sha(data)).size == len(data)


def test_local_leaves_no_temp_files_and_objects_are_read_only(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    h = store.put_bytes(b"ro").info.sha256
    store.put_key("k.json", b"{}")
    with pytest.raises(Conflict):
        store.put_key("k.json", b"{}")
    assert list((tmp_path / ".tmp").iterdir()) == []
    assert not os.access(store.object_path(h), os.W_OK) or os.geteuid() == 0
    assert store.object_path(h).stat().st_mode & 0o222 == 0
    assert store.url == tmp_path.absolute().as_uri()


def test_local_key_cannot_also_be_a_directory(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put_key("a", b"1")
    with pytest.raises(Conflict):
        store.put_key("a/b", b"2")
    store.put_key("c/d", b"3")
    with pytest.raises(Conflict):
        store.put_key("c", b"4")
    assert store.list_keys("") == ["a", "c/d"]


def test_local_large_file(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "s")
    src = tmp_path / "big.bin"
    src.write_bytes(blob(12 * MiB, seed=8))
    result = store.put_file(src)
    assert result.created and result.info.size == 12 * MiB
    assert store.verify(result.info.sha256) == result.info
    assert store.put_file(src, result.info.sha256).created is False


# -- S3 specifics ---------------------------------------------------------------------------
@pytest.fixture
def mp_store(s3_server: str, s3_bucket: str) -> S3ObjectStore:
    """A store that goes multipart above 1 MiB, in 5 MiB parts."""
    return S3ObjectStore(
        s3_bucket, "mp", endpoint_url=s3_server, multipart_threshold=1 * MiB, part_size=5 * MiB
    )


@pytest.mark.s3
def test_s3_multipart_upload(
    mp_store: S3ObjectStore, s3_request_counter: S3RequestCounter, tmp_path: Path
) -> None:
    data = blob(11 * MiB + 123, seed=9)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    key = mp_store.key_of(sha(data))

    assert mp_store.put_file(src).created
    assert s3_request_counter.count("CreateMultipartUpload", key) == 1
    assert s3_request_counter.count("UploadPart", key) == 3
    assert s3_request_counter.count("PutObject", key) == 0
    assert s3_request_counter.count("CompleteMultipartUpload", key) == 1

    # Its checksum is composite (per part): verification must read the bytes.
    s3_request_counter.reset()
    assert mp_store.verify(sha(data)).size == len(data)
    assert s3_request_counter.count("GetObject", key) == 1
    assert mp_store.get(sha(data)) == data

    # Stored already: the second put uploads nothing.
    s3_request_counter.reset()
    assert mp_store.put_file(src).created is False
    assert mp_store.put_bytes(data).created is False
    assert s3_request_counter.count(("CreateMultipartUpload", "UploadPart"), key) == 0


@pytest.mark.s3
def test_s3_large_bytes_go_multipart(
    mp_store: S3ObjectStore, s3_request_counter: S3RequestCounter
) -> None:
    data = blob(6 * MiB, seed=12)
    assert mp_store.put_bytes(data).created
    key = mp_store.key_of(sha(data))
    assert s3_request_counter.count("UploadPart", key) == 2
    assert s3_request_counter.count("PutObject", key) == 0
    assert mp_store.get(sha(data)) == data


@pytest.mark.s3
def test_s3_multipart_completion_is_conditional(
    mp_store: S3ObjectStore,
    s3_request_counter: S3RequestCounter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another writer finishes the same object between our HEAD and our completion."""
    data = blob(6 * MiB, seed=10)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    real_existing = mp_store._existing
    calls = []

    def racing_existing(key: str, sha256: str, size: int) -> PutResult | None:
        calls.append(key)
        if len(calls) == 1:  # our pre-upload HEAD misses; meanwhile the rival writes
            S3ObjectStore(mp_store.bucket, "mp", endpoint_url=mp_store.endpoint_url).put_bytes(data)
            return None
        return real_existing(key, sha256, size)

    monkeypatch.setattr(mp_store, "_existing", racing_existing)
    result = mp_store.put_file(src)
    key = mp_store.key_of(sha(data))
    assert result.created is False
    assert s3_request_counter.count("CompleteMultipartUpload", key) == 1  # answered 412
    assert s3_request_counter.puts(key) == 2
    assert mp_store.get(sha(data)) == data
    uploads = s3_client(mp_store.endpoint_url or "").list_multipart_uploads(Bucket=mp_store.bucket)
    assert uploads.get("Uploads", []) == []  # the losing upload was aborted


@pytest.mark.s3
def test_s3_concurrent_multipart_puts_store_one_object(
    mp_store: S3ObjectStore, tmp_path: Path
) -> None:
    """Racing multipart uploads of one file all succeed and leave one whole object.

    On S3 the conditional completion is atomic, so exactly one reports created=True.
    moto 5.2.5 checks If-None-Match before it assembles the parts, not atomically with
    it, so two racing completions can both succeed there; this test asserts only what
    holds on both (the sequential 412 on completion is tested above).
    """
    src = tmp_path / "big.bin"
    src.write_bytes(blob(6 * MiB, seed=11))
    results = _race(3, lambda: mp_store.put_file(src))
    assert any(r.created for r in results)
    assert {r.info for r in results} == {mp_store.head(sha(src.read_bytes()))}
    assert len(stored_keys(mp_store)) == 1
    assert mp_store.verify(results[0].info.sha256).size == 6 * MiB
    uploads = s3_client(mp_store.endpoint_url or "").list_multipart_uploads(Bucket=mp_store.bucket)
    assert uploads.get("Uploads", []) == []


def _put_claiming(store: S3ObjectStore, sha256: str, body: bytes) -> None:
    """Store ``body`` under object ``sha256``'s key with a client-sent SHA-256 that
    claims it is that object (an endpoint that does not check checksums keeps it)."""
    s3_client(store.endpoint_url or "").put_object(
        Bucket=store.bucket,
        Key=store.key_of(sha256),
        Body=body,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256)).decode(),
    )


@pytest.mark.s3
def test_s3_single_put_sends_sha256(s3_store: S3ObjectStore) -> None:
    data = b"checksummed"
    h = s3_store.put_bytes(data).info.sha256
    head = s3_client(s3_store.endpoint_url or "").head_object(
        Bucket=s3_store.bucket, Key=s3_store.key_of(h), ChecksumMode="ENABLED"
    )
    assert base64.b64decode(head["ChecksumSHA256"]).hex() == h


@pytest.mark.s3
def test_s3_verify_reads_the_content_when_the_endpoint_keeps_unchecked_checksums(
    s3_store: S3ObjectStore, s3_request_counter: S3RequestCounter
) -> None:
    data = blob(40_000, seed=9)
    h = s3_store.put_bytes(data).info.sha256
    # moto stores a client-sent SHA-256 without checking it: a corrupt body that claims
    # the right checksum is accepted, and its HEAD reports the claim.
    bad = bytes([data[0] ^ 1]) + data[1:]
    _put_claiming(s3_store, h, bad)
    head = s3_client(s3_store.endpoint_url or "").head_object(
        Bucket=s3_store.bucket, Key=s3_store.key_of(h), ChecksumMode="ENABLED"
    )
    assert base64.b64decode(head["ChecksumSHA256"]).hex() == h  # the lie, as stored
    with pytest.raises(ChecksumMismatch) as info:
        s3_store.verify(h)
    # Caught by the full read (botocore may already refuse the body for disagreeing with
    # the checksum the endpoint sends along; else the store's own hash differs).
    assert info.value.details["key"] == s3_store.key_of(h)
    assert s3_request_counter.count("GetObject", s3_store.key_of(h)) == 1  # by content
    assert s3_store.checksums_proven is False
    strict = S3ObjectStore(s3_store.bucket, s3_store.prefix, verify_existing=True)
    with pytest.raises(ChecksumMismatch):  # a put of the true bytes finds the lie too
        strict.put_bytes(data)
    # The probe that found out left nothing behind, and is not repeated.
    assert stored_keys(s3_store) == [s3_store.key_of(h)]
    good = s3_store.put_bytes(b"fine").info
    s3_request_counter.reset()
    assert s3_store.verify(good.sha256) == good
    assert s3_request_counter.count("PutObject") == 0
    assert s3_request_counter.count("GetObject", s3_store.key_of(good.sha256)) == 1


@pytest.mark.s3
def test_s3_verify_trusts_a_checksum_only_where_the_endpoint_proves_it_checks_them(
    s3_store: S3ObjectStore, s3_request_counter: S3RequestCounter
) -> None:
    # An endpoint that checks client checksums refuses the probe's deliberately wrong
    # one with BadDigest, as AWS S3 does; then its stored SHA-256 stands for the bytes.
    data = b"checksummed"
    h = s3_store.put_bytes(data).info.sha256
    key = s3_store.key_of(h)
    s3_request_counter.reset()
    s3_request_counter.fail("PutObject", 1, status=400, code="BadDigest")  # the probe
    assert s3_store.verify(h).size == len(data)
    assert s3_store.checksums_proven is True
    assert s3_request_counter.count("PutObject") == 1
    assert s3_request_counter.count("GetObject", key) == 0  # the HEAD's checksum sufficed

    # Rewritten behind our back with a consistent checksum of other bytes: the checksum
    # path catches it without reading the object.
    bad = b"checksummeD"
    s3_client(s3_store.endpoint_url or "").put_object(
        Bucket=s3_store.bucket,
        Key=key,
        Body=bad,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=base64.b64encode(hashlib.sha256(bad).digest()).decode(),
    )
    with pytest.raises(ChecksumMismatch) as info:
        s3_store.verify(h)
    assert info.value.details["actual"] == sha(bad)
    assert s3_request_counter.count("GetObject", key) == 0


@pytest.mark.s3
def test_s3_a_probe_that_fails_otherwise_proves_nothing(
    s3_store: S3ObjectStore, s3_request_counter: S3RequestCounter
) -> None:
    h = s3_store.put_bytes(b"fine").info.sha256
    s3_request_counter.reset()
    s3_request_counter.fail("PutObject", 1, status=403, code="AccessDenied")  # read-only
    assert s3_store.verify(h).size == 4
    assert s3_store.checksums_proven is False
    assert s3_request_counter.count("GetObject", s3_store.key_of(h)) == 1


def test_s3_only_full_object_checksums_count_as_content_hashes() -> None:
    from catalog.objects.s3_checksums import full_object_sha256

    h = sha(b"x")
    b64 = base64.b64encode(bytes.fromhex(h)).decode()
    single_etag = '"9dd4e461268c8034f5c8564e155c67a6"'
    multi_etag = '"16cafe8d6b8c1c55c3d339c8d69326c6-2"'
    # AWS reports the type: only FULL_OBJECT is a hash of the content.
    assert full_object_sha256({"ChecksumSHA256": b64, "ChecksumType": "FULL_OBJECT"}) == h
    assert full_object_sha256({"ChecksumSHA256": f"{b64}-2", "ChecksumType": "COMPOSITE"}) is None
    assert full_object_sha256({"ChecksumSHA256": b64, "ChecksumType": "COMPOSITE"}) is None
    # No type reported (moto, older endpoints): only a single PUT's checksum qualifies.
    assert full_object_sha256({"ChecksumSHA256": b64, "ETag": single_etag}) == h
    assert full_object_sha256({"ChecksumSHA256": b64, "ETag": multi_etag}) is None
    assert full_object_sha256({"ChecksumSHA256": f"{b64}-2", "ETag": single_etag}) is None
    # No checksum, or not a SHA-256: never fall back to the ETag.
    assert full_object_sha256({"ETag": single_etag, "ChecksumCRC32": "AAAAAA=="}) is None
    assert full_object_sha256({"ChecksumSHA256": "not base64!", "ETag": single_etag}) is None


@pytest.mark.s3
def test_s3_identical_put_is_answered_412(
    s3_store: S3ObjectStore, s3_request_counter: S3RequestCounter
) -> None:
    key = s3_store.key_of(sha(b"twice"))
    assert s3_store.put_bytes(b"twice").created
    assert not s3_store.put_bytes(b"twice").created
    assert s3_request_counter.puts(key) == 2  # both sent, the second refused by the server
    assert len(stored_keys(s3_store)) == 1


@pytest.mark.s3
def test_s3_retries_throttling_and_5xx(
    s3_server: str, s3_bucket: str, s3_request_counter: S3RequestCounter
) -> None:
    store = S3ObjectStore(s3_bucket, endpoint_url=s3_server, max_attempts=4)
    key = store.key_of(sha(b"retried"))
    s3_request_counter.fail("PutObject", 1, status=503, code="SlowDown", key=key)
    s3_request_counter.fail("PutObject", 1, status=500, code="InternalError", key=key)
    assert store.put_bytes(b"retried").created
    assert s3_request_counter.count("PutObject", key) == 3
    assert store.get(sha(b"retried")) == b"retried"

    impatient = S3ObjectStore(s3_bucket, endpoint_url=s3_server, max_attempts=2)
    s3_request_counter.fail("GetObject", 2, status=503, code="SlowDown")
    with pytest.raises(StorageError) as info:
        impatient.get(sha(b"retried"))
    assert info.value.details["code"] == "SlowDown"


@pytest.mark.s3
def test_s3_conditional_conflict_is_retried_then_reported(
    s3_store: S3ObjectStore, s3_request_counter: S3RequestCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(S3ObjectStore, "_conflict_backoff_s", 0.001)
    key = s3_store.key_of(sha(b"contended"))
    s3_request_counter.fail("PutObject", 2, status=409, code="ConditionalRequestConflict", key=key)
    assert s3_store.put_bytes(b"contended").created
    assert s3_request_counter.count("PutObject", key) == 3

    s3_request_counter.fail("PutObject", 100, status=409, code="ConditionalRequestConflict")
    with pytest.raises(Conflict) as info:
        s3_store.put_key("manifests/v000001.json", b"{}")
    assert info.value.details["key"] == "lake/main/manifests/v000001.json"
    assert not s3_store.key_exists("manifests/v000001.json")


@pytest.mark.s3
def test_s3_connection_settings(
    s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # AWS_ENDPOINT_URL (set for the session by the fixture) is honoured by boto3 itself.
    plain = S3ObjectStore.from_url(f"s3://{s3_bucket}/a/b/")
    assert (plain.bucket, plain.prefix, plain.url) == (s3_bucket, "a/b", f"s3://{s3_bucket}/a/b")
    assert plain.put_bytes(b"env endpoint").created
    assert plain.client.meta.endpoint_url == s3_server
    assert plain.client.meta.config.retries == {"total_max_attempts": 8, "mode": "standard"}

    assert plain.path_style is None
    assert S3ObjectStore(s3_bucket, path_style=True).client.meta.config.s3 == {
        "addressing_style": "path"
    }
    # The store reads no setting of its own: path style comes from its caller.
    monkeypatch.setenv("VIDLAKE_S3_PATH_STYLE", "1")
    assert S3ObjectStore.from_url(f"s3://{s3_bucket}").path_style is None
    styled = S3ObjectStore.from_url(f"s3://{s3_bucket}/a/b", path_style=True, retry_mode="adaptive")
    assert styled.path_style
    assert styled.s3_connection.path_style
    assert styled.client.meta.config.retries["mode"] == "adaptive"
    assert styled.get(sha(b"env endpoint")) == b"env endpoint"
    assert S3ObjectStore.from_url(f"s3://{s3_bucket}").head(sha(b"env endpoint")) is None


@pytest.mark.s3
def test_s3_delete_erases_every_version(s3_store: S3ObjectStore) -> None:
    client = s3_client(s3_store.endpoint_url or "")
    client.put_bucket_versioning(
        Bucket=s3_store.bucket, VersioningConfiguration={"Status": "Enabled"}
    )
    h = s3_store.put_bytes(b"versioned").info.sha256
    key = s3_store.key_of(h)
    assert s3_store.delete(h, reason="hard takedown") is True
    listing = client.list_object_versions(Bucket=s3_store.bucket, Prefix=key)
    assert listing.get("Versions", []) == [] and listing.get("DeleteMarkers", []) == []
    assert not s3_store.exists(h)


@pytest.mark.s3
def test_s3_bad_configuration(s3_server: str) -> None:
    with pytest.raises(InvalidInput):
        S3ObjectStore.from_url("gs://bucket")
    with pytest.raises(InvalidInput):
        S3ObjectStore.from_url("s3:///prefix")
    with pytest.raises(InvalidInput):
        S3ObjectStore("bucket", part_size=1 * MiB)
    with pytest.raises(StorageError) as info:
        S3ObjectStore("no-such-bucket-here", endpoint_url=s3_server).put_bytes(b"x")
    assert info.value.details["code"] == "NoSuchBucket"
    assert not isinstance(info.value, NotFound)
