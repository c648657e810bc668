"""Per-batch leases and the shared "already verified" memory (issue 16).

What a warm step costs in SQLite write transactions, that a second iterator (or a
second cache object on the same root) does not hash again what this process verified,
that a corrupt byte is still caught on a hit, and that a process killed while holding a
lease set leaves nothing behind.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import loader.cache as cache_module
from catalog.errors import CacheError
from catalog.hashing import sha256_bytes, sha256_file
from loader.cache import NodeCache, forget_verified
from loader.dataset import SnapshotDataset
from manifests.synthetic import SynthSnapshot, write_snapshot

MB = 1 << 20


def _snapshot(tmp_path: Path, rows: int = 32, batch: int = 16) -> SynthSnapshot:
    return write_snapshot(
        tmp_path / "store",
        num_rows=rows,
        num_steps=rows // batch,
        batch_size=batch,
        num_buckets=1,
        num_streams=1,
        caption_variants=1,
    )


def _dataset(snap: SynthSnapshot, cache: Path, **kw: Any) -> SnapshotDataset:
    kw.setdefault("cache_budget_bytes", 64 * MB)
    kw.setdefault("cache_reserve_bytes", 0)
    return SnapshotDataset(snap.url, 1, cache_dir=cache, **kw)


def _count_write_transactions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every ``BEGIN IMMEDIATE`` the node cache's connections run."""
    seen: list[str] = []
    real = NodeCache._connect

    def connect(self: NodeCache) -> sqlite3.Connection:
        conn = real(self)
        conn.set_trace_callback(lambda sql: seen.append(sql) if "IMMEDIATE" in sql else None)
        return conn

    monkeypatch.setattr(NodeCache, "_connect", connect)
    return seen


def _rows(ds: SnapshotDataset) -> list[torch.Tensor]:
    """Every step's latents, from step 0 (a new iterator each call)."""
    ds.seek(0)
    out = [b["latent"] for b in ds]
    assert len(out) == ds.plan.num_steps
    return out


def test_a_warm_step_takes_two_write_transactions_per_thread_not_two_per_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path)
    cold = _rows(_dataset(snap, tmp_path / "node", prefetch_threads=1))
    writes = _count_write_transactions(monkeypatch)
    ds = _dataset(snap, tmp_path / "node", prefetch_threads=1, prefetch_steps=0)
    ds.plan  # opening the plan is not what is counted  # noqa: B018
    warm = _rows(ds)
    # Opening the healthy cache writes nothing; per step, one transaction leases its
    # 16 rows and one returns them (it was one to open and two per row: 65).
    assert len(writes) == 2 * len(warm), writes
    assert torch.equal(torch.cat(warm), torch.cat(cold))
    stats = NodeCache(tmp_path / "node" / "latents", None).stats()
    assert stats["leases"] == 0 and stats["hits"] == 32 and stats["misses"] == 32


def test_a_second_iterator_and_a_second_cache_object_do_not_hash_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path)
    hashed: list[str] = []
    real = sha256_file

    def counting(path: str | Path) -> tuple[str, int]:
        hashed.append(str(path))
        return real(path)

    monkeypatch.setattr(cache_module, "sha256_file", counting)
    ds = _dataset(snap, tmp_path / "node", verify_hits=True)
    _rows(ds)  # downloads: each hashed once
    assert len(hashed) == 32
    _rows(ds)  # a second iterator (a new NodeCache object): nothing hashed again
    _rows(_dataset(snap, tmp_path / "node", verify_hits=True))
    assert len(hashed) == 32


def test_a_corrupt_byte_is_still_caught_on_a_batched_hit(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path)
    ds = _dataset(snap, tmp_path / "node", verify_hits=True)
    good = _rows(ds)
    objects = sorted((tmp_path / "node" / "latents" / "objects").rglob("*"))
    victim = next(p for p in objects if p.is_file())
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # the last byte of the tensor data
    victim.write_bytes(bytes(data))
    assert sha256_bytes(bytes(data)) != victim.name
    again = _rows(ds)  # verified earlier, but the write changed the fingerprint
    assert all(torch.equal(a, b) for a, b in zip(good, again, strict=True))
    stats = NodeCache(tmp_path / "node" / "latents", None).stats()
    assert stats["corrupt_refetches"] == 1 and stats["leases"] == 0
    assert sha256_bytes(victim.read_bytes()) == victim.name


def _hold_a_lease_set(root: str, keys: list[tuple[str, int]], ready: Any) -> None:
    cache = NodeCache(root, None)
    held = cache.leases(keys)
    for key, size in keys:
        held.path(key, size, lambda tmp: None)
    ready.set()
    time.sleep(60)


