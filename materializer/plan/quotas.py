"""Stream quotas inside a bucket: cumulative largest remainder along a Huffman tree.

Inside bucket ``b`` stream ``k`` has the conditional weight ``u_kb``. The cumulative
count of each stream after ``M`` seats is a closed form of ``M`` (two-way splits with
carried deficits), house-monotone, so never a negative per-step count, and vectorised
across steps (docs/plan.md, "Streams").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from catalog.errors import InvalidInput
from materializer.plan.spec import Floats, Int64s

__all__ = ["Apportioner", "cumulative_quotas"]


class Apportioner:
    """Cumulative largest-remainder quotas along a Huffman tree of two-way splits.

    At a split with ``M`` cumulative seats, the lighter child gets ``floor(p*M + 1/2)``
    (two-party largest remainder with the carried deficit), the heavier the rest. Each
    child's count never decreases as ``M`` grows (no Alabama paradox, unlike K-party
    largest remainder), so per-step counts are differences of a closed form.
    """

    def __init__(self, weights: Floats) -> None:
        n = len(weights)
        total = float(np.sum(weights))
        self.weights = weights / total
        node_w = list(self.weights)
        self._splits: list[tuple[int, int, int, float]] = []  # (node, light, heavy, p)
        heap = [(w, i, i) for i, w in enumerate(node_w)]  # (weight, tie: min leaf, node)
        heapq.heapify(heap)
        parent = [-1] * n
        while len(heap) > 1:
            w1, t1, a = heapq.heappop(heap)
            w2, t2, b = heapq.heappop(heap)
            node = len(node_w)
            node_w.append(w1 + w2)
            parent += [-1]
            parent[a] = parent[b] = node
            self._splits.append((node, a, b, w1 / (w1 + w2)))  # a is the lighter one
            heapq.heappush(heap, (w1 + w2, min(t1, t2), node))
        self._splits.reverse()  # root first
        self._n = n
        # e_child <= p * e_parent + 1/2 unrolls to 1/2 * sum over the path below the
        # root (leaf included) of w_leaf / W_node.
        bound = np.zeros(n)
        for leaf in range(n):
            node = leaf
            while parent[node] >= 0:
                bound[leaf] += 0.5 * node_w[leaf] / node_w[node]
                node = parent[node]
        self.bounds = bound

    def max_increments(self, batch: int) -> list[int]:
        """Per leaf, the most seats one step of ``batch`` seats can give it.

        A lighter child's increment over a parent increment ``d`` is
        ``floor(p * d)`` or ``ceil(p * d)`` (the heavier one gets the rest), so
        propagating the parent's largest increment down the tree bounds every step.
        """
        top = {len(self._splits) + self._n - 1: batch}
        for node, light, heavy, p in self._splits:
            d = top.pop(node)
            top[light], top[heavy] = math.ceil(p * d), d - math.floor(p * d)
        return [top[leaf] for leaf in range(self._n)]

    def cumulative(self, seats: Int64s) -> Int64s:
        """Cumulative quota of each leaf for each cumulative seat count (len x n)."""
        values: dict[int, Int64s] = {len(self._splits) + self._n - 1: seats}
        for node, light, heavy, p in self._splits:
            m = values.pop(node)
            # Rounding the lighter child (p <= 1/2) keeps both children monotone even
            # under float rounding: its increment never exceeds the parent's.
            lo = np.floor(m.astype(np.float64) * p + 0.5).astype(np.int64)
            values[light], values[heavy] = lo, m - lo
        out = np.empty((len(seats), self._n), dtype=np.int64)
        for leaf in range(self._n):
            out[:, leaf] = values[leaf]
        return out


def cumulative_quotas(weights: Sequence[float], seats: ArrayLike) -> Int64s:
    """Cumulative largest-remainder quotas of ``seats`` (non-decreasing) among weights.

    Row ``i`` splits ``seats[i]``; each column is non-decreasing and within
    :func:`~materializer.plan.layout.plan_layout`'s per-stream bound (< 1 when the
    tree is shallow) of ``weight * seats``.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not w.size or (w <= 0).any() or not np.isfinite(w).all():
        raise InvalidInput("weights must be positive and finite", field="weights")
    s = np.asarray(seats, dtype=np.int64)
    if s.ndim != 1 or (s.size and (s.min() < 0 or (np.diff(s) < 0).any())):
        raise InvalidInput("seats must be non-decreasing and >= 0", field="seats")
    return Apportioner(w).cumulative(s)
