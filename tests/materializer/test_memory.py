"""A cut's stages give freed memory back (:mod:`materializer.memory`): what the Arrow
pool (mimalloc here) and glibc's heap keep of freed buffers leaves the resident set."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from materializer.memory import _malloc_trim, release_unused


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_freed_arrow_buffers_leave_the_resident_set() -> None:
    release_unused()
    before = _rss_mb()
    buffers = [pa.allocate_buffer(4 << 20) for _ in range(50)]  # 200 MB, touched
    for b in buffers:
        np.frombuffer(b, dtype=np.uint8)[::4096] = 1
    del buffers
    release_unused()
    assert _rss_mb() - before < 60  # mimalloc alone kept all 200 MB


@pytest.mark.skipif(_malloc_trim() is None, reason="not glibc: no malloc_trim")
def test_freed_heap_chunks_between_live_ones_leave_the_resident_set() -> None:
    del_me = np.ones(1 << 20)  # a freed 8 MB mapping raises glibc's mmap threshold
    del del_me
    release_unused()
    before = _rss_mb()
    freed, kept = [], []
    for _ in range(1000):  # 128 KB arrays on the heap, each below a small live one
        freed.append(np.ones(1 << 14))
        kept.append(np.ones(64))
    del freed
    release_unused()
    assert _rss_mb() - before < 60  # glibc alone kept ~125 MB below the live chunks
