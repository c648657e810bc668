"""Interop with other dataset layouts: TAR-shard training caches (import by reference,
export of snapshots). See ``docs/interop.md``.

This package sits above ``catalog`` and ``manifests`` (an import writes catalog rows and
object references; an export reads a published snapshot through the registry and the
loader's plan reader), below ``service`` (``service/cli_interop.py`` drives it).
``sources`` and ``tar_index`` need only the standard library; ``tar_import`` and
``tar_export`` use the catalog (pyiceberg) and are imported by name.
"""

from __future__ import annotations

__all__ = ["sources", "tar_export", "tar_import", "tar_index"]
