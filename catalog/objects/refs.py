"""External object references: objects addressed by SHA-256 whose bytes live elsewhere.

Adopting a dataset "without copying a byte" (``vidlake import tar-shards``) registers
each TAR shard as an object that stays where its publisher put it: a local file, an S3
object or an HTTP(S) URL. The store records that fact in a create-only named key::

    refs/<sha256>.json    {"sha256": …, "size": …, "url": "file:///…" | "s3://b/k" | "https://…"}

Readers resolve an absent object through its reference:

* :func:`resolve_head` — the object's size (the stored object's, else the reference's),
  used by the catalog's latent ingest check, so a latent may point into a shard.
* :func:`resolve_range` — ``length`` bytes at ``offset``, unverified exactly like
  :meth:`ObjectStore.get_range` (callers check member SHA-256s before parsing).
* :func:`download_ref` — the whole referenced object, streamed to a temp file while
  hashed; a size or SHA-256 that differs from the reference raises
  :class:`ChecksumMismatch` and leaves nothing behind (the full-shard check). The
  failure is recorded as ``refs/failed/<sha256>.json`` so that the catalog side can
  quarantine what depends on it (:func:`interop.tar_import.quarantine_failed`).
* :func:`record_member_failure` / :func:`list_failed_members` — a packed member (one
  sample inside a shard or pack) whose bytes in the store failed their SHA-256, as the
  loader found it: ``refs/failed-members/<member sha256>.json`` (create-only). Loader
  ranks skip what it lists, and ``vidlake import tar-shards-verify`` quarantines the
  samples it names (:mod:`interop.corrupt`).

:class:`RefStore` wraps any store with those fallbacks for code that takes an
:class:`ObjectStore`. A reference never makes a stored object: ``iter_objects`` lists
only real objects, and ``delete`` of a referenced object erases nothing (the bytes are
not ours to erase; a hard takedown of adopted data must go to its publisher).

``s3://`` URLs are read with the store's :attr:`ObjectStore.s3_connection` (the
endpoint, path style and region it was opened with), through the one client factory
and error translator of :mod:`catalog.objects.s3_client`. This module imports only the
standard library (boto3 lazily for ``s3://``), so the loader may use it on a GPU node.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalog.atomic import atomic_file
from catalog.errors import ChecksumMismatch, Conflict, InvalidInput, NotFound, StorageError
from catalog.hashing import CHUNK, require_sha256
from catalog.objects.base import ObjectInfo, ObjectStore, PutResult
from catalog.objects.s3_client import S3Connection, guarded, shared_client, split_s3_url

__all__ = [
    "ObjectRef",
    "RefStore",
    "download_ref",
    "failed_key",
    "failed_member_key",
    "get_ref",
    "iter_url",
    "list_failed",
    "list_failed_members",
    "put_ref",
    "read_url_range",
    "record_member_failure",
    "ref_key",
    "resolve_head",
    "resolve_range",
    "url_size",
]

REFS_DIR = "refs"
_SCHEMES = ("file://", "s3://", "http://", "https://")


def ref_key(sha256: str) -> str:
    """The named key of the reference for object ``sha256``."""
    return f"{REFS_DIR}/{require_sha256(sha256)}.json"


def failed_key(sha256: str) -> str:
    """The named key recording that a referenced object failed its full check."""
    return f"{REFS_DIR}/failed/{require_sha256(sha256)}.json"


@dataclass(frozen=True)
class ObjectRef:
    """An object that lives outside the store: its address, exact size and URL."""

    sha256: str
    size: int
    url: str

    def __post_init__(self) -> None:
        require_sha256(self.sha256)
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 0:
            raise InvalidInput(f"reference size must be an int >= 0, got {self.size!r}")
        if not self.url.startswith(_SCHEMES):
            raise InvalidInput(
                f"reference URL must start with one of {_SCHEMES}, got {self.url!r}", url=self.url
            )

    def to_json(self) -> bytes:
        return json.dumps(
            {"sha256": self.sha256, "size": self.size, "url": self.url}, sort_keys=True
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ObjectRef:
        try:
            doc = json.loads(data)
            return cls(str(doc["sha256"]), doc["size"], str(doc["url"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"malformed object reference: {exc}") from exc


def put_ref(store: ObjectStore, ref: ObjectRef) -> bool:
    """Record ``ref`` (create-only). True if this call created it.

    An existing reference with the same SHA-256 and size stands (its URL wins: a
    reference is never rewritten); a different size is a Conflict.
    """
    try:
        store.put_key(ref_key(ref.sha256), ref.to_json())
        return True
    except Conflict:
        have = get_ref(store, ref.sha256)
        if have is None or have.size != ref.size:
            raise Conflict(
                f"object {ref.sha256} is already referenced with size "
                f"{have.size if have else '?'}, not {ref.size}",
                sha256=ref.sha256,
            ) from None
        return False


def get_ref(store: ObjectStore, sha256: str) -> ObjectRef | None:
    """The reference for ``sha256``, or None."""
    try:
        data = store.get_key(ref_key(sha256))
    except NotFound:
        return None
    ref = ObjectRef.from_json(data)
    if ref.sha256 != sha256:
        raise StorageError(f"reference {ref_key(sha256)} names {ref.sha256}", sha256=sha256)
    return ref


def resolve_head(store: ObjectStore, sha256: str) -> ObjectInfo | None:
    """``store.head(sha256)``, else the referenced size, else None."""
    info = store.head(sha256)
    if info is not None:
        return info
    ref = get_ref(store, sha256)
    return None if ref is None else ObjectInfo(sha256, ref.size)


def _require_ref(store: ObjectStore, sha256: str) -> ObjectRef:
    ref = get_ref(store, sha256)
    if ref is None:
        raise NotFound(f"object {sha256} is neither stored nor referenced", sha256=sha256)
    return ref


def resolve_range(store: ObjectStore, sha256: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of a stored or referenced object (unverified)."""
    try:
        return store.get_range(sha256, offset, length)
    except NotFound:
        ref = _require_ref(store, sha256)
    if offset < 0 or length < 0 or offset + length > ref.size:
        raise InvalidInput(
            f"range [{offset}, +{length}) passes the end of {sha256} ({ref.size} bytes)",
            sha256=sha256,
        )
    return read_url_range(ref.url, offset, length, store.s3_connection)


