"""Interop with other dataset layouts: TAR-shard training caches (import by reference,
export of snapshots). See ``docs/interop.md``.

``sources`` and ``tar_index`` need only the standard library; ``tar_import`` and
``tar_export`` use the catalog (pyiceberg) and are imported by name.
"""

from __future__ import annotations

__all__ = ["sources", "tar_export", "tar_import", "tar_index"]
