"""The snapshot contract and registry: the artifacts' format, their IPC reads and
writes, a verified local artifact cache, and immutable numbered versions, pins, diffs
and patches.

See ``docs/snapshots.md`` for the publication protocol and its failure cases.

Names are imported lazily, so that ``manifests.format`` (and ``manifests.ipc``,
``manifests.artifacts``) stay importable on a GPU node without pydantic's registry or
pyiceberg: the loader reads the format from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from manifests.diff import SnapshotDiff
    from manifests.registry import (
        ArtifactRef,
        Pin,
        PinEvent,
        Registry,
        RegistryEntry,
        SnapshotRecord,
        canonical_json,
    )

__all__ = [
    "ArtifactRef",
    "Pin",
    "PinEvent",
    "Registry",
    "RegistryEntry",
    "SnapshotDiff",
    "SnapshotRecord",
    "canonical_json",
]

# ``patch`` is not among them: a lazy name would be shadowed by the submodule
# ``manifests.patch`` once that is imported; use ``from manifests.patch import patch``.
_LAZY = {name: "manifests.registry" for name in __all__} | {"SnapshotDiff": "manifests.diff"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'manifests' has no attribute {name!r}")
