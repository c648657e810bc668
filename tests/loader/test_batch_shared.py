"""Batch memory across processes and recycling: a DataLoader worker's batches are born
in shared memory; a held batch is never written over; a recycled block still carries
only verified bytes."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from loader.batch import SHARED_MEMORY, BatchBuffer, BufferPool
from loader.cache import NodeCache, forget_verified
from loader.dataset import SnapshotDataset
from manifests.synthetic import SynthSnapshot, write_snapshot


def _dataset(snap: SynthSnapshot, cache: Path, **kw: Any) -> SnapshotDataset:
    kw.setdefault("cache_budget_bytes", 64 << 20)
    kw.setdefault("cache_reserve_bytes", 0)
    return SnapshotDataset(snap.url, 1, cache_dir=cache, **kw)


def _shared(t: torch.Tensor) -> bool:
    return bool(t.is_shared())  # type: ignore[no-untyped-call]


class _Probe(IterableDataset[dict[str, Any]]):
    """Each batch as the worker made it, with whether its tensor was already shared
    (before the DataLoader pickled it to this process)."""

    def __init__(self, ds: SnapshotDataset) -> None:
        self.ds = ds

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.ds:
            yield {**batch, "shared_in_worker": _shared(batch["latent"])}


def test_shared_memory_tensors_are_shared_writable_and_shaped() -> None:
    t = SHARED_MEMORY.empty((3, 4, 5), torch.float16)
    assert _shared(t) and t.shape == (3, 4, 5) and t.is_contiguous()
    assert t.dtype == torch.float16 and t.untyped_storage().nbytes() == 3 * 4 * 5 * 2
    buffer = BatchBuffer(3, SHARED_MEMORY)
    rows = buffer.row_bytes(1, {"x": (torch.float16, (4, 5))})
    assert rows is not None
    rows["x"][:] = bytes(range(40))
    assert _shared(buffer.tensors["x"])
    assert bytes(buffer.tensors["x"][1].view(torch.uint8).reshape(-1).tolist()) == bytes(range(40))


def test_a_worker_writes_its_batches_into_shared_memory(tmp_path: Path) -> None:
    """A worker's batch that is not in shared memory is copied into it to cross to
    the training process (``share_memory_``): born there, it crosses as a handle."""
    snap = write_snapshot(tmp_path / "store", num_steps=6, num_buckets=1)
    expected = [b["latent"].clone() for b in _dataset(snap, tmp_path / "cache")]
    loader = DataLoader(_Probe(_dataset(snap, tmp_path / "cache")), batch_size=None, num_workers=2)
    got = list(loader)
    assert [b["step"] for b in got] == list(range(6))
    assert all(b["shared_in_worker"] for b in got)
    for batch, want in zip(got, expected, strict=True):
        assert torch.equal(batch["latent"], want)


def test_a_held_batch_keeps_its_bytes_while_later_batches_recycle_memory(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=12, num_buckets=1)
    ds = _dataset(snap, tmp_path / "cache", prefetch_steps=1)
    it = iter(ds)
    held = next(it)
    view = held["latent"][1:]  # a view keeps the block alive as well
    ptr, before = held["latent"].data_ptr(), held["latent"].clone()
    del held
    pointers = []
    for batch in it:  # each later batch dropped at once: its memory comes round again
        pointers.append(batch["latent"].data_ptr())
        del batch
        gc.collect()
    assert len(set(pointers)) < len(pointers)  # the pool did recycle
    assert ptr not in pointers
    assert torch.equal(view, before[1:])  # never handed out while referenced


def test_the_pool_keeps_at_most_keep_free_blocks_of_a_size() -> None:
    pool = BufferPool(keep=2)
    tensors = [pool.empty((4, 1024), torch.float32) for _ in range(5)]
    del tensors
    gc.collect()
    assert [len(v) for v in pool._free.values()] == [2]


def test_verify_catches_a_flipped_byte_read_into_a_recycled_block(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=4, num_buckets=1)
    expected = [b["latent"].clone() for b in _dataset(snap, tmp_path / "cache")]
    gc.collect()  # the first pass's blocks are free: the next pass writes into them
    objects = sorted((tmp_path / "cache" / "latents" / "objects").glob("*/*"))
    victim = objects[len(objects) // 2]
    raw = bytearray(victim.read_bytes())
    raw[-3] ^= 0x40  # a data byte, bypassing the filesystem's mtime (bit rot)
    stat = victim.stat()
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    forget_verified()
    got = [b["latent"].clone() for b in _dataset(snap, tmp_path / "cache", verify_hits=True)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    with NodeCache(tmp_path / "cache" / "latents", None) as cache:
        assert cache.stats()["corrupt_refetches"] == 1
