"""A resume opens no SQLite connection it does not need (issue 16's ``resume_ms``).

The node cache pools its connections: the one it was opened with serves the first
part of the first step, and a connection is made only for a transaction that finds
none idle. Counted on :meth:`NodeCache._connect` (every connection of the pool), with
each connection's statements traced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loader.cache import NodeCache
from loader.dataset import SnapshotDataset
from manifests.synthetic import write_snapshot


def _count_connections(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[str]]:
    conns: list[Any] = []
    statements: list[str] = []
    connect = NodeCache._connect

    def counting(self: NodeCache) -> Any:
        conn = connect(self)
        conn.set_trace_callback(statements.append)
        conns.append(conn)
        return conn

    monkeypatch.setattr(NodeCache, "_connect", counting)
    return conns, statements


@pytest.mark.parametrize(("threads", "most"), [(1, 1), (2, 2)])
def test_resume_reuses_the_connection_the_cache_was_opened_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, most: int
) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=12, batch_size=8)
    kw: dict[str, Any] = {
        "cache_dir": tmp_path / "node",
        "cache_budget_bytes": 1 << 26,
        "cache_reserve_bytes": 0,
        "prefetch_steps": 0,
        "prefetch_threads": threads,
    }
    for _ in SnapshotDataset(snap.url, 1, **kw):  # every step's objects in the cache
        pass
    conns, statements = _count_connections(monkeypatch)
    ds = SnapshotDataset(snap.url, 1, **kw)
    ds.load_state_dict(ds.state_dict(next_step=9))
    it = iter(ds)
    batch = next(it)
    assert int(batch["step"]) == 9 and batch["rows"].tolist() == snap.plan[9].tolist()
    # Before pooling: one for the open and one per prefetch thread (2 and 3).
    assert len(conns) <= most
    begins = [s for s in statements if s.startswith("BEGIN")]
    # The read-only open, then per part one lease and one release transaction.
    assert begins == ["BEGIN"] + ["BEGIN IMMEDIATE"] * 2 * threads, begins
    it.close()
