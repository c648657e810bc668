"""The vidlake catalog: Iceberg tables, the content-addressed object store, embeddings.

Heavy dependencies (pyiceberg, lancedb) are imported lazily, so that ``catalog.errors``,
``catalog.hashing`` and ``catalog.objects`` stay usable on a GPU node that has only
``vidlake[loader]`` installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from catalog.errors import VidlakeError

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig, IngestResult
    from catalog.pins import Pin

__all__ = ["CatalogConfig", "IngestResult", "Pin", "VidlakeCatalog", "VidlakeError"]

_LAZY = {
    "CatalogConfig": "catalog.config",
    "IngestResult": "catalog.config",
    "Pin": "catalog.pins",
    "VidlakeCatalog": "catalog.catalog",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'catalog' has no attribute {name!r}")
