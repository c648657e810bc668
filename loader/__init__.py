"""The training-side client: mmap'd plans, rank slices, a shared verified node cache.

Installs with ``pip install 'vidlake[loader]'`` and never imports FastAPI, DuckDB or
pyiceberg. Names are imported lazily so that importing one module costs no torch import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NodeCache", "PlanReader", "SnapshotDataset", "StatefulLoader", "open_plan"]

_LAZY = {
    "NodeCache": "loader.cache",
    "PlanReader": "loader.plan",
    "open_plan": "loader.plan",
    "SnapshotDataset": "loader.dataset",
    "StatefulLoader": "loader.stateful",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loader' has no attribute {name!r}")
