"""Giving a cut's freed Arrow memory back to the system between its stages.

pyarrow's default pool here is mimalloc, which keeps the pages of freed buffers
mapped for reuse: a 160 MB ``take`` that is freed leaves the process 160 MB larger
until ``release_unused`` (measured: 407 → 571 MB, freed 571, released 417). In a
cut's driver every stage's temporaries (the merge's concatenation, the scatter's
gathers, each streamed chunk's wide rows and Parquet pages) then stay resident
after the stage, so the driver's resident set tracked the sum of its stages'
peaks, not the largest (docs/scale-out.md, round 6; decision 053). Releasing costs
under a millisecond; the next allocation faults its pages in again.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["release_unused"]


def release_unused() -> None:
    """Return the default Arrow pool's freed pages to the system (every thread's:
    mimalloc collects the pages other threads freed too). A no-op for a pool that
    keeps none (the system allocator's)."""
    pa.default_memory_pool().release_unused()
