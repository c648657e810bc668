"""Step ``t``'s bucket: an earliest-deadline-first schedule over the bucket shares.

After every prefix of ``t`` steps bucket ``b`` has ``|steps_b - t * sigma_b| <= 1``
(docs/plan.md, "Buckets"). The schedule is deterministic and stateful only in how far
it has been taken, so a plan can take it a chunk of steps at a time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

import numpy as np

from catalog.errors import InvalidInput
from materializer.plan.spec import Int32s

__all__ = ["BucketScheduler", "bucket_schedule"]


class BucketScheduler:
    """Earliest deadline first over the windows of the +-1 band.

    Copy ``j`` (1-based) of bucket ``b`` may be placed at prefix length ``L`` only if
    ``j - 1 <= L * sigma_b`` (release) and must be by ``L <= j / sigma_b + 1``
    (deadline). A schedule inside every window exists (Tijdeman 1980) and EDF is
    optimal for unit jobs with release times, so it never misses one.
    """

    def __init__(self, shares: Sequence[float]) -> None:
        self._sigma = [float(s) for s in shares]
        self._count = [0] * len(self._sigma)
        self._placed = 0
        self._pending = [(0.0, b) for b, s in enumerate(self._sigma) if s > 0]
        heapq.heapify(self._pending)
        self._ready: list[tuple[float, int]] = []

    def take(self, m: int) -> Int32s:
        sigma, count, pending, ready = self._sigma, self._count, self._pending, self._ready
        out: list[int] = []
        push, pop = heapq.heappush, heapq.heappop
        for length in range(self._placed + 1, self._placed + m + 1):
            while pending and pending[0][0] <= length:
                b = pop(pending)[1]
                push(ready, ((count[b] + 1) / sigma[b], b))
            b = pop(ready)[1]  # never empty: sum(count) < length = sum(length * sigma)
            out.append(b)
            count[b] += 1
            push(pending, (count[b] / sigma[b], b))
        self._placed += m
        return np.array(out, dtype=np.int32)


def bucket_schedule(shares: Mapping[int, float], num_steps: int) -> Int32s:
    """The bucket of each of the first ``num_steps`` steps.

    Deterministic and low-discrepancy: for every prefix length ``t`` and bucket ``b``,
    ``|#{s < t : bucket[s] = b} - t * share_b| <= 1`` (shares are normalised).
    """
    ids = sorted(b for b, s in shares.items() if s > 0)
    if not ids:
        raise InvalidInput("bucket_schedule needs a positive share", field="shares")
    total = math.fsum(shares[b] for b in ids)
    positions = BucketScheduler([shares[b] / total for b in ids]).take(num_steps)
    return np.asarray(ids, dtype=np.int32)[positions]
