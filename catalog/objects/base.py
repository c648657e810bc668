"""The content-addressed object store contract.

An object is addressed by the SHA-256 of its bytes and lives under
``<prefix>/objects/<sha256[:2]>/<sha256>``. Two rules hold for every backend:

* **Never overwrite.** Writes are conditional (``If-None-Match: *`` on S3, ``link(2)``
  of a fsync'd temp file locally). Identical content never makes a second object;
  different content never replaces an existing key.
* **Never trust unverified bytes.** ``put_*`` hashes before writing and verifies after;
  ``get`` and ``download`` hash what they read and raise :class:`ChecksumMismatch` on a
  difference. A multipart ETag is never taken as a content hash.

Besides objects, a store holds a few *named keys* (the snapshot registry's
``manifests/v000001.json``, restore specs). Named keys are create-only, too:
``put_key`` raises :class:`Conflict` when the key exists.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from catalog.errors import ChecksumMismatch, InvalidInput
from catalog.hashing import require_sha256
from catalog.objects.s3_client import S3Connection

__all__ = [
    "OBJECTS_DIR",
    "ObjectInfo",
    "ObjectStore",
    "PutResult",
    "check_key",
    "check_range",
    "check_reason",
    "check_supplied",
    "corrupt",
    "object_key",
    "range_error",
]

log = logging.getLogger("vidlake.objects")

#: The part of a store's key space that holds content-addressed objects; named keys
#: may not live there, so a named key can never pass for a verified object.
OBJECTS_DIR = "objects"

_KEY_PART = re.compile(r"^[A-Za-z0-9_=+@-][A-Za-z0-9._=+@-]*$")


def object_key(prefix: str, sha256: str) -> str:
    """The key of an object: ``<prefix>/objects/<sha256[:2]>/<sha256>`` (no leading slash)."""
    require_sha256(sha256)
    head = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    return f"{head}objects/{sha256[:2]}/{sha256}"


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid named key, else raise InvalidInput.

    A named key is one or more ``/``-separated parts of ``[A-Za-z0-9._=+@-]`` that do
    not start with a dot (no ``..``, no hidden temp names), and it must not lie under
    ``objects/``, which belongs to content-addressed objects. Every backend applies the
    same rule so that a key valid on one is valid on all.
    """
    from catalog.errors import InvalidInput

    if not isinstance(key, str) or not key:
        raise InvalidInput(f"a named key must be a non-empty string, got {key!r}", field="key")
    parts = key.split("/")
    if not all(_KEY_PART.match(part) for part in parts):
        raise InvalidInput(
            f"invalid named key {key!r}: use '/'-separated parts of [A-Za-z0-9._=+@-] "
            "that do not start with '.'",
            field="key",
            key=key,
        )
    if parts[0] == OBJECTS_DIR:
        raise InvalidInput(
            f"named key {key!r} lies under '{OBJECTS_DIR}/', which is reserved for objects",
            field="key",
            key=key,
        )
    return key


@dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one stored object."""

    sha256: str
    size: int


@dataclass(frozen=True)
class PutResult:
    """The outcome of a put: the object and whether this call created it."""

    info: ObjectInfo
    created: bool


class ObjectStore(ABC):
    """A content-addressed, write-once object store (see the module docstring).

    Implementations are safe to use from several threads and several processes at
    once, and pickle without live clients (clients are created lazily).
    """

    #: A URL that reopens this store with :func:`catalog.objects.open_store`.
    url: str

    #: How to reach ``s3://`` URLs: an S3 store's own connection; for any store, the one
    #: its references to S3 objects are read with (:mod:`catalog.objects.refs`).
    s3_connection: S3Connection = S3Connection()

    # -- content-addressed objects -------------------------------------------------
    @abstractmethod
    def put_bytes(self, data: bytes, sha256: str | None = None) -> PutResult:
        """Store ``data``. If ``sha256`` is given it must match (else ChecksumMismatch)."""

    @abstractmethod
    def put_file(self, path: str | Path, sha256: str | None = None) -> PutResult:
        """Store a file's bytes, streaming (multipart for large files on S3)."""

    @abstractmethod
    def head(self, sha256: str) -> ObjectInfo | None:
        """Size of a stored object, or None when absent. Does not read the bytes."""

    def exists(self, sha256: str) -> bool:
        return self.head(sha256) is not None

    @abstractmethod
    def get(self, sha256: str) -> bytes:
        """The whole object, verified against its address. NotFound when absent."""

    @abstractmethod
    def get_range(self, sha256: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (not verified: callers check member hashes)."""

    @abstractmethod
    def download(self, sha256: str, dest: str | Path) -> ObjectInfo:
        """Write the object to ``dest`` via a verified temp file renamed into place."""

    @abstractmethod
    def verify(self, sha256: str) -> ObjectInfo:
        """Prove the stored bytes hash to ``sha256``: by content (a full read), or by a
        full-object checksum the backend has proven it computes itself (S3: see
        ``S3ObjectStore.checksums_proven``). ChecksumMismatch otherwise."""

    @abstractmethod
    def delete(self, sha256: str, *, reason: str) -> bool:
        """Erase an object (hard takedowns only); logged with the reason. True if it existed."""

    def abort_uploads(self, sha256: str) -> int:
        """Abort unfinished uploads of object ``sha256`` (a killed multipart upload's
        parts are invisible but hold bytes); how many. Stores without any: 0."""
        return 0

    @abstractmethod
    def iter_objects(self) -> Iterator[ObjectInfo]:
        """Every stored object (for inventory and garbage collection)."""

    # -- named, create-only keys ------------------------------------------------------
    @abstractmethod
    def put_key(self, key: str, data: bytes) -> None:
        """Create ``key`` with ``data``; Conflict if it already exists (whatever it holds)."""

    @abstractmethod
    def get_key(self, key: str) -> bytes:
        """The bytes of a named key; NotFound when absent."""

    @abstractmethod
    def list_keys(self, prefix: str) -> list[str]:
        """Named keys that start with ``prefix`` (relative to the store prefix), sorted."""

    def key_exists(self, key: str) -> bool:
        from catalog.errors import NotFound

        try:
            self.get_key(key)
        except NotFound:
            return False
        return True


# -- checks and errors every store shares --------------------------------------------
def check_supplied(sha256: str | None, actual: str, size: int) -> None:
    if sha256 is not None and require_sha256(sha256) != actual:
        raise ChecksumMismatch(
            f"content hashes to {actual}, not to the supplied {sha256}",
            sha256=sha256,
            actual=actual,
            size=size,
        )


def corrupt(sha256: str, actual: str, size: int, **context: str) -> ChecksumMismatch:
    """The error for stored object ``sha256`` whose ``size`` bytes hash to ``actual``
    (``context`` names where: a local path, an S3 key)."""
    return ChecksumMismatch(
        f"object {sha256} is corrupt: its {size} bytes hash to {actual}",
        sha256=sha256,
        actual=actual,
        size=size,
        **context,
    )


def check_range(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise InvalidInput(
            f"a range needs offset >= 0 and length >= 0, got offset={offset} length={length}",
            field="range",
            offset=offset,
            length=length,
        )


def range_error(sha256: str, offset: int, length: int, size: int) -> InvalidInput:
    return InvalidInput(
        f"range [{offset}, {offset + length}) lies beyond object {sha256} of {size} bytes",
        field="range",
        sha256=sha256,
        offset=offset,
        length=length,
        size=size,
    )


def check_reason(reason: str) -> None:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("delete needs a non-empty reason (it is logged)", field="reason")
