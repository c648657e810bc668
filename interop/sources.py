"""Where a TAR-shard dataset lives: a local directory, an ``s3://`` prefix or an HTTP(S)
base URL, read by name and byte range.

A :class:`RangeSource` never lists anything: the importer reads the manifest by its
name and then only the files the manifest names. Every read is counted
(``requests``, ``bytes_read``), which the tests and the benchmark use to prove that
indexing touches headers only and that an unlisted shard is never opened.
"""

from __future__ import annotations

import threading
import urllib.parse
from pathlib import Path

from catalog.errors import InvalidInput
from catalog.objects.refs import iter_url, read_url_range, url_size
from catalog.objects.s3_client import S3Connection

__all__ = ["RangeSource", "open_range_source"]


class RangeSource:
    """Files under one base URL (``file:///dir/``, ``s3://bucket/prefix/``, ``https://…/``).

    Args:
        base: The base URL, or a local directory path.
        s3_connection: How to reach an ``s3://`` base (default: boto3's own
            configuration); the importer passes its object store's.
    """

    def __init__(self, base: str | Path, s3_connection: S3Connection | None = None) -> None:
        text = str(base)
        if text.startswith(("s3://", "http://", "https://", "file://")):
            url = text
        else:
            url = Path(text).absolute().as_uri()
        self.base = url.rstrip("/") + "/"
        self.s3_connection = s3_connection or S3Connection()
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_read = 0
        self.names_read: list[str] = []

    def __repr__(self) -> str:
        return f"RangeSource({self.base!r})"

    def url_of(self, name: str) -> str:
        """The absolute URL of ``name`` (a relative path without ``..``)."""
        parts = name.split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise InvalidInput(f"not a relative file name: {name!r}", field="path", path=name)
        quoted = "/".join(urllib.parse.quote(p) for p in parts)
        return self.base + (quoted if not self.base.startswith("s3://") else name)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes_read += n
            self.names_read.append(name)

    def read(self, name: str) -> bytes:
        """The whole file ``name`` (small files: manifests)."""
        data = b"".join(iter_url(self.url_of(name), self.s3_connection))
        self._count(name, len(data))
        return data

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of ``name`` (short only at the file's end)."""
        data = read_url_range(self.url_of(name), offset, length, self.s3_connection)
        self._count(name, len(data))
        return data

    def size(self, name: str) -> int:
        """The size of ``name`` (one metadata request)."""
        n = url_size(self.url_of(name), self.s3_connection)
        self._count(name, 0)
        return n


def open_range_source(
    source: str | Path | RangeSource, s3_connection: S3Connection | None = None
) -> RangeSource:
    """A :class:`RangeSource` for a directory, ``s3://`` prefix or HTTP(S) base URL."""
    if isinstance(source, RangeSource):
        return source
    return RangeSource(source, s3_connection)
