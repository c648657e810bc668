"""Where a snapshot comes from: an object store or a vidlake service.

A :class:`SnapshotSource` answers four questions, each with verified bytes:

* ``snapshot_bytes(version)`` — the exact bytes of ``snapshot.json`` and their SHA-256.
  From a store: the registry key ``manifests/v{N:06d}.json`` names the document's
  SHA-256 and size, and the document is read by that address. From a service:
  ``GET /v1/snapshots/{v}``, checked against its ``X-Vidlake-SHA256`` header.
* ``download_artifact(version, name, dest)`` — an artifact (``plan.arrow`` …) streamed
  to ``dest``. The caller (:mod:`loader.plan`) hashes it against ``snapshot.json``.
* ``fetch_object(sha256, dest)`` / ``fetch_member(...)`` — latent bytes for the node
  cache: a whole object, or a byte range whose SHA-256 is checked *before* it is
  written (a packed member).
* ``failed_members()`` / ``record_failed_member(record)`` — the shared record of packed
  members whose stored bytes failed their SHA-256 (``refs/failed-members/`` in a store,
  :mod:`catalog.objects.refs`), which decides the loader's corrupt-member skips. A
  service source holds none and records none (the rank logs the failure instead).

Sources hold no live connection: the store creates its client lazily, the HTTP source
uses one ``urllib`` request per call. Both pickle into DataLoader workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, Any

from catalog.atomic import atomic_path
from catalog.errors import (
    ChecksumMismatch,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    StorageError,
    Unauthorized,
    VidlakeError,
)
from catalog.hashing import CHUNK, require_sha256, sha256_bytes
from catalog.objects import ObjectStore, open_store
from catalog.objects.refs import (
    download_ref,
    get_ref,
    list_failed_members,
    record_member_failure,
    resolve_range,
)
from manifests.format import erasure_prefix, erasure_seq, registry_key

__all__ = ["HttpSource", "SnapshotSource", "StoreSource", "open_source"]

#: The response header that carries the SHA-256 of a served artifact or object.
SHA_HEADER = "X-Vidlake-SHA256"
#: Larger ranges are streamed to disk rather than read into memory first.
_IN_MEMORY_MAX = 64 << 20


class SnapshotSource(ABC):
    """Read access to published snapshots and the objects they reference."""

    #: A URL that reopens this source with :func:`open_source`.
    url: str

    @abstractmethod
    def snapshot_bytes(self, version: int) -> tuple[bytes, str]:
        """The exact bytes of version ``version``'s ``snapshot.json`` and their SHA-256.

        Raises:
            NotFound: the version is not published.
            ChecksumMismatch: the bytes do not hash to the registered SHA-256.
        """

    def erasure_bytes(self, version: int) -> bytes | None:
        """The latest erasure mark of ``version`` (``manifests.format``), or None if none.

        A source that cannot hold erasure marks has none (this default).
        """
        return None

    def failed_members(self) -> frozenset[str]:
        """SHA-256s of packed members recorded as failing their check; a source that
        cannot hold the record has none (this default)."""
        return frozenset()

    def record_failed_member(self, record: dict[str, Any]) -> bool:
        """Record a member whose stored bytes failed their SHA-256 (create-only); True
        if this call created the record, False if it existed or this source cannot
        record (this default)."""
        return False

    @abstractmethod
    def download_artifact(self, version: int, name: str, sha256: str, dest: Path) -> None:
        """Stream artifact ``name`` (stored as object ``sha256``) to ``dest``.

        ``dest`` is a private temp path; the caller verifies and renames it.
        """

    @abstractmethod
    def object_size(self, sha256: str) -> int:
        """The size of a stored object (NotFound when absent)."""

    @abstractmethod
    def fetch_object(self, sha256: str, dest: Path) -> None:
        """Write the whole object ``sha256`` to ``dest``, verified against its address."""

    @abstractmethod
    def read_range(self, sha256: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of object ``sha256`` (unverified)."""

    def read_member(
        self, object_sha256: str, offset: int, length: int, member_sha256: str
    ) -> bytes:
        """A packed member's bytes, verified against ``member_sha256`` before returning."""
        data = self.read_range(object_sha256, offset, length)
        _check(data, member_sha256, length, what=f"member of {object_sha256}@{offset}")
        return data

    def fetch_member(
        self, object_sha256: str, offset: int, length: int, member_sha256: str, dest: Path
    ) -> None:
        """Write a verified member (whole object when the hashes coincide) to ``dest``."""
        if member_sha256 == object_sha256 and offset == 0:
            self.fetch_object(object_sha256, dest)
            return
        data = self.read_member(object_sha256, offset, length, member_sha256)
        with open(dest, "wb") as f:
            f.write(data)

    def fetch_range(self, sha256: str, offset: int, length: int, dest: Path) -> None:
        """Write ``length`` bytes at ``offset`` of object ``sha256`` to ``dest``, *unverified*.

        For callers that verify the file themselves before using it — the node cache
        hashes every download before it renames it into place — so that a byte is
        hashed once, not twice. The default reads the range into memory; sources
        override it to stream.
        """
        data = self.read_range(sha256, offset, length)
        with open(dest, "wb") as f:
            f.write(data)


