"""manifests.artifacts: a cached artifact is whole and verified, or fetched again."""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.synchronize
from pathlib import Path

import pytest

from catalog.errors import ChecksumMismatch
from manifests.artifacts import ArtifactCache, fetch_verified

DATA = bytes(range(256)) * 1024
SHA = hashlib.sha256(DATA).hexdigest()


class Source:
    """Writes DATA (or other bytes) and counts the fetches."""

    def __init__(self, data: bytes = DATA) -> None:
        self.data = data
        self.calls = 0

    def __call__(self, tmp: Path) -> None:
        self.calls += 1
        tmp.write_bytes(self.data)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_copy_is_fetched_once_and_named_by_its_content(tmp_path: Path) -> None:
    cache, source = ArtifactCache(tmp_path), Source()
    path = cache.get(SHA, len(DATA), source, name="plan.arrow")
    assert path == tmp_path / f"{SHA}.plan.arrow" and path.read_bytes() == DATA
    assert cache.get(SHA, len(DATA), source, name="plan.arrow") == path
    assert ArtifactCache(tmp_path).get(SHA, len(DATA), source, name="plan.arrow") == path
    assert source.calls == 1


def test_a_corrupt_byte_is_fetched_again(tmp_path: Path) -> None:
    ArtifactCache(tmp_path).get(SHA, len(DATA), Source())
    path = tmp_path / SHA
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[1000] ^= 1
    path.write_bytes(bytes(data))
    source = Source()
    # A new process (a new cache object) re-hashes the file before its first use.
    assert ArtifactCache(tmp_path).get(SHA, len(DATA), source).read_bytes() == DATA
    assert source.calls == 1


def test_a_file_of_the_wrong_size_is_fetched_again_even_without_rehash(tmp_path: Path) -> None:
    (tmp_path / SHA).write_bytes(DATA[:-1])  # e.g. a copy cut short by a full disk
    source = Source()
    cache = ArtifactCache(tmp_path, rehash=False)
    assert not cache.ready(SHA, len(DATA))
    assert cache.get(SHA, len(DATA), source).read_bytes() == DATA
    assert source.calls == 1


def test_bytes_that_do_not_verify_are_never_placed(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    with pytest.raises(ChecksumMismatch, match=r"plan\.arrow of v1") as err:
        cache.get(SHA, len(DATA), Source(DATA[::-1]), what="plan.arrow of v1")
    assert err.value.details["sha256"] == SHA
    assert _names(tmp_path) == []  # no final file, no temp file
    with pytest.raises(ChecksumMismatch, match=r"-1 bytes hashing to nothing"):
        fetch_verified(tmp_path / "x", SHA, len(DATA), lambda tmp: None, what="x")
    assert _names(tmp_path) == []


def test_forget_deletes_the_copy(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    cache.get(SHA, len(DATA), Source())
    cache.forget(SHA)
    assert _names(tmp_path) == [] and not cache.ready(SHA, len(DATA))


BLOBS = [bytes([i]) * (1 << 20) for i in range(8)]


def _fetch_in_process(root: str, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    cache = ArtifactCache(root)
    for data in BLOBS:  # every process fetches each blob at about the same time
        sha = hashlib.sha256(data).hexdigest()
        assert cache.get(sha, len(data), Source(data)).read_bytes() == data


def test_concurrent_processes_share_one_whole_file(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_fetch_in_process, args=(str(tmp_path), start)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    shas = sorted(hashlib.sha256(d).hexdigest() for d in BLOBS)
    assert _names(tmp_path) == shas  # one file per object, no temp file left
    for data in BLOBS:
        assert (tmp_path / hashlib.sha256(data).hexdigest()).read_bytes() == data
