"""Batch memory: big blocks are huge-page maps, and the pool recycles them."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from loader.batch import BufferPool


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