def _check(data: bytes, sha256: str, size: int | None, *, what: str) -> None:
    if size is not None and len(data) != size:
        raise ChecksumMismatch(
            f"{what}: expected {size} bytes, got {len(data)}",
            sha256=sha256,
            expected_size=size,
            actual_size=len(data),
        )
    actual = sha256_bytes(data)
    if actual != sha256:
        raise ChecksumMismatch(
            f"{what}: SHA-256 {actual} does not match {sha256}", sha256=sha256, actual=actual
        )


class StoreSource(SnapshotSource):
    """Snapshots published into a content-addressed object store (local or S3)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.url = store.url

    def __repr__(self) -> str:
        return f"StoreSource({self.url!r})"

    def snapshot_bytes(self, version: int) -> tuple[bytes, str]:
        key = registry_key(version)
        try:
            entry = json.loads(self.store.get_key(key))
        except NotFound:
            raise NotFound(
                f"snapshot version {version} is not published", version=version
            ) from None
        except ValueError as exc:
            raise ChecksumMismatch(f"registry entry {key} is not JSON: {exc}", key=key) from exc
        if not isinstance(entry, dict) or "snapshot_sha256" not in entry:
            raise ChecksumMismatch(f"registry entry {key} names no snapshot_sha256", key=key)
        sha = require_sha256(entry["snapshot_sha256"], "snapshot_sha256")
        data = self.store.get(sha)
        size = entry.get("snapshot_size")
        _check(data, sha, size if isinstance(size, int) else None, what="snapshot.json")
        return data, sha

    def erasure_bytes(self, version: int) -> bytes | None:
        marks = [
            (seq, key)
            for key in self.store.list_keys(erasure_prefix(version))
            if (seq := erasure_seq(key, version)) is not None
        ]
        return self.store.get_key(max(marks)[1]) if marks else None

    def download_artifact(self, version: int, name: str, sha256: str, dest: Path) -> None:
        self.fetch_object(sha256, dest)

    def failed_members(self) -> frozenset[str]:
        return frozenset(list_failed_members(self.store))

    def record_failed_member(self, record: dict[str, Any]) -> bool:
        return record_member_failure(self.store, record)

    def object_size(self, sha256: str) -> int:
        info = self.store.head(sha256)
        if info is not None:
            return info.size
        ref = get_ref(self.store, sha256)  # adopted by reference (catalog.objects.refs)
        if ref is None:
            raise NotFound(f"object {sha256} is not in {self.url}", sha256=sha256)
        return ref.size

    def fetch_object(self, sha256: str, dest: Path) -> None:
        # Download to a fresh sibling name, then replace dest: a destination the caller
        # pre-created (a cache's temp file) never blocks download()'s own rename.
        with atomic_path(dest) as staging:
            try:
                self.store.download(sha256, staging)
            except NotFound:
                # An object adopted by reference (a TAR shard at its publisher's URL):
                # streamed and checked against its full SHA-256; a failure is recorded
                # for quarantine (catalog.objects.refs.download_ref).
                download_ref(self.store, sha256, staging)

    def read_range(self, sha256: str, offset: int, length: int) -> bytes:
        try:
            return self.store.get_range(sha256, offset, length)
        except NotFound:
            # Absent from the store: read through its external reference, if any
            # (NotFound again when there is none). Members are verified by the caller.
            return resolve_range(self.store, sha256, offset, length)

    def fetch_range(self, sha256: str, offset: int, length: int, dest: Path) -> None:
        if offset == 0 and length > _IN_MEMORY_MAX:
            # Too big to hold in memory: stream it (the store verifies it on the way).
            self.fetch_object(sha256, dest)
            if dest.stat().st_size == length:
                return
        super().fetch_range(sha256, offset, length, dest)


class HttpSource(SnapshotSource):
    """Snapshots served by a vidlake service (``http://host:port``), read with urllib.

    Endpoints used (documented in ``docs/loader.md``): ``GET /v1/snapshots/{v}``,
    ``GET /v1/snapshots/{v}/artifacts/{name}`` and ``GET /v1/objects/{sha256}``, the
    latter two with ``Range`` support and the ``X-Vidlake-SHA256`` header; ``GET|POST
    /v1/corrupt-members`` for the shared record of corrupt members.
    """

    def __init__(
        self, base_url: str, *, token: str | None = None, timeout_s: float = 60.0, retries: int = 3
    ) -> None:
        self.url = base_url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s
        self._retries = retries

    def __repr__(self) -> str:
        return f"HttpSource({self.url!r})"

    # -- transport ---------------------------------------------------------------------
    def _open(
        self,
        path: str,
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> Any:
        """Open ``path`` with retries on connection errors and 5xx; map the rest to ours."""
        req_headers = dict(headers or {})
        if self._token:
            req_headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(
            self.url + path, headers=req_headers, method=method, data=data
        )
        for attempt in range(self._retries + 1):
            try:
                return urllib.request.urlopen(request, timeout=self._timeout_s)
            except urllib.error.HTTPError as exc:
                body = exc.read()[:500].decode("utf-8", "replace")
                exc.close()
                if exc.code >= 500 and attempt < self._retries:
                    time.sleep(0.2 * 2**attempt)
                    continue
                raise _http_error(exc.code, path, body) from None
            except (urllib.error.URLError, OSError) as exc:
                if attempt < self._retries:
                    time.sleep(0.2 * 2**attempt)
                    continue
                raise StorageError(f"GET {self.url}{path} failed: {exc}", url=self.url) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def failed_members(self) -> frozenset[str]:
        try:
            body, _ = self._get_bytes("/v1/corrupt-members")
        except NotFound:  # a service from before the record: it holds none
            return frozenset()
        return frozenset(json.loads(body)["members"])

    def record_failed_member(self, record: dict[str, Any]) -> bool:
        """Report the member to the service, which records it only if its own read
        fails too; a 409 (it verifies there) is :class:`Conflict`."""
        data = json.dumps(record).encode()
        headers = {"Content-Type": "application/json"}
        try:
            with self._open("/v1/corrupt-members", method="POST", headers=headers, data=data) as r:
                return bool(json.loads(r.read())["recorded"])
        except InvalidInput as exc:
            if exc.details.get("status") == 409:
                raise Conflict(exc.message, **exc.details) from None
            raise

    def _get_bytes(self, path: str, headers: dict[str, str] | None = None) -> tuple[bytes, Any]:
        with self._open(path, headers=headers) as resp:
            return resp.read(), resp.headers

    def _stream_to(self, path: str, dest: Path) -> tuple[str, int, str | None]:
        """Stream ``path`` to ``dest``; return (sha256, size, the header's SHA-256)."""
        h = hashlib.sha256()
        n = 0
        with self._open(path) as resp, open(dest, "wb") as out:
            header = resp.headers.get(SHA_HEADER)
            while chunk := resp.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
        return h.hexdigest(), n, header

    # -- SnapshotSource ----------------------------------------------------------------
    def snapshot_bytes(self, version: int) -> tuple[bytes, str]:
        data, headers = self._get_bytes(f"/v1/snapshots/{version}")
        header = headers.get(SHA_HEADER)
        actual = sha256_bytes(data)
        if header is not None and header.lower() != actual:
            raise ChecksumMismatch(
                f"snapshot.json of version {version}: body hashes to {actual}, "
                f"header says {header}",
                sha256=header,
                actual=actual,
            )
        if header is None:
            doc = json.loads(data)
            if isinstance(doc, dict) and "artifacts" not in doc and "snapshot" in doc:
                # A wrapped document without its stored bytes: re-serialise it
                # canonically; the artifacts it names are still checked by SHA-256.
                data = json.dumps(doc["snapshot"], sort_keys=True).encode()
                actual = sha256_bytes(data)
        return data, actual

    def erasure_bytes(self, version: int) -> bytes | None:
        try:
            data, _ = self._get_bytes(f"/v1/snapshots/{version}/erasure")
        except NotFound:
            return None
        return data

    def download_artifact(self, version: int, name: str, sha256: str, dest: Path) -> None:
        _, _, header = self._stream_to(f"/v1/snapshots/{version}/artifacts/{name}", dest)
        if header is not None and header.lower() != sha256:
            raise ChecksumMismatch(
                f"{name} of version {version}: server says {header}, snapshot.json says {sha256}",
                sha256=sha256,
                actual=header,
            )

    def object_size(self, sha256: str) -> int:
        # A one-byte Range GET: its Content-Range names the total (no HEAD route needed).
        require_sha256(sha256)
        with self._open(f"/v1/objects/{sha256}", headers={"Range": "bytes=0-0"}) as resp:
            total = (resp.headers.get("Content-Range") or "").rpartition("/")[2]
            length = resp.headers.get("Content-Length")
            size = total if resp.status == 206 else length
        if size is None or not size.isdigit():
            raise StorageError(f"GET /v1/objects/{sha256} gave no object size", sha256=sha256)
        return int(size)

    def fetch_object(self, sha256: str, dest: Path) -> None:
        require_sha256(sha256)
        actual, _, _ = self._stream_to(f"/v1/objects/{sha256}", dest)
        if actual != sha256:
            raise ChecksumMismatch(
                f"object {sha256} from {self.url} hashes to {actual}", sha256=sha256, actual=actual
            )

    def read_range(self, sha256: str, offset: int, length: int) -> bytes:
        require_sha256(sha256)
        if length == 0:
            return b""
        rng = {"Range": f"bytes={offset}-{offset + length - 1}"}
        with self._open(f"/v1/objects/{sha256}", headers=rng) as resp:
            status = resp.status
            data: bytes = resp.read() if status == 206 else _skip_read(resp, offset, length)
        return data

    def fetch_range(self, sha256: str, offset: int, length: int, dest: Path) -> None:
        require_sha256(sha256)
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"} if length else {}
        with self._open(f"/v1/objects/{sha256}", headers=headers) as resp, open(dest, "wb") as out:
            if resp.status != 206:
                _skip(resp, offset)
            remaining = length
            while remaining > 0 and (chunk := resp.read(min(remaining, CHUNK))):
                out.write(chunk)
                remaining -= len(chunk)


def _skip(resp: IO[bytes], n: int) -> None:
    while n > 0:
        chunk = resp.read(min(n, CHUNK))
        if not chunk:
            return
        n -= len(chunk)


def _skip_read(resp: IO[bytes], offset: int, length: int) -> bytes:
    """A server that ignored Range sent the whole object: keep only the asked window."""
    remaining = offset
    while remaining > 0:
        chunk = resp.read(min(remaining, CHUNK))
        if not chunk:
            break
        remaining -= len(chunk)
    return resp.read(length)


def _http_error(status: int, path: str, body: str) -> VidlakeError:
    message = f"GET {path}: HTTP {status}: {body}"
    if status == 404:
        return NotFound(message, status=status)
    if status == 401:
        return Unauthorized(message, status=status)
    if status == 403:
        return Forbidden(message, status=status)
    if 400 <= status < 500:
        return InvalidInput(message, status=status)
    return StorageError(message, status=status)


def open_source(
    source: str | os.PathLike[str] | SnapshotSource | ObjectStore,
    *,
    token: str | None = None,
    endpoint_url: str | None = None,
    path_style: bool | None = None,
) -> SnapshotSource:
    """Open a snapshot source.

    Args:
        source: ``http(s)://host:port`` for a vidlake service; ``s3://bucket/prefix``,
            ``file:///dir`` or a plain path for an object store; or an already open
            source or store.
        token: bearer token for a service.
        endpoint_url: S3-compatible endpoint (else ``AWS_ENDPOINT_URL``).
        path_style: S3 path-style addressing.

    Returns:
        A :class:`SnapshotSource`.
    """
    if isinstance(source, SnapshotSource):
        return source
    if isinstance(source, ObjectStore):
        return StoreSource(source)
    url = os.fspath(source)
    if url.startswith(("http://", "https://")):
        return HttpSource(url, token=token)
    return StoreSource(open_store(url, endpoint_url=endpoint_url, path_style=path_style))
