"""Keys of this process's own commits not yet written to the on-disk key index.

Each write to the index is a transaction, and (since the keys moved to sorted run
files, :mod:`catalog.key_runs`) a new run that later merges rewrite; a run per small
commit would also make a probe read more runs. (Into SQLite's B-tree, a 10k-key batch
into 4M keys cost 16 µs a key, 1M keys 3.5 µs:
docs/decisions/039-write-behind-key-index.md.) So a writer's commits of
``clips`` and ``latents`` keys are held here, in bounded memory, and written to the
index in one transaction when :data:`FLUSH_KEYS` have gathered, when the chain of its
own commits is broken by another writer's, and when the catalog closes.

A view's pending keys are exact and say which index state they sit on: the index at
``base`` plus these keys is the view at ``head`` (our last commit). They are used only
while the index still holds ``base``: another writer that synced the view meanwhile
read our appended files itself, so the keys are dropped, not written twice. A process
that dies with keys pending leaves the index behind, never wrong: the next sync reads
the appended files, as after a writer killed between its commit and its index write.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from catalog.key_index_recent import State
from catalog.key_index_rows import Packed, heads, merge_sorted

__all__ = ["FLUSH_KEYS", "Pending", "PendingKeys"]

#: Keys pending per view before they are written (each digest and its 8-byte sort
#: key: 24-28 MB of latents, 56 MB of clips, which have two digests each).
FLUSH_KEYS = 1 << 20


@dataclass
class Pending:
    """One view's pending keys: the index at ``base`` plus them is the view at ``head``.

    Attributes:
        base: The index state the keys sit on.
        head: The view's state with them (our last commit).
        runs: Per digest width, sorted runs of digests (``S<width>`` arrays).
        count: Digests held of the width that holds the most: keys, as a clip has
            two digests (its own and its asset-keyed one) and a latent one.
    """

    base: State
    head: State
    runs: dict[int, list[_Run]] = field(default_factory=dict)
    count: int = 0

    def add(self, groups: list[Packed]) -> None:
        """Hold ``groups``' digests (one sorted run per group, merged with the run
        before while that is under twice its size: O(log n) runs to search)."""
        for group in groups:
            if len(group.rows) == 0:
                continue
            runs = self.runs.setdefault(group.width, [])
            runs.append(_Run.of(np.frombuffer(group.data, np.uint8).reshape(-1, group.width)))
            while len(runs) >= 2 and len(runs[-2].head) <= 2 * len(runs[-1].head):
                newer = runs.pop()
                runs[-1] = _Run(
                    *merge_sorted((runs[-1].head, runs[-1].keys), (newer.head, newer.keys))
                )
            held = sum(len(r.head) for r in runs)
            self.count = max(self.count, held)

    def known(self, group: Packed) -> NDArray[np.bool_]:
        """Which of ``group``'s digests are held (exact: the whole digest compared)."""
        out = np.zeros(len(group.rows), dtype=np.bool_)
        keys = np.frombuffer(group.data, np.uint8).reshape(-1, group.width)
        head = heads(keys)
        for run in self.runs.get(group.width, ()):
            out |= run.known(head, keys)
        return out

    def packed(self) -> list[Packed]:
        """The held digests, one group per width (the index's insert sorts them)."""
        out = []
        for width, runs in self.runs.items():
            keys = np.concatenate([r.keys for r in runs]) if len(runs) > 1 else runs[0].keys
            out.append(Packed(width, keys.tobytes(), np.arange(len(keys), dtype=np.int64)))
        return out


@dataclass(frozen=True)
class _Run:
    """Digests (one a row) sorted by their first eight bytes (``head``)."""

    head: NDArray[np.uint64]
    keys: NDArray[np.uint8]

    @classmethod
    def of(cls, keys: NDArray[np.uint8]) -> _Run:
        head = heads(keys)
        if len(head) < 2 or (head[1:] >= head[:-1]).all():  # sorted by the caller
            return cls(head, keys)
        order = np.argsort(head, kind="stable")
        return cls(head[order], keys[order])

    def known(self, head: NDArray[np.uint64], keys: NDArray[np.uint8]) -> NDArray[np.bool_]:
        """Which of ``keys`` are in this run: each digest whose head it shares is
        compared whole (exact, unlike a first-match search)."""
        out = np.zeros(len(head), dtype=np.bool_)
        at = np.searchsorted(self.head, head)
        ask = np.flatnonzero(at < len(self.head))
        while len(ask):  # a step past each candidate while the head still matches
            ask = ask[self.head[at[ask]] == head[ask]]
            hit = (self.keys[at[ask]] == keys[ask]).all(axis=1)
            out[ask[hit]] = True
            ask = ask[~hit]
            at[ask] += 1
            ask = ask[at[ask] < len(self.head)]
        return out


class PendingKeys:
    """Per view, the keys our commits added that the index does not hold yet."""

    def __init__(self) -> None:
        self._views: dict[str, Pending] = {}

    def get(self, view: str) -> Pending | None:
        """``view``'s pending keys, if any."""
        return self._views.get(view)

    def start(self, view: str, base: State) -> Pending:
        """Begin holding keys for ``view`` on the index state ``base``."""
        pending = self._views[view] = Pending(base, base)
        return pending

    def pop(self, view: str) -> Pending | None:
        """Take ``view``'s pending keys (to write them, or to drop them)."""
        return self._views.pop(view, None)

    def views(self) -> list[str]:
        """The views with keys pending."""
        return list(self._views)

    def clear(self) -> None:
        """Forget every view's pending keys (the index is behind; syncs catch up)."""
        self._views.clear()
