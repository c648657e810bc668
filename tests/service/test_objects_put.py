"""``PUT /v1/objects/{sha256}`` (issue 17, item 2): object bytes over REST, streamed
into the store while hashed; 201 created, 200 present, 422 on a hash mismatch with
nothing stored, 413 past ``max_object_bytes`` (and only that limit)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from catalog import CatalogConfig, VidlakeCatalog
from catalog.objects.s3 import S3ObjectStore
from service.app import create_app
from service.object_upload import STALE_S
from service.settings import Settings
from tests.fixtures.s3 import S3RequestCounter
from tests.service.support import (
    TOKENS,
    TestClient,
    World,
    assert_error,
    bearer,
    build_world,
    serve,
    write_tokens,
)

WRITE = bearer("tok-write")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("objects-put"))


def _client(world: World, **settings: int) -> TestClient:
    tokens = write_tokens(
        world.home / "tokens.json", {**TOKENS, "tok-write-eval": ["write", "eval"]}
    )
    app = create_app(world.settings(tokens_file=tokens, **settings), catalog=world.catalog)
    return TestClient(app)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _leftovers(world: World) -> list[Path]:
    uploads = world.home / "service" / "uploads"
    return sorted(uploads.iterdir()) if uploads.exists() else []


def test_an_upload_is_created_then_present(world: World) -> None:
    data = b"latent bytes " * 1000
    sha = _sha(data)
    with _client(world) as c:
        first = c.put(f"/v1/objects/{sha}", content=data, headers=WRITE)
        assert first.status_code == 201, first.text
        assert first.json() == {"sha256": sha, "size": len(data), "created": True}
        again = c.put(f"/v1/objects/{sha}", content=data, headers=WRITE)
        assert again.status_code == 200 and again.json()["created"] is False
        got = c.get(f"/v1/objects/{sha}", headers=bearer("tok-read"))
        assert got.status_code == 200 and got.content == data
    assert world.catalog.objects.get(sha) == data
    assert _leftovers(world) == []


def test_a_hash_mismatch_stores_nothing(world: World) -> None:
    claimed = _sha(b"what the client meant")
    with _client(world) as c:
        r = c.put(f"/v1/objects/{claimed}", content=b"what it sent", headers=WRITE)
        error = assert_error(r, 422, "hash_mismatch")
        assert error["details"]["actual"] == _sha(b"what it sent")
        assert error["details"]["expected"] == claimed
    assert not world.catalog.objects.exists(claimed)
    assert not world.catalog.objects.exists(_sha(b"what it sent"))
    assert _leftovers(world) == []


def test_uploads_need_the_write_scope_and_a_sha256(world: World) -> None:
    data = b"scoped"
    with _client(world) as c:
        assert_error(c.put(f"/v1/objects/{_sha(data)}", content=data), 401)
        r = c.put(f"/v1/objects/{_sha(data)}", content=data, headers=bearer("tok-read"))
        assert_error(r, 403)
        assert_error(c.put("/v1/objects/not-a-sha", content=data, headers=WRITE), 422)
    assert not world.catalog.objects.exists(_sha(data))


def test_the_object_limit_is_its_own(world: World) -> None:
    big = b"x" * 4096
    small = b"y" * 100
    # The object limit, not max_body_bytes, bounds an upload: 4 KiB passes a 1 KiB body cap.
    with _client(world, max_object_bytes=5000, max_body_bytes=1024) as c:
        r = c.put(f"/v1/objects/{_sha(big)}", content=big, headers=WRITE)
        assert r.status_code == 201, r.text
    with _client(world, max_object_bytes=50) as c:
        declared = c.put(f"/v1/objects/{_sha(small)}", content=small, headers=WRITE)
        assert_error(declared, 413)

        def stream() -> Iterator[bytes]:
            yield from (small[:40], small[40:])

        streamed = c.put(f"/v1/objects/{_sha(small)}", content=stream(), headers=WRITE)
        assert_error(streamed, 413)
    assert not world.catalog.objects.exists(_sha(small))
    assert _leftovers(world) == []


def test_an_eval_only_object_is_not_disclosed(world: World) -> None:
    hidden = world.latent_object[world.eval_clips[0]]
    data = world.catalog.objects.get(hidden)
    with _client(world) as c:
        assert c.head(f"/v1/objects/{hidden}", headers=bearer("tok-read")).status_code == 404
        r = c.put(f"/v1/objects/{hidden}", content=data, headers=WRITE)
        assert r.status_code == 201, r.text  # as for a new object: no probe of eval objects
        wrong = c.put(f"/v1/objects/{hidden}", content=b"not it", headers=WRITE)
        assert_error(wrong, 422, "hash_mismatch")
        seen = c.put(f"/v1/objects/{hidden}", content=data, headers=bearer("tok-write-eval"))
        assert seen.status_code == 200, seen.text


def test_a_live_server_streams_a_large_upload(world: World, tmp_path: Path) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB, several receive chunks
    sha = _sha(data)
    tokens = write_tokens(world.home / "tokens.json")
    app = create_app(world.settings(tokens_file=tokens), catalog=world.catalog)
    with serve(app) as url:

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(data), 65536):
                yield data[i : i + 65536]

        r = httpx.put(f"{url}/v1/objects/{sha}", content=chunks(), headers=WRITE, timeout=30)
        assert r.status_code == 201, r.text
    assert world.catalog.objects.get(sha) == data


def test_an_uploader_may_ask_before_it_sends(world: World) -> None:
    """A write-only token (a curation fleet's) was refused HEAD, so an upload could not
    skip an object stored already."""
    data = b"asked first"
    sha = _sha(data)
    hidden = world.latent_object[world.eval_clips[0]]
    with _client(world) as c:
        assert c.head(f"/v1/objects/{sha}", headers=WRITE).status_code == 404
        assert c.put(f"/v1/objects/{sha}", content=data, headers=WRITE).status_code == 201
        assert c.head(f"/v1/objects/{sha}", headers=WRITE).status_code == 200
        assert c.head(f"/v1/objects/{hidden}", headers=WRITE).status_code == 404
        assert c.get(f"/v1/objects/{sha}", headers=WRITE).status_code == 403  # GET: read only


@pytest.mark.s3
def test_a_large_upload_takes_the_s3_multipart_path(
    tmp_path: Path, s3_server: str, s3_bucket: str, s3_request_counter: S3RequestCounter
) -> None:
    store = S3ObjectStore(
        s3_bucket, "up", endpoint_url=s3_server, multipart_threshold=1 << 20, part_size=5 << 20
    )
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake"), objects=store)
    data = os.urandom(6 << 20)
    sha = _sha(data)
    app = create_app(Settings(home=tmp_path / "lake"), catalog=catalog)
    with TestClient(app) as c:
        r = c.put(f"/v1/objects/{sha}", content=data)
        assert r.status_code == 201, r.text
        assert c.put(f"/v1/objects/{sha}", content=data).status_code == 200
        bad = c.put(f"/v1/objects/{_sha(b'other')}", content=data)
        assert_error(bad, 422, "hash_mismatch")
    assert s3_request_counter.count("CreateMultipartUpload") == 1
    assert s3_request_counter.count("UploadPart") == 2
    assert store.get(sha) == data and not store.exists(_sha(b"other"))
    assert sorted(p.name for p in (tmp_path / "lake" / "service" / "uploads").iterdir()) == []


def test_a_crashed_uploads_temp_file_is_removed_later(world: World) -> None:
    uploads = world.home / "service" / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    stale, live = uploads / ".upload-crashed", uploads / ".upload-in-flight"
    for path in (stale, live):
        path.write_bytes(b"partial")
    old = time.time() - STALE_S - 60
    os.utime(stale, (old, old))
    data = b"after a crash"
    with _client(world) as c:
        assert c.put(f"/v1/objects/{_sha(data)}", content=data, headers=WRITE).status_code == 201
    assert _leftovers(world) == [live]
    live.unlink()
