"""Giving a cut's freed memory back to the system between its stages.

pyarrow's default pool here is mimalloc, which keeps the pages of freed buffers
mapped for reuse: a 160 MB ``take`` that is freed leaves the process 160 MB larger
until ``release_unused`` (measured: 407 → 571 MB, freed 571, released 417). glibc's
malloc, which holds numpy's arrays and the buffers of results unpickled from pool
workers, likewise keeps freed chunks below its heap's top (1,000 freed 128 KB arrays
between kept small ones: 156 MB before ``malloc_trim``, 34 after). Neither can reuse
the other's pages. In a cut's driver every stage's temporaries (the merge, the
scatter's gathers, each streamed partition and chunk, the quality report's encodings)
then stayed resident after the stage, so the driver's resident set tracked the sum of
its stages' peaks, not the largest (docs/scale-out.md, round 6; decision 053).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache

import pyarrow as pa

__all__ = ["release_unused"]


def release_unused() -> None:
    """Return freed memory to the system: the default Arrow pool's pages (every
    thread's: mimalloc collects what other threads freed too) and, with glibc, the
    C heap's free chunks. Under a millisecond after a stage (~10 ms with a large
    fragmented heap); the next allocation faults its pages in again."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere: musl, macOS, Windows)."""
    try:
        function: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):
        return None
    return function
