"""The local-directory object store.

Layout under ``root``::

    objects/ab/abcd…      one read-only file per object, named by its SHA-256
    <named/key>           create-only named keys (``manifests/v000001.json``)
    .tmp/                 temp files being written; never visible under a key

Every write goes to a fresh temp file in ``.tmp/`` (same filesystem), is fsync'd, and
is then ``link(2)``-ed to its final name. ``link`` is atomic and fails when the name
exists, so a reader sees either nothing or the complete bytes, a crash at any moment
leaves at most an orphan temp file, and nothing is ever overwritten — across threads,
processes and hosts sharing the directory. The directories touched are fsync'd so a
created name survives a power loss.

One difference from S3: a named key cannot also be a "directory" of other keys (``a``
next to ``a/b``); such a put raises :class:`Conflict`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from catalog.atomic import atomic_file, fsync_dir
from catalog.errors import ChecksumMismatch, Conflict, InvalidInput, NotFound, StorageError
from catalog.hashing import CHUNK, is_sha256, require_sha256, sha256_bytes, sha256_file
from catalog.objects.base import (
    OBJECTS_DIR,
    ObjectInfo,
    ObjectStore,
    PutResult,
    check_key,
    check_range,
    check_reason,
    check_supplied,
    corrupt,
    log,
    object_key,
    range_error,
)
from catalog.objects.s3_client import S3Connection

__all__ = ["LocalObjectStore"]

_TMP_DIR = ".tmp"
#: An existing object this small is re-hashed when a put finds it already stored;
#: larger ones get a size check unless ``verify_existing`` is set.
_CHEAP_VERIFY_BYTES = 64 * 1024 * 1024


class LocalObjectStore(ObjectStore):
    """A content-addressed store in a local (or shared POSIX) directory.

    Args:
        root: The store's directory. Created on the first write, not here.
        verify_existing: When a put finds its object already stored, re-hash it
            whatever its size (by default only objects up to 64 MiB are re-hashed;
            larger ones get a size check).
        s3_connection: How to read the ``s3://`` objects this store references
            (:mod:`catalog.objects.refs`); default boto3's own configuration.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        verify_existing: bool = False,
        s3_connection: S3Connection | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.verify_existing = verify_existing
        self.url = self.root.as_uri()
        self.s3_connection = s3_connection or S3Connection()

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalObjectStore) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    # -- paths -----------------------------------------------------------------------
    def object_path(self, sha256: str) -> Path:
        """Where the object ``sha256`` lives (whether or not it exists)."""
        return self.root / object_key("", sha256)

    def _key_path(self, key: str) -> Path:
        return self.root / check_key(key)

    # -- content-addressed objects ---------------------------------------------------
    def put_bytes(self, data: bytes, sha256: str | None = None) -> PutResult:
        actual = sha256_bytes(data)
        check_supplied(sha256, actual, len(data))
        existing = self._existing(actual, len(data))
        if existing is not None:
            return existing
        tmp = self._write_tmp(lambda f: f.write(data))
        return self._publish(tmp, actual, len(data))

    def put_file(self, path: str | Path, sha256: str | None = None) -> PutResult:
        size = _file_size(path)
        if sha256 is not None:
            info = self.head(require_sha256(sha256))
            if info is not None and info.size == size:
                # Stored already: hashing the file (no copy) settles the claim.
                actual, size = sha256_file(path)
                check_supplied(sha256, actual, size)
                existing = self._existing(actual, size)
                if existing is not None:
                    return existing
        digest = hashlib.sha256()
        copied = 0
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed below, after the copy
        except FileNotFoundError:
            raise NotFound(f"file {path} not found", path=str(path)) from None

        def copy(dst: BinaryIO) -> None:
            nonlocal copied
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                copied += len(chunk)

        # Hash the bytes as they are copied, so what is linked is exactly what was hashed.
        with src:
            tmp = self._write_tmp(copy)
        actual = digest.hexdigest()
        try:
            check_supplied(sha256, actual, copied)
            existing = self._existing(actual, copied)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if existing is not None:
            tmp.unlink(missing_ok=True)
            return existing
        return self._publish(tmp, actual, copied)

    def head(self, sha256: str) -> ObjectInfo | None:
        try:
            size = self.object_path(require_sha256(sha256)).stat().st_size
        except FileNotFoundError:
            return None
        return ObjectInfo(sha256, size)

    def get(self, sha256: str) -> bytes:
        path = self.object_path(require_sha256(sha256))
        data = _read(path, sha256)
        actual = sha256_bytes(data)
        if actual != sha256:
            raise corrupt(sha256, actual, len(data), where=str(path))
        return data

    def get_range(self, sha256: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        path = self.object_path(require_sha256(sha256))
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if offset + length > size:
                    raise range_error(sha256, offset, length, size)
                f.seek(offset)
                return f.read(length)
        except FileNotFoundError:
            raise NotFound(f"object {sha256} not found", sha256=sha256) from None

    def download(self, sha256: str, dest: str | Path) -> ObjectInfo:
        src = self.object_path(require_sha256(sha256))
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        try:
            with open(src, "rb") as fin, atomic_file(dest) as fout:
                while chunk := fin.read(CHUNK):
                    digest.update(chunk)
                    fout.write(chunk)
                    size += len(chunk)
                if digest.hexdigest() != sha256:
                    raise corrupt(sha256, digest.hexdigest(), size, where=str(src))
        except FileNotFoundError as exc:
            if exc.filename == str(src):
                raise NotFound(f"object {sha256} not found", sha256=sha256) from None
            raise StorageError(f"cannot write {dest}: {exc}", path=str(dest)) from exc
        return ObjectInfo(sha256, size)

    def verify(self, sha256: str) -> ObjectInfo:
        path = self.object_path(require_sha256(sha256))
        try:
            actual, size = sha256_file(path)
        except FileNotFoundError:
            raise NotFound(f"object {sha256} not found", sha256=sha256) from None
        if actual != sha256:
            raise corrupt(sha256, actual, size, where=str(path))
        return ObjectInfo(sha256, size)

    def delete(self, sha256: str, *, reason: str) -> bool:
        check_reason(reason)
        path = self.object_path(require_sha256(sha256))
        log.warning("deleting object %s from %s: %s", sha256, self.url, reason)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        fsync_dir(path.parent)
        return True

    def iter_objects(self) -> Iterator[ObjectInfo]:
        base = self.root / OBJECTS_DIR
        shards = sorted(os.scandir(base), key=lambda e: e.name) if base.is_dir() else []
        for shard in shards:
            if not shard.is_dir():
                continue
            for entry in sorted(os.scandir(shard.path), key=lambda e: e.name):
                # Anything else here (a stray file) is not an object of this store.
                if is_sha256(entry.name) and entry.name[:2] == shard.name:
                    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                        yield ObjectInfo(entry.name, entry.stat().st_size)

    # -- named, create-only keys -----------------------------------------------------
    def put_key(self, key: str, data: bytes) -> None:
        final = self._key_path(key)
        try:
            _makedirs(self.root, final.parent)
        except (FileExistsError, NotADirectoryError):
            # A local directory cannot also be a key (S3 allows "a" next to "a/b").
            raise Conflict(f"key {key!r} lies under an existing key", key=key) from None
        tmp = self._write_tmp(lambda f: f.write(data))
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise Conflict(f"key {key!r} already exists", key=key) from None
        except OSError as exc:
            raise StorageError(f"cannot create key {key!r}: {exc}", key=key) from exc
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(final.parent)

    def get_key(self, key: str) -> bytes:
        path = self._key_path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(f"key {key!r} not found", key=key) from None

    def key_exists(self, key: str) -> bool:
        return self._key_path(key).is_file()

    def list_keys(self, prefix: str) -> list[str]:
        # Walk only the directory the prefix pins down, never objects/ or .tmp/.
        start = prefix.rpartition("/")[0]
        if start:
            try:
                check_key(start)
            except InvalidInput:
                return []  # no valid key lies under an invalid directory
        top = self.root / start if start else self.root
        if not top.is_dir():
            return []
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d not in (OBJECTS_DIR, _TMP_DIR)]
                rel_dir = ""
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                key = f"{rel_dir}/{name}" if rel_dir else name
                if key.startswith(prefix) and not name.startswith("."):
                    keys.append(key)
        return sorted(keys)

    # -- maintenance -----------------------------------------------------------------
    def clean_tmp(self, older_than_s: float = 3600.0) -> int:
        """Remove temp files a crashed writer left behind; return how many.

        Only files older than ``older_than_s`` go, so writers in flight keep theirs.
        """
        tmp_dir = self.root / _TMP_DIR
        if not tmp_dir.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for entry in os.scandir(tmp_dir):
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
        return removed

    # -- internals -------------------------------------------------------------------
    def _write_tmp(self, write: Callable[[BinaryIO], object]) -> Path:
        """Create a fresh temp file, fill it with ``write(file)``, fsync it."""
        tmp = self.root / _TMP_DIR / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            tmp.parent.mkdir(parents=True, exist_ok=True)
            # O_EXCL: a temp name is never shared, even with a writer on another host.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"cannot write under {self.root}: {exc}", path=str(tmp)) from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _publish(self, tmp: Path, sha256: str, size: int) -> PutResult:
        """Link a verified temp file to its object name; the temp file always goes."""
        final = self.object_path(sha256)
        try:
            _makedirs(self.root, final.parent)
            os.link(tmp, final)
        except FileExistsError:
            # Another writer won the race: same address, so the same bytes (checked).
            existing = self._existing(sha256, size)
            if existing is None:  # deleted between link() and the check: retry once
                return self._publish(tmp, sha256, size)
            return existing
        except OSError as exc:
            raise StorageError(f"cannot store object {sha256}: {exc}", sha256=sha256) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        fsync_dir(final.parent)
        return PutResult(ObjectInfo(sha256, size), created=True)

    def _existing(self, sha256: str, size: int) -> PutResult | None:
        """A created=False result if the object is stored (checked), else None."""
        info = self.head(sha256)
        if info is None:
            return None
        if info.size != size:
            raise ChecksumMismatch(
                f"stored object {sha256} has {info.size} bytes, its content has {size}",
                sha256=sha256,
                expected_size=size,
                actual_size=info.size,
                where=str(self.object_path(sha256)),
            )
        if self.verify_existing or size <= _CHEAP_VERIFY_BYTES:
            self.verify(sha256)
        return PutResult(info, created=False)


def _file_size(path: str | Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        raise NotFound(f"file {path} not found", path=str(path)) from None


def _read(path: Path, sha256: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"object {sha256} not found", sha256=sha256) from None


def _makedirs(root: Path, directory: Path) -> None:
    """Create ``directory`` (under ``root``) and fsync each parent that gained an entry."""
    root.mkdir(parents=True, exist_ok=True)
    missing: list[Path] = []
    d = directory
    while d != root and not d.is_dir():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        # A concurrent writer may have made it; fsync the parent anyway, since that
        # writer may not have got to its own fsync before our link() relies on it.
        d.mkdir(exist_ok=True)
        fsync_dir(d.parent)
