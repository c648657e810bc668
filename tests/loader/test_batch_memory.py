"""Batch memory: big blocks are huge-page maps, and the pool recycles them."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path
from typing import Any

import pytest
import torch

import loader.batch as batch_module
from loader.batch import BufferPool
from loader.dataset import SnapshotDataset
from manifests.synthetic import write_snapshot


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="needs madvise(MADV_HUGEPAGE)")
def test_big_batch_blocks_are_huge_page_maps_and_come_back_to_the_pool() -> None:
    pool = BufferPool(keep=2)
    t = pool.empty((8, 1 << 18), torch.float32)  # 8 MiB
    t.fill_(3.0)
    assert t.sum().item() == 3.0 * t.numel()
    block = next(iter(pool._free.values()), None)
    assert block is None  # in use, not free
    ptr = t.data_ptr()
    del t
    gc.collect()
    (blocks,) = pool._free.values()
    base = blocks[0].base  # np.frombuffer's memoryview of the map
    assert isinstance(getattr(base, "obj", base), mmap.mmap)  # not np.empty (4 KiB faults)
    again = pool.empty((8, 1 << 18), torch.float32)
    assert again.data_ptr() == ptr  # recycled, warm
    small = pool.empty((4,), torch.float32)  # small blocks stay ordinary arrays
    assert small.numel() == 4


def test_a_second_dataset_writes_into_the_blocks_the_first_one_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool is the process's, not a dataset's: a fresh dataset (a new epoch's, a
    benchmark pass's) faults no fresh batch memory in once an earlier one's is free."""
    snap = write_snapshot(
        tmp_path / "store",
        num_rows=16,
        num_steps=4,
        batch_size=4,
        num_buckets=1,
        num_streams=1,
        caption_variants=1,
        latent_shape=(64, 9, 8, 8),
    )
    made: list[int] = []
    real = batch_module._new_block

    def counted(nbytes: int) -> Any:
        made.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(batch_module, "_new_block", counted)

    def one_pass() -> int:
        ds = SnapshotDataset(
            snap.url,
            1,
            cache_dir=tmp_path / "node",
            cache_budget_bytes=1 << 30,
            cache_reserve_bytes=0,
            prefetch_steps=0,  # no overlap: the blocks a pass needs do not vary with timing
        )
        steps = sum(1 for _ in ds)
        gc.collect()
        return steps

    assert one_pass() == 4
    first = len(made)
    assert 0 < first <= 2  # the batch the consumer holds, and the next one
    assert one_pass() == 4
    assert len(made) == first  # every batch of the second pass in recycled memory


def test_a_step_waits_on_each_part_once_not_on_each_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import Future

    snap = write_snapshot(tmp_path / "store", num_rows=48, num_steps=3, batch_size=16)
    kw: dict[str, Any] = {"cache_budget_bytes": 64 << 20, "cache_reserve_bytes": 0}

    def dataset() -> SnapshotDataset:
        return SnapshotDataset(snap.url, 1, cache_dir=tmp_path / "node", prefetch_threads=2, **kw)

    cold = [b["latent"].clone() for b in dataset()]
    waits: list[int] = []
    real = Future.result

    def result(self: Future[Any], timeout: float | None = None) -> Any:
        waits.append(1)
        return real(self, timeout)

    monkeypatch.setattr(Future, "result", result)
    warm = [b["latent"].clone() for b in dataset()]
    monkeypatch.undo()
    # Two parts a step (two threads): it was a wait per row and per text embedding.
    assert len(waits) == 3 * 2
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))
