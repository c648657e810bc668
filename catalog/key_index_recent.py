"""The keys this process's own commits added to the key index, held in memory.

Ingest's reference checks mostly ask for keys a recent batch added: a score, caption
or latent batch names the clips the batch before it wrote. Each such look-up in the
on-disk index (:mod:`catalog.key_index`) is a B-tree probe in SQLite, 3-7 µs, which is
more than the Parquet write of the row it checks. :class:`RecentKeys` answers those
from bounded runs of digests per view (one sorted run per commit, oldest dropped first
beyond ``capacity`` digests: 8 bytes plus the digest a key, 24-40 MB a view at the
default; runs of similar size are merged, so a look-up searches O(log n) of them),
searched in numpy; the index answers the rest.

A set is only ever a subset of its view: it records the view state (table uuid,
snapshot, near-duplicate rule) its keys are known present at, and it is kept across a
sync only when the new snapshot descends from that one through appends and
``replace`` snapshots alone (which remove no rows). Anything else (an erasure's
rewrite, a recreated table, a changed rule, a state this process cannot trace) empties
it, so an answer from it is one the index would give. A hit compares the whole digest;
a miss only sends the key on to the index.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from catalog.key_index_rows import Packed, heads, merge_sorted

__all__ = ["CAPACITY", "RecentKeys", "State"]

#: Digests kept per view.
CAPACITY = 1 << 20

#: A view's state: (table uuid, snapshot id, near-duplicate rule key).
State = tuple[str, int | None, str]


@dataclass(frozen=True)
class _Run:
    """One commit's digests of one width, sorted by their first eight bytes."""

    head: NDArray[np.uint64]
    keys: NDArray[np.uint8]

    @classmethod
    def of(cls, keys: NDArray[np.uint8]) -> _Run:
        """The run of ``keys`` (one digest a row)."""
        head = heads(keys)
        if len(head) < 2 or (head[1:] >= head[:-1]).all():  # sorted by the caller
            return cls(head, keys)
        order = np.argsort(head, kind="stable")
        return cls(head[order], keys[order])

    def merged(self, newer: _Run) -> _Run:
        """This run and a newer one as one."""
        return _Run(*merge_sorted((self.head, self.keys), (newer.head, newer.keys)))

    def known(self, head: NDArray[np.uint64], keys: NDArray[np.uint8]) -> NDArray[np.bool_]:
        """Which of ``keys`` (with their ``head``s) are in this run. A key whose head
        another key in the run shares may be missed (never wrongly found)."""
        at = np.minimum(np.searchsorted(self.head, head), len(self.head) - 1)
        hit: NDArray[np.bool_] = self.head[at] == head
        hit[hit] = (self.keys[at[hit]] == keys[hit]).all(axis=1)
        return hit


def _settle(runs: deque[_Run], most: int) -> None:
    """Merge the newest run into the one before while that is under twice its size
    (of one width), up to ``most`` keys a run: O(log n) runs to search, each key
    re-sorted O(log n) times, and the oldest commits still dropped first."""
    while len(runs) >= 2:
        older, newer = runs[-2], runs[-1]
        small = len(older.head) <= 2 * len(newer.head)
        fits = len(older.head) + len(newer.head) <= most
        if older.keys.shape[1] != newer.keys.shape[1] or not (small and fits):
            return
        runs.pop()
        runs[-1] = older.merged(newer)


class RecentKeys:
    """Per view, the digests our commits added and the state they are present at.

    Args:
        capacity: Digests kept per view (the oldest commits' are dropped first).
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._runs: dict[str, deque[_Run]] = {}
        self._state: dict[str, State] = {}

    def clear(self) -> None:
        """Forget every view's keys."""
        self._runs.clear()
        self._state.clear()

    def added(self, view: str, base: State, new: State, groups: list[Packed]) -> None:
        """Our commit took ``view`` from ``base`` to ``new`` adding ``groups``' keys."""
        runs = self._runs.setdefault(view, deque())
        if self._state.get(view) != base:
            runs.clear()
        for group in groups:
            if group.width >= 8 and 0 < len(group.rows) <= self._capacity:
                runs.append(_Run.of(np.frombuffer(group.data, np.uint8).reshape(-1, group.width)))
                _settle(runs, self._capacity // 2)
        held = sum(len(r.head) for r in runs)
        while held > self._capacity:
            held -= len(runs.popleft().head)
        self._state[view] = new

    def synced(
        self, view: str, state: State | None, descends: Callable[[int | None], bool]
    ) -> None:
        """The view is now at ``state``: keep the keys only when ``descends(held
        snapshot)`` says ``state``'s snapshot follows it by appends and replaces only."""
        held = self._state.get(view)
        if held == state:
            return
        if held is None or state is None or held[0::2] != state[0::2] or not descends(held[1]):
            self._runs.pop(view, None)
            self._state.pop(view, None)
            return
        self._state[view] = state

    def known(self, view: str, group: Packed) -> NDArray[np.bool_]:
        """Which of ``group``'s keys are held for ``view`` (present in it)."""
        out = np.zeros(len(group.rows), dtype=np.bool_)
        runs = [r for r in self._runs.get(view, ()) if r.keys.shape[1] == group.width]
        if not runs or len(out) == 0:
            return out
        keys = np.frombuffer(group.data, dtype=np.uint8).reshape(-1, group.width)
        head = heads(keys)
        for run in reversed(runs):  # the newest first: the likeliest to hold them
            rest = np.flatnonzero(~out)
            if len(rest) == 0:
                break
            out[rest] = run.known(head[rest], keys[rest])
        return out