def download_ref(store: ObjectStore, sha256: str, dest: str | Path) -> ObjectInfo:
    """Stream referenced object ``sha256`` to ``dest`` through a verified temp file.

    Raises:
        NotFound: no reference.
        ChecksumMismatch: the bytes differ from the reference (recorded under
            :func:`failed_key`, so the catalog can quarantine what depends on them).
    """
    ref = _require_ref(store, sha256)
    dest = Path(dest)
    digest, size = hashlib.sha256(), 0
    with atomic_file(dest) as out:
        for chunk in iter_url(ref.url, store.s3_connection):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        actual = digest.hexdigest()
        if actual != sha256 or size != ref.size:
            record_failure(store, ref, actual, size)
            raise ChecksumMismatch(
                f"referenced object {sha256} at {ref.url}: {size} bytes hashing to {actual},"
                f" expected {ref.size} bytes",
                sha256=sha256,
                actual=actual,
                url=ref.url,
            )
    return ObjectInfo(sha256, size)


def record_failure(store: ObjectStore, ref: ObjectRef, actual: str, size: int) -> None:
    """Record (once; create-only) that ``ref``'s bytes failed their full check."""
    body = json.dumps(
        {"sha256": ref.sha256, "url": ref.url, "actual_sha256": actual, "actual_size": size},
        sort_keys=True,
    ).encode()
    with contextlib.suppress(Conflict):
        store.put_key(failed_key(ref.sha256), body)


def list_failed(store: ObjectStore) -> list[str]:
    """SHA-256s of referenced objects recorded as failing their full check."""
    prefix = f"{REFS_DIR}/failed/"
    return sorted(k.removeprefix(prefix).removesuffix(".json") for k in store.list_keys(prefix))


def failed_member_key(member_sha256: str) -> str:
    """The named key recording that packed member ``member_sha256`` failed its check."""
    return f"{REFS_DIR}/failed-members/{require_sha256(member_sha256)}.json"


def record_member_failure(store: ObjectStore, record: dict[str, Any]) -> bool:
    """Record (create-only) that ``record["member_sha256"]``'s stored bytes failed their
    SHA-256; True if this call created the record (an existing one stands)."""
    key = failed_member_key(str(record["member_sha256"]))
    try:
        store.put_key(key, json.dumps(record, sort_keys=True).encode())
    except Conflict:
        return False
    return True


def list_failed_members(store: ObjectStore) -> list[str]:
    """SHA-256s of packed members recorded as failing their check (sorted)."""
    prefix = f"{REFS_DIR}/failed-members/"
    return sorted(k.removeprefix(prefix).removesuffix(".json") for k in store.list_keys(prefix))


# -- reading URLs -------------------------------------------------------------------------
def _local(url: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))


def _s3_call(url: str, s3: S3Connection | None, call: Any) -> Any:
    """``call(client, bucket, key)`` for ``url`` on ``s3``, botocore errors translated."""
    bucket, key = split_s3_url(url)
    client = shared_client(s3 or S3Connection())
    return guarded("get", url, lambda: call(client, bucket, key), url=url)


