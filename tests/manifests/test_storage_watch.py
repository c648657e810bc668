"""``watch``: complete files only, same receipts, restart-safe, JSON status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.objects.s3 import S3ObjectStore
from manifests.storage.receipts import read_receipts
from manifests.storage.watch import Watcher
from tests.fixtures.s3 import S3RequestCounter

pytestmark = pytest.mark.s3


class Clock:
    def __init__(self) -> None:
        self.now = 2_000_000_000.0

    def __call__(self) -> float:
        return self.now


def _watcher(tmp_path: Path, store: S3ObjectStore, clock: Clock, **kw: object) -> Watcher:
    return Watcher(
        tmp_path / "out",
        store,
        tmp_path / "receipts" / "w.jsonl",
        tmp_path / "status.json",
        stable_s=10,
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )


def test_watch_uploads_stable_files_once_and_survives_restart(
    s3_server: str, s3_bucket: str, s3_request_counter: S3RequestCounter, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    (out / "shard0").mkdir(parents=True)
    store = S3ObjectStore(s3_bucket, "live", endpoint_url=s3_server)
    clock = Clock()
    done = out / "shard0" / "a.safetensors"
    done.write_bytes(b"a" * 5000)
    growing = out / "shard0" / "b.safetensors"
    growing.write_bytes(b"b" * 100)
    (out / "shard0" / "c.safetensors.tmp").write_bytes(b"temp")
    w = _watcher(tmp_path, store, clock)

    first = w.poll()  # first sight: nothing is known to be stable yet
    assert first.files_uploaded == 0 and first.backlog_files == 2
    clock.now += 11
    with open(growing, "ab") as f:  # still being written
        f.write(b"b" * 100)
    second = w.poll()
    assert second.files_uploaded == 1 and second.backlog_files == 1
    assert set(read_receipts(tmp_path / "receipts" / "w.jsonl")) == {str(done.resolve())}
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["files_uploaded"] == 1 and status["backlog_bytes"] == 200

    # The producer finishes with a marker: uploaded at once, whatever its age.
    (out / "shard0" / "b.safetensors.done").write_text("")
    assert w.poll().files_uploaded == 2

    # A restarted watcher sends nothing for what is receipted.
    s3_request_counter.reset()
    clock.now += 60
    again = _watcher(tmp_path, store, clock).run(max_passes=2, poll_s=0)
    assert again.files_uploaded == 0 and again.files_done == 2 and again.backlog_files == 0
    assert s3_request_counter.count() == 0
    assert store.get(read_receipts(tmp_path / "receipts" / "w.jsonl")[str(done.resolve())].sha256)


def test_watch_with_required_marker_ignores_stable_files(
    s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x.bin").write_bytes(b"x" * 10)
    store = S3ObjectStore(s3_bucket, "live", endpoint_url=s3_server)
    clock = Clock()
    w = _watcher(tmp_path, store, clock, require_marker=True)
    w.poll()
    clock.now += 100
    assert w.poll().files_uploaded == 0
    (tmp_path / "out" / "x.bin.done").write_text("")
    assert w.poll().files_uploaded == 1