def test_a_process_killed_holding_a_lease_set_leaks_nothing(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path)
    _rows(_dataset(snap, tmp_path / "node"))
    root = tmp_path / "node" / "latents"
    keys = [(p.name, p.stat().st_size) for p in root.rglob("objects/*/*")]
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_hold_a_lease_set, args=(str(root), keys, ready))
    child.start()
    try:
        assert ready.wait(60)
        cache = NodeCache(root, None)
        assert cache.stats()["leases"] == len(keys)
        assert cache.gc(0)["evicted"] == 0  # leased: nothing may go
    finally:
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
    after = NodeCache(root, None)  # a fresh open reclaims the dead holder's leases
    assert after.stats()["leases"] == 0
    assert after.gc(0)["evicted"] == len(keys)
    assert not any(p.is_file() for p in root.rglob("objects/*/*"))


def test_opening_a_healthy_cache_takes_no_write_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cache"
    NodeCache(root, 1 * MB).close()  # created: schema, budget
    writes = _count_write_transactions(monkeypatch)
    for _ in range(3):  # ranks, workers, iterators starting at once: reads only
        NodeCache(root, 1 * MB).stats()
    assert writes == []
    (root / "tmp" / "stray").mkdir()  # something to reclaim: the write path runs
    NodeCache(root, 1 * MB).close()
    assert len(writes) == 1 and not (root / "tmp" / "stray").exists()
    with pytest.raises(CacheError, match="budget_bytes"):
        NodeCache(root, 2 * MB)


def test_a_second_iterator_writes_into_recycled_batch_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    snap = _snapshot(tmp_path)
    ds = _dataset(snap, tmp_path / "node", prefetch_steps=0)
    _rows(ds)  # the first iterator allocates the step's batch memory
    fresh: list[int] = []
    real = np.empty

    def counting(shape: Any, dtype: Any = float, *args: Any, **kw: Any) -> Any:
        if dtype is np.uint8:
            fresh.append(shape)
        return real(shape, dtype, *args, **kw)

    monkeypatch.setattr(np, "empty", counting)  # what loader.batch allocates blocks with
    again = _rows(ds)  # a new iterator (an epoch, a resume) of the same dataset
    assert fresh == [] and len(again) == 2


def test_forget_verified_makes_the_next_hit_hash_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[str] = []
    real = sha256_file

    def counting(path: str | Path) -> tuple[str, int]:
        hashed.append(str(path))
        return real(path)

    monkeypatch.setattr(cache_module, "sha256_file", counting)
    data = b"x" * 100
    key = sha256_bytes(data)
    with NodeCache(tmp_path / "c", 1 * MB, reserve_bytes=0) as cache:
        with cache.lease(key, 100, lambda tmp: tmp.write_bytes(data)):
            pass
        with cache.lease(key, 100, lambda tmp: None):
            pass
        assert len(hashed) == 1
        forget_verified(tmp_path / "c")
        with cache.lease(key, 100, lambda tmp: None):
            pass
        assert len(hashed) == 2


def _claim_vm_steps(root: Path, entries: int, claimed: int) -> int:
    """SQLite VM instructions spent leasing ``claimed`` hits in a cache of ``entries``."""
    with NodeCache(root, 1 << 40, reserve_bytes=0) as cache:
        keys = [sha256_bytes(str(i).encode()) for i in range(entries)]
        with cache._tx() as db:  # ready entries; the claim itself never opens the files
            db.executemany(
                "INSERT INTO entries (sha256, size, state, gen, last_access)"
                " VALUES (?, 10, 'ready', 'g', 0)",
                [(k,) for k in keys],
            )
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        with cache._borrowed() as conn:  # the pool's one connection, borrowed next
            conn.set_progress_handler(count, 1)
        with cache.leases([(k, 10) for k in keys[:claimed]]) as held:
            assert len(held._ids) == claimed
        conn.set_progress_handler(None, 0)
        return steps[0]


def test_a_batched_claim_costs_the_same_in_a_small_and_a_big_cache(tmp_path: Path) -> None:
    # The claim looked its keys up through the (state, last_access) index, visiting
    # every ready entry of the node: ~16 us a row at 3k entries, worse with every entry.
    small = _claim_vm_steps(tmp_path / "small", 32, 16)
    big = _claim_vm_steps(tmp_path / "big", 4000, 16)
    assert big < 1.5 * small, (small, big)
