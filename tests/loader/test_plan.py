"""Plan access: verified once-per-node download, zero-copy rank slices, flat RSS."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from catalog.errors import ChecksumMismatch, IntegrityError, InvalidInput, NotFound
from catalog.objects import open_store
from loader.plan import PlanReader, open_plan
from loader.source import HttpSource, StoreSource, open_source
from manifests.format import registry_key
from manifests.synthetic import write_big_snapshot, write_snapshot
from tests.loader.synth import CorruptingSource, CountingSource, serve_http


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def _artifact_files(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "artifacts").iterdir())


@pytest.mark.parametrize(
    ("steps_per_batch", "index_rows"),
    [(7, 40), ([3, 5, 2, 11], [17, 50, 9])],  # equal batches, and the fallback path
)
def test_rank_slices_partition_every_step(
    tmp_path: Path, steps_per_batch: Any, index_rows: Any
) -> None:
    snap = write_snapshot(
        tmp_path / "store",
        num_steps=23,
        batch_size=8,
        steps_per_batch=steps_per_batch,
        index_rows_per_batch=index_rows,
    )
    plan = open_plan(snap.url, 1, tmp_path / "cache")
    assert plan.num_steps == 23
    assert plan.allowed_world_sizes() == [1, 2, 4, 8]
    for step in range(plan.num_steps):
        expected = snap.plan[step]
        np.testing.assert_array_equal(plan.global_rows(step), expected)
        for world in plan.allowed_world_sizes():
            parts = [plan.rows(step, r, world) for r in range(world)]
            assert all(len(p) == 8 // world for p in parts)
            np.testing.assert_array_equal(np.concatenate(parts), expected)
        info = plan.step_info(step)
        assert info.bucket == snap.buckets[step]
        assert info.stream_epochs.tolist() == snap.stream_epochs[step]
    # Zero-copy: a rank slice is a read-only view of the mapped file, not a copy.
    part = plan.rows(5, 1, 2)
    assert np.shares_memory(part, plan.global_rows(5))
    assert not part.flags.writeable
    # Index records come back in the order asked for, equal to what was written.
    rows = np.array([95, 0, 41, 41, 17, 60], dtype=np.int64)
    got = plan.index_columns(rows, ["clip_id", "member_sha256", "captions"])
    assert got.column("row").to_pylist() == rows.tolist()
    want = snap.index.take(rows).select(["row", "clip_id", "member_sha256", "captions"])
    assert got.equals(want)
    plan.close()


def test_patched_plan_splits_by_original_batch(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=12, batch_size=8, skip={3: 2, 7: 5})
    plan = open_plan(snap.url, 1, tmp_path / "cache")
    info = plan.step_info(3)
    assert (info.batch_size, info.skipped, info.original_batch_size) == (6, 2, 8)
    # Allowed sizes come from the original batches (8), not from what is left (6, 3).
    assert plan.allowed_world_sizes() == [1, 2, 4, 8]
    for step in (3, 7):
        for world in (2, 4, 8):
            parts = [plan.rows(step, r, world).tolist() for r in range(world)]
            flat = [x for p in parts for x in p]
            assert flat == snap.plan[step].tolist()  # disjoint, covering, in order
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(InvalidInput, match=r"allowed world sizes: \[1, 2, 4, 8\]") as exc:
        plan.rows(3, 0, 3)
    assert exc.value.details["allowed"] == [1, 2, 4, 8]


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=5)
    plan = open_plan(snap.url, 1, tmp_path / "cache")
    for args in [(5, 0, 1), (-1, 0, 1), (0, 2, 2), (0, 0, 0)]:
        with pytest.raises(InvalidInput):
            plan.rows(*args)
    with pytest.raises(InvalidInput, match="outside"):
        plan.index_columns([0, 96])
    with pytest.raises(InvalidInput, match="unknown index columns"):
        plan.index_columns([0], ["nope"])
    with pytest.raises(NotFound):
        open_plan(snap.url, 2, tmp_path / "cache")
    with pytest.raises(InvalidInput):
        open_plan(snap.url, -1, tmp_path / "cache")


def test_corrupt_artifact_is_refused_and_never_placed(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store")
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumMismatch) as exc:
        open_plan(CorruptingSource(snap.store), 1, cache)
    assert exc.value.details["sha256"] in {
        snap.snapshot["artifacts"][n]["sha256"] for n in ("plan.arrow", "index.arrow")
    }
    assert _artifact_files(cache) == []  # no final file, no temp file
    plan = open_plan(snap.url, 1, cache)  # a good source then succeeds
    np.testing.assert_array_equal(plan.global_rows(0), snap.plan[0])


def test_corrupt_bytes_in_store_and_registry(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store")
    store = open_store(str(tmp_path / "store"))
    # A registry entry whose size disagrees with the stored snapshot.json.
    entry = json.loads(store.get_key(registry_key(1)))
    entry["snapshot_size"] += 1
    store.put_key(registry_key(5), json.dumps(entry).encode())
    with pytest.raises(ChecksumMismatch):
        open_plan(snap.url, 5, tmp_path / "cache")
    # A flipped byte in the stored plan object is caught on download.
    plan_sha = snap.plan_sha256
    path = Path(store.object_path(plan_sha))  # type: ignore[attr-defined]
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        open_plan(snap.url, 1, tmp_path / "cache")
    assert not any(n.startswith(plan_sha) for n in _artifact_files(tmp_path / "cache"))


def test_local_files_of_the_wrong_size_are_fetched_again(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store")
    cache = tmp_path / "cache"
    open_plan(snap.url, 1, cache).close()
    victim = cache / "artifacts" / f"{snap.plan_sha256}.plan.arrow"
    victim.write_bytes(victim.read_bytes()[:-10])  # truncated behind our back
    plan = open_plan(snap.url, 1, cache)
    np.testing.assert_array_equal(plan.global_rows(4), snap.plan[4])


def _open_in_child(url: str, log: str, cache: str, barrier: Any, out: Any) -> None:
    barrier.wait()
    plan = open_plan(CountingSource(url, log), 1, cache)
    out.put(plan.rows(3, 1, 2).tolist())


def test_concurrent_open_downloads_once(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store")
    log = tmp_path / "downloads.log"
    log.touch()
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(
            target=_open_in_child,
            args=(snap.url, str(log), str(tmp_path / "cache"), barrier, out),
        )
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(log.read_text().split()) == ["index.arrow", "plan.arrow"]
    expected = snap.plan[3][4:].tolist()
    assert results == [expected] * 4


def test_rss_does_not_grow_with_plan_size(tmp_path: Path) -> None:
    def rss_kb() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    growth = {}
    sizes = {}
    for num_steps in (500, 24_000):
        store = tmp_path / f"store{num_steps}"
        snap, plan_file = write_big_snapshot(
            store, num_steps=num_steps, batch_size=256, workdir=tmp_path
        )
        sizes[num_steps] = plan_file.stat().st_size
        cache = tmp_path / f"cache{num_steps}"
        open_plan(snap.url, 1, cache).close()  # the download, hashed, outside the measure
        before = rss_kb()
        plan = open_plan(snap.url, 1, cache)
        total = 0
        for step in range(200, 300):
            total += int(plan.rows(step, 3, 8).sum())
        plan.allowed_world_sizes()
        growth[num_steps] = (rss_kb() - before) * 1024
        plan.close()
    assert sizes[24_000] > 48e6
    # Opening maps; reading 100 steps touches their pages only, whatever the plan's size
    # (the kernel maps file pages in folios of up to 2 MiB, hence the slack).
    assert growth[24_000] < sizes[24_000] / 5, (growth, sizes)
    assert growth[24_000] - growth[500] < 8e6, (growth, sizes)


def test_reader_pickles_as_paths(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store")
    plan = open_plan(snap.url, 1, tmp_path / "cache")
    clone = pickle.loads(pickle.dumps(plan))
    assert isinstance(clone, PlanReader)
    np.testing.assert_array_equal(clone.rows(6, 0, 4), plan.rows(6, 0, 4))
    assert clone.plan_sha256 == snap.plan_sha256


def test_plan_with_wrong_step_count_is_an_integrity_error(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=6)
    store = open_store(str(tmp_path / "store"))
    doc = dict(snap.snapshot, version=2, num_steps=7)
    data = json.dumps(doc).encode()
    sha = store.put_bytes(data).info.sha256
    entry = {"version": 2, "snapshot_sha256": sha, "snapshot_size": len(data)}
    store.put_key(registry_key(2), json.dumps(entry).encode())
    with pytest.raises(IntegrityError, match="6 steps"):
        open_plan(snap.url, 2, tmp_path / "cache")


def test_http_source_reads_the_service_endpoints(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", pack=4)
    with serve_http(snap.store) as (url, requests):
        src = open_source(url)
        assert isinstance(src, HttpSource)
        plan = open_plan(url, 1, tmp_path / "cache")
        np.testing.assert_array_equal(plan.global_rows(2), snap.plan[2])
        # A packed member by Range, verified against its own SHA-256.
        rec = snap.index.slice(5, 1).to_pylist()[0]
        member = src.read_member(
            rec["object_sha256"], rec["offset"], rec["length"], rec["member_sha256"]
        )
        assert len(member) == rec["length"]
        assert any(
            r.endswith(f"bytes={rec['offset']}-{rec['offset'] + rec['length'] - 1}")
            for r in requests
        )
        assert src.object_size(rec["object_sha256"]) == snap.store.head(rec["object_sha256"]).size  # type: ignore[union-attr]
        with pytest.raises(NotFound):
            open_plan(url, 9, tmp_path / "cache")
        with pytest.raises(ChecksumMismatch):
            src.read_member(rec["object_sha256"], rec["offset"], rec["length"], "0" * 64)
    with serve_http(snap.store, corrupt_header=True) as (url, _):
        with pytest.raises(ChecksumMismatch):
            open_plan(url, 1, tmp_path / "cache2")
        assert _artifact_files(tmp_path / "cache2") == []


def test_open_source_dispatch(tmp_path: Path) -> None:
    assert isinstance(open_source(str(tmp_path)), StoreSource)
    assert isinstance(open_source("http://127.0.0.1:1"), HttpSource)
    src = open_source(tmp_path)
    assert open_source(src) is src
