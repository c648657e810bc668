"""The training-side client: mmap'd plans, rank slices, a shared verified node cache.

Installs with ``pip install 'vidlake[loader]'`` and never imports FastAPI, DuckDB or
pyiceberg. Names are imported lazily so that importing one module costs no torch import.

Importing the package freezes the objects that exist at that moment out of the cyclic
garbage collector's sight (``gc.freeze()``): in a training script that imported torch
first they are torch's ~170,000 modules, classes, functions, which live as long as the
process, and the first full collection after torch's import would otherwise walk them
all (0.1-0.2 s on the rank's first batch, docs/decisions/044). Objects made later are
collected as before; ``gc.unfreeze()`` undoes it.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["NodeCache", "PlanReader", "SnapshotDataset", "StatefulLoader", "open_plan"]

_LAZY = {
    "NodeCache": "loader.cache",
    "PlanReader": "loader.plan",
    "open_plan": "loader.plan",
    "SnapshotDataset": "loader.dataset",
    "StatefulLoader": "loader.stateful",
}

gc.freeze()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loader' has no attribute {name!r}")
