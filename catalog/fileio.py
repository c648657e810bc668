"""A pyiceberg FileIO that reads a restored warehouse through its original paths.

Iceberg metadata (metadata JSON, manifest lists, manifests) records absolute file
locations — for an embedded catalog ``file:///old/home/warehouse/...``. A restore puts
the same tree, byte for byte, under a new root and rewrites nothing in the Avro files;
instead the restored tables carry two properties, ``vidlake.remap.from`` and
``vidlake.remap.to``, and this FileIO (``py-io-impl``) maps every location under the
old root to the new one before pyarrow opens it. Locations outside the old root
(everything the restored catalog writes later) pass through unchanged.

:data:`IO_IMPL` is stored in users' data (every restored table's ``py-io-impl``
property, which pyiceberg imports by name): this module and the class name must never
move. Tables restored before it lived here name ``manifests.storage.remap``, kept as an
alias for them.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

__all__ = [
    "IO_IMPL",
    "LEGACY_IO_IMPL",
    "REMAP_FROM",
    "REMAP_TO",
    "RemappedFileIO",
    "remap_location",
]

REMAP_FROM = "vidlake.remap.from"
REMAP_TO = "vidlake.remap.to"
#: The ``py-io-impl`` a restore writes: a STABLE path (see the module docstring).
IO_IMPL = "catalog.fileio.RemappedFileIO"
#: The path tables restored before this module moved name (still importable).
LEGACY_IO_IMPL = "manifests.storage.remap.RemappedFileIO"


def remap_location(location: str, properties: Properties) -> str:
    """``location`` with the old warehouse root replaced by the new one."""
    old, new = properties.get(REMAP_FROM), properties.get(REMAP_TO)
    if not old or not new:
        return location
    old, new = old.rstrip("/"), new.rstrip("/")
    for src, dst in ((old, new), (_bare(old), _bare(new))):
        if location == src or location.startswith(src + "/"):
            return dst + location[len(src) :]
    return location


def _bare(uri: str) -> str:
    return uri.removeprefix("file://") if uri.startswith("file:///") else uri


class RemappedFileIO(PyArrowFileIO):
    """:class:`PyArrowFileIO` with :func:`remap_location` applied to every location."""

    @staticmethod
    def parse_location(location: str, properties: Properties = EMPTY_DICT) -> tuple[str, str, str]:
        return PyArrowFileIO.parse_location(remap_location(location, properties), properties)

    def __reduce__(self) -> Any:
        return (RemappedFileIO, (self.properties,))
