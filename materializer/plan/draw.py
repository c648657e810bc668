"""A pool's walk through its epochs, with no row twice in a step.

A (stream, bucket) pool of ``n`` rows is drawn as one long walk (:class:`PoolWalk`),
epoch after epoch, each epoch a seeded permutation of the pool (epoch ``e`` sorts
``mix(base + e*n + i)``) that starts only when the last is exhausted; a step takes the
next ``c`` positions of the walk. When an epoch boundary falls inside a step, the step
holds the old epoch's tail ``T`` (its last ``L`` positions) and the new epoch's head
(its first ``h = c - L``), and a plain permutation may repeat a row of ``T`` in the
head. So, before the head is drawn, the new epoch is reordered: take its shortest prefix
that holds ``min(h, n - L)`` rows outside ``T``, and move those rows to the front, in
their order, followed by the prefix's rows of ``T``, in theirs (a stable partition of
the prefix). The epoch stays a permutation (every row once per epoch), the rule is a
pure function of the epoch's order and the tail, and a deferred row moves back by fewer
than ``c`` positions. With ``c <= n`` a step spans at most two epochs, so no step
repeats a row; a step with ``c > n`` repeats exactly ``c - n`` rows, the fewest
possible.

Boundaries of one block of epochs are reordered together (one numpy pass) unless one
reordered prefix reaches into the tail that the next boundary defers, which happens
only when ``n < 2c``; then they are applied one after the other, which gives the same
result as the one-pass form wherever both apply (docs/plan.md, "Epochs").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from materializer.plan.rng import mix_order
from materializer.plan.spec import Int64s

__all__ = ["Boundaries", "PoolWalk", "defer_tails", "step_boundaries"]

_PERM_BLOCK = 1 << 20  # elements per vectorised block of tiny-pool epoch permutations


@dataclass(frozen=True)
class Boundaries:
    """Epoch boundaries inside steps, in walk order (one entry per boundary).

    Attributes:
        epoch: The epoch that starts inside a step.
        tail_start: Where the step enters the previous epoch (its tail is
            ``[tail_start, n)``; ``>= 1``).
        head: How many positions of the new epoch the step takes (``>= 1``).
    """

    epoch: Int64s
    tail_start: Int64s
    head: Int64s

    def select(self, lo: int, hi: int) -> Boundaries:
        """The boundaries of epochs ``[lo, hi)``."""
        a, b = np.searchsorted(self.epoch, [lo, hi])
        return Boundaries(self.epoch[a:b], self.tail_start[a:b], self.head[a:b])

    def __len__(self) -> int:
        return int(self.epoch.size)


def step_boundaries(start: int, counts: Int64s, n: int) -> Boundaries:
    """The boundaries to defer in a walk of ``n`` rows that is at position ``start``
    and then draws ``counts[i]`` positions for step ``i``.

    Only boundaries strictly inside a step that spans exactly two epochs count: a step
    that contains a whole epoch repeats ``c - n`` rows whatever the order, and one whose
    tail is a whole epoch (``tail_start == 0``) has no row left to bring forward.
    """
    c = counts[counts > 0]
    s = start + np.cumsum(c) - c
    m = (s // n + 1) * n  # the first boundary after each step's first position
    keep = (m < s + c) & (s + c <= m + n) & (s > m - n)
    return Boundaries(m[keep] // n, (s - m + n)[keep], (s + c - m)[keep])


def defer_tails(perms: Int64s, prev: Int64s, first: int, bounds: Boundaries) -> None:
    """Reorder, in place, the epochs of ``perms`` that start inside a step.

    Args:
        perms: Epochs ``first, first + 1, ...`` of one pool, one row each (pool
            indices), as generated.
        prev: Epoch ``first - 1`` as drawn (only read when epoch ``first`` has a
            boundary).
        first: The epoch number of ``perms[0]``.
        bounds: The boundaries of epochs ``[first, first + len(perms))``.
    """
    if not len(bounds):
        return
    rows, a, h = bounds.epoch - first, bounds.tail_start, bounds.head
    heads, extent = _partition(perms, prev, rows, a, h)
    width = heads.shape[1]
    generated = perms[rows, :width]
    perms[rows, :width] = heads
    # Boundary i read epoch rows[i] - 1 as generated. That is its final order past
    # position extent[i - 1], so boundary i is right unless boundary i - 1 reordered
    # into i's tail (only when n < 2c). Redo those, in order, one at a time: a redone
    # boundary may in turn reach into its successor's tail.
    linked = np.r_[False, rows[1:] == rows[:-1] + 1]
    redo = np.flatnonzero(linked & (np.r_[0, extent[:-1]] > a)).tolist()
    if not redo:
        return
    rows_, a_, h_, linked_, ext = (
        rows.tolist(),
        a.tolist(),
        h.tolist(),
        linked.tolist(),
        extent.tolist(),
    )
    j = 0
    while j < len(redo):
        i = redo[j]
        while True:
            r = rows_[i]
            perm = perms[r]
            perm[:width] = generated[i]
            ext[i] = _partition_one(perm, perms[r - 1] if r else prev, a_[i], h_[i])
            i += 1
            if i == len(rows_) or not linked_[i] or ext[i - 1] <= a_[i]:
                break
        while j < len(redo) and redo[j] < i:
            j += 1


def _partition(
    perms: Int64s, prev: Int64s, rows: Int64s, a: Int64s, h: Int64s
) -> tuple[Int64s, Int64s]:
    """Each boundary's reordered prefix (as wide as the widest), and its length, each
    read from the previous epoch as it stands in ``perms`` (or ``prev``)."""
    nb, n = len(rows), perms.shape[1]
    width = int(min(n, int((n - a + h).max())))  # the prefix never reaches past L + h
    lengths = n - a
    owner = np.repeat(np.arange(nb), lengths)
    # Every tail: epoch rows[i] - 1 (prev for rows[i] == 0) from position a[i] on.
    col = np.arange(int(lengths.sum())) + np.repeat(a - (np.cumsum(lengths) - lengths), lengths)
    at = np.repeat((rows - 1) * n, lengths) + col
    values = np.where(at >= 0, perms.reshape(-1)[np.maximum(at, 0)], prev[col])
    tail = np.zeros(nb * n, dtype=bool)  # tail[i * n + v]: row v is in boundary i's step
    tail[owner * n + values] = True
    head = perms[rows, :width]
    in_tail = tail[head + (np.arange(nb) * n)[:, None]]
    wanted = np.minimum(h, a)[:, None]  # a = n - L rows lie outside the tail
    fresh = np.cumsum(~in_tail, axis=1)
    extent = np.argmax(fresh >= wanted, axis=1) + 1
    # Stable partition of each prefix without a sort: the k-th row outside the tail
    # goes to k - 1, the k-th tail row to wanted + k - 1; the rest stays.
    j = np.arange(width)
    dest = np.where(in_tail, wanted + j - fresh, fresh - 1)
    dest = np.where(j < extent[:, None], dest, j) + (np.arange(nb) * width)[:, None]
    out = np.empty(nb * width, dtype=np.int64)
    out[dest.reshape(-1)] = head.reshape(-1)
    return out.reshape(nb, width), extent.astype(np.int64)


def _partition_one(perm: Int64s, before: Int64s, a: int, h: int) -> int:
    """:func:`_partition` of one boundary, in place on ``perm``; returns the extent."""
    tail = np.zeros(perm.size, dtype=bool)
    tail[before[a:]] = True
    head = perm[: perm.size - a + h]
    in_tail = tail[head]
    fresh = ~in_tail
    extent = int(fresh.nonzero()[0][(h if h < a else a) - 1]) + 1
    perm[:extent] = np.concatenate((head[:extent][fresh[:extent]], head[:extent][in_tail[:extent]]))
    return extent


class PoolWalk:
    """One (stream, bucket) pool's walk (see the module docstring); ``base`` is the
    pool's :func:`~materializer.plan.rng.derive` of (seed, epoch tag, coordinates)."""

    def __init__(self, rows: Int64s, tokens: Int64s, base: int) -> None:
        self.n = int(rows.size)
        self.rows, self.tokens = rows, tokens
        self.base = np.uint64(base)
        self.drawn = 0
        self._cached = -1
        self._perm = np.arange(self.n, dtype=np.int64)  # epoch _cached as drawn

    def _epochs(self, first: int, count: int) -> Int64s:
        n = self.n
        keys = np.arange(first, first + count, dtype=np.uint64)[:, None] * np.uint64(n)
        keys = keys + np.arange(n, dtype=np.uint64)[None, :]
        keys += self.base
        return mix_order(keys)

    def replay_from(self, cumulative: Int64s, quota: int) -> None:
        """Put a fresh walk where steps drawing ``diff(cumulative)`` leave it, as if
        :meth:`draw` had drawn them (``cumulative[0] == 0``; ``quota`` bounds any
        step's count).

        Only the last few steps are drawn again, from the latest step start ``s`` at
        which a freshly generated epoch is already as drawn: an epoch start (no
        boundary to defer), or at least ``quota`` positions into the epoch, past the
        prefix its own boundary reordered (that prefix is shorter than the boundary
        step's count). From ``s`` on, :meth:`draw` regenerates what it needs.
        """
        pos = np.asarray(cumulative, dtype=np.int64)
        off = pos % self.n
        ok = (off == 0) | (off >= quota)
        ok[0] = True
        start = int(np.flatnonzero(ok)[-1])
        self.drawn, self._cached = int(pos[start]), -1
        counts = np.diff(pos[start:])
        if int(counts.sum()):
            self.draw(counts)

    def draw(self, counts: Int64s) -> tuple[Int64s, Int64s]:
        """The rows (and their tokens) of consecutive steps drawing ``counts[i]`` each."""
        n, start = self.n, self.drawn
        stop = start + int(counts.sum())
        parts: list[Int64s] = []
        epoch, last = start // n, (stop - 1) // n
        bounds = step_boundaries(start, counts, n) if last > epoch else None
        while epoch <= last:
            if epoch == self._cached:
                span, perms = 1, self._perm[None, :]
            else:
                span = min(last - epoch + 1, max(1, _PERM_BLOCK // n))
                perms = self._epochs(epoch, span)
                if bounds is not None:  # they lie in epochs start // n + 1 .. last
                    whole = epoch <= start // n + 1 and span > last - epoch
                    block = bounds if whole else bounds.select(epoch, epoch + span)
                    defer_tails(perms, self._perm, epoch, block)
                self._cached, self._perm = epoch + span - 1, perms[-1]
            lo = max(start - epoch * n, 0)
            hi = min(stop - epoch * n, span * n)
            parts.append(perms.reshape(-1)[lo:hi])
            epoch += span
        self.drawn = stop
        idx = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return self.rows[idx], self.tokens[idx]
