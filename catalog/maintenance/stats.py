"""What a table's current snapshot costs to plan: data files, bytes, manifests, and the
wall time of a full-scan plan (the figures ``vidlake maintain`` reports before/after)."""

from __future__ import annotations

import time
from typing import Any

from pyiceberg.table import Table

__all__ = ["table_stats"]


def table_stats(tbl: Table) -> dict[str, Any]:
    """Data files, their bytes, manifests and full-scan planning seconds at ``tbl``'s
    current snapshot (zeros for an empty table)."""
    current = tbl.metadata.current_snapshot()
    if current is None:
        return {"data_files": 0, "data_bytes": 0, "manifests": 0, "planning_s": 0.0}
    manifests = current.manifests(io=tbl.io)
    started = time.perf_counter()
    tasks = list(tbl.scan().plan_files())
    planning_s = time.perf_counter() - started
    return {
        "data_files": len(tasks),
        "data_bytes": sum(t.file.file_size_in_bytes for t in tasks),
        "manifests": len(manifests),
        "planning_s": round(planning_s, 6),
    }