def _http(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> Any:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        return urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            raise NotFound(f"{url}: HTTP 404", url=url) from None
        raise StorageError(f"{method} {url}: HTTP {exc.code}", url=url, status=exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        raise StorageError(f"{method} {url} failed: {exc}", url=url) from exc


def read_url_range(url: str, offset: int, length: int, s3: S3Connection | None = None) -> bytes:
    """``length`` bytes at ``offset`` of the file at ``url`` (short only at its end);
    ``s3`` says how to reach an ``s3://`` URL (default: boto3's own configuration).

    HTTP(S) servers must honour ``Range`` (206); one that answers 200 is refused rather
    than downloading a whole shard to read a header.
    """
    if length <= 0:
        return b""
    if url.startswith("file://"):
        try:
            with open(_local(url), "rb") as f:
                f.seek(offset)
                return f.read(length)
        except FileNotFoundError:
            raise NotFound(f"{url} does not exist", url=url) from None
    if url.startswith("s3://"):
        rng = f"bytes={offset}-{offset + length - 1}"
        resp = _s3_call(url, s3, lambda c, b, k: c.get_object(Bucket=b, Key=k, Range=rng))
        data: bytes = guarded("get", url, resp["Body"].read, url=url)
        return data
    with _http(url, {"Range": f"bytes={offset}-{offset + length - 1}"}) as resp:
        if resp.status != 206:
            raise StorageError(
                f"{url} ignored the Range header (HTTP {resp.status}); range reads are required",
                url=url,
            )
        body: bytes = resp.read()
        return body


def url_size(url: str, s3: S3Connection | None = None) -> int:
    """The size in bytes of the file at ``url`` (a stat, HEAD or HeadObject on ``s3``)."""
    if url.startswith("file://"):
        try:
            return _local(url).stat().st_size
        except FileNotFoundError:
            raise NotFound(f"{url} does not exist", url=url) from None
    if url.startswith("s3://"):
        head = _s3_call(url, s3, lambda c, b, k: c.head_object(Bucket=b, Key=k))
        return int(head["ContentLength"])
    with _http(url, method="HEAD") as resp:
        length = resp.headers.get("Content-Length")
    if length is None:
        raise StorageError(f"HEAD {url} gave no Content-Length", url=url)
    return int(length)


def iter_url(url: str, s3: S3Connection | None = None) -> Iterator[bytes]:
    """The whole file at ``url`` in chunks (streamed, never held in memory; ``s3`` as
    for :func:`read_url_range`)."""
    if url.startswith("file://"):
        try:
            f = open(_local(url), "rb")  # noqa: SIM115 - closed below, in the generator
        except FileNotFoundError:
            raise NotFound(f"{url} does not exist", url=url) from None
        with f:
            while chunk := f.read(CHUNK):
                yield chunk
        return
    if url.startswith("s3://"):
        resp = _s3_call(url, s3, lambda c, b, k: c.get_object(Bucket=b, Key=k))
        body = resp["Body"]
        while chunk := guarded("get", url, lambda: body.read(CHUNK), url=url):
            yield chunk
        return
    with _http(url) as resp:
        while chunk := resp.read(CHUNK):
            yield chunk


class RefStore(ObjectStore):
    """A store whose reads fall back to external references (see the module docstring).

    Writes, named keys, deletion and listing go to the wrapped store unchanged.
    """

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.s3_connection = inner.s3_connection

    def __repr__(self) -> str:
        return f"RefStore({self.inner!r})"

    def put_bytes(self, data: bytes, sha256: str | None = None) -> PutResult:
        return self.inner.put_bytes(data, sha256)

    def put_file(self, path: str | Path, sha256: str | None = None) -> PutResult:
        return self.inner.put_file(path, sha256)

    def head(self, sha256: str) -> ObjectInfo | None:
        return resolve_head(self.inner, sha256)

    def get(self, sha256: str) -> bytes:
        try:
            return self.inner.get(sha256)
        except NotFound:
            ref = _require_ref(self.inner, sha256)
        data = b"".join(iter_url(ref.url, self.s3_connection))
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256 or len(data) != ref.size:
            record_failure(self.inner, ref, actual, len(data))
            raise ChecksumMismatch(
                f"referenced object {sha256} hashes to {actual}", sha256=sha256, actual=actual
            )
        return data

    def get_range(self, sha256: str, offset: int, length: int) -> bytes:
        return resolve_range(self.inner, sha256, offset, length)

    def download(self, sha256: str, dest: str | Path) -> ObjectInfo:
        try:
            return self.inner.download(sha256, dest)
        except NotFound:
            return download_ref(self.inner, sha256, dest)

    def verify(self, sha256: str) -> ObjectInfo:
        if self.inner.head(sha256) is not None:
            return self.inner.verify(sha256)
        ref = _require_ref(self.inner, sha256)
        digest, size = hashlib.sha256(), 0
        for chunk in iter_url(ref.url, self.s3_connection):
            digest.update(chunk)
            size += len(chunk)
        if digest.hexdigest() != sha256 or size != ref.size:
            record_failure(self.inner, ref, digest.hexdigest(), size)
            raise ChecksumMismatch(
                f"referenced object {sha256} at {ref.url} does not verify",
                sha256=sha256,
                actual=digest.hexdigest(),
            )
        return ObjectInfo(sha256, size)

    def delete(self, sha256: str, *, reason: str) -> bool:
        return self.inner.delete(sha256, reason=reason)

    def abort_uploads(self, sha256: str) -> int:
        return self.inner.abort_uploads(sha256)

    def iter_objects(self) -> Iterator[ObjectInfo]:
        return self.inner.iter_objects()

    def put_key(self, key: str, data: bytes) -> None:
        self.inner.put_key(key, data)

    def get_key(self, key: str) -> bytes:
        return self.inner.get_key(key)

    def list_keys(self, prefix: str) -> list[str]:
        return self.inner.list_keys(prefix)
