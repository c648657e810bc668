"""A kept alias, not code: do not remove or rename (a path stored in users' data).

Tables restored before the remapping FileIO moved to :mod:`catalog.fileio` carry
``py-io-impl = manifests.storage.remap.RemappedFileIO`` in their Iceberg properties, and
pyiceberg imports that path by name whenever it opens them. New restores write
:data:`catalog.fileio.IO_IMPL`.
"""

from catalog.fileio import RemappedFileIO

__all__ = ["RemappedFileIO"]
