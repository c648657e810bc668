"""The snapshot registry: immutable numbered versions, pins, diffs and patches.

See ``docs/snapshots.md`` for the publication protocol and its failure cases.
"""

from __future__ import annotations

from manifests.patch import EXCLUDED_NAME, SKIPPED_NAME, patch
from manifests.registry import (
    ArtifactRef,
    Pin,
    PinEvent,
    Registry,
    RegistryEntry,
    SnapshotDiff,
    SnapshotRecord,
    canonical_json,
)

__all__ = [
    "EXCLUDED_NAME",
    "SKIPPED_NAME",
    "ArtifactRef",
    "Pin",
    "PinEvent",
    "Registry",
    "RegistryEntry",
    "SnapshotDiff",
    "SnapshotRecord",
    "canonical_json",
    "patch",
]
