"""The one verified local copy of a snapshot's artifacts.

A registry artifact is an object named by its SHA-256 and size (``snapshot.json``'s
``artifacts``). Readers that memory-map one (the loader on a GPU node, the service's
lineage views, the registry's own diffs and patches) need it on local disk, whole
and verified:

* :func:`fetch_verified` fetches into a temp file beside the destination, checks the
  SHA-256 and size, and only then gives it its name (:mod:`catalog.atomic`): a file
  under its final name is always verified, and a failed fetch leaves nothing.
* :class:`ArtifactCache` keeps such copies content-addressed under one directory
  (``<root>/<sha256>`` or ``<root>/<sha256>.<name>``), shared by every process on
  the node: concurrent fetches of one object each publish identical bytes by an
  atomic rename, so readers never see a partial file. With ``rehash=True`` a cached
  file is re-hashed once per process before first use, and a corrupt one is deleted
  and fetched again; with ``rehash=False`` (the loader, whose ranks all open the same
  multi-GB plan) a file of the right size is trusted, since it was verified before it
  took its name.

Standard library and ``catalog`` only: the loader imports this module.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from catalog.atomic import atomic_path
from catalog.errors import ChecksumMismatch
from catalog.hashing import require_sha256, sha256_file

__all__ = ["ArtifactCache", "Fetch", "fetch_verified", "is_verified"]

log = logging.getLogger("vidlake.manifests.artifacts")

#: Writes an object's bytes to the path it is given (which does not exist yet). It
#: may return the (SHA-256, size) it computed while writing, else None and the bytes
#: are hashed after.
Fetch = Callable[[Path], "tuple[str, int] | None"]


def is_verified(path: Path, sha256: str, size: int) -> bool:
    """Whether ``path`` holds exactly the object ``sha256`` of ``size`` bytes."""
    try:
        if path.stat().st_size != size:
            return False
    except FileNotFoundError:
        return False
    return sha256_file(path) == (sha256, size)


def fetch_verified(dest: Path, sha256: str, size: int, fetch: Fetch, *, what: str) -> Path:
    """Fetch object ``sha256`` to ``dest`` through a verified temp file.

    Raises:
        ChecksumMismatch: the fetched bytes are not ``size`` bytes hashing to
            ``sha256`` (``dest`` is left as it was; no temp file remains).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        reported = fetch(tmp)
        try:
            actual, actual_size = reported if reported is not None else sha256_file(tmp)
        except FileNotFoundError:
            actual, actual_size = "", -1
        if (actual, actual_size) != (sha256, size):
            raise ChecksumMismatch(
                f"{what}: got {actual_size} bytes hashing to {actual or 'nothing'}, "
                f"expected {size} bytes, {sha256}",
                sha256=sha256,
                actual=actual,
                expected_size=size,
                actual_size=actual_size,
            )
    return dest


class ArtifactCache:
    """Verified, content-addressed local copies of artifacts under ``root``."""

    def __init__(self, root: str | os.PathLike[str], *, rehash: bool = True) -> None:
        self.root = Path(root)
        self.rehash = rehash
        self._lock = threading.Lock()
        self._verified: set[Path] = set()
        self._path_locks: dict[Path, threading.Lock] = {}

    def path(self, sha256: str, name: str = "") -> Path:
        """Where object ``sha256`` is kept (``name``, e.g. ``plan.arrow``, as a suffix
        that tells a person what the file is)."""
        require_sha256(sha256)
        return self.root / (f"{sha256}.{name}" if name else sha256)

    def ready(self, sha256: str, size: int, name: str = "") -> bool:
        """Whether a copy is in place: of the right size, and (``rehash``) verified in
        this process (a corrupt copy is deleted)."""
        path = self.path(sha256, name)
        with self._lock:
            if path in self._verified and path.is_file():
                return True
        try:
            if path.stat().st_size != size:
                return False
        except FileNotFoundError:
            return False
        if self.rehash and sha256_file(path) != (sha256, size):
            log.warning("cached artifact %s is corrupt; it will be fetched again", path)
            path.unlink(missing_ok=True)
            return False
        with self._lock:
            self._verified.add(path)
        return True

    def get(self, sha256: str, size: int, fetch: Fetch, *, name: str = "", what: str = "") -> Path:
        """The local verified copy of object ``sha256``, fetched when missing or bad.

        Raises:
            ChecksumMismatch: the fetched bytes do not verify (nothing is cached).
        """
        path = self.path(sha256, name)
        with self._lock:
            lock = self._path_locks.setdefault(path, threading.Lock())
        with lock:
            if self.ready(sha256, size, name):
                return path
            fetch_verified(path, sha256, size, fetch, what=what or f"object {sha256}")
            with self._lock:
                self._verified.add(path)
        return path

    def forget(self, sha256: str, name: str = "") -> None:
        """Delete the local copy of ``sha256`` (e.g. an artifact an erasure replaced)."""
        path = self.path(sha256, name)
        with self._lock:
            self._verified.discard(path)
        path.unlink(missing_ok=True)
