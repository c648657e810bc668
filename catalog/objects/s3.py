"""The S3 object store (boto3), for AWS S3 and S3-compatible endpoints.

What it relies on from the endpoint, and what it does where an endpoint falls short:

* **Conditional writes.** ``PutObject`` and ``CompleteMultipartUpload`` carry
  ``If-None-Match: *``. A 412 means the key exists: the existing object's size (and its
  full-object SHA-256 when the endpoint reports one) is checked and the put returns
  ``created=False``. A 409 (a concurrent conditional write in flight) is retried with
  backoff, then reported as :class:`Conflict`. moto 5.2.5 implements both conditions.
* **Server-side byte checks.** Single PUTs send ``ChecksumSHA256`` of the bytes and
  every multipart part sends its own, so AWS rejects bytes that changed in transit
  (400 ``BadDigest`` → :class:`ChecksumMismatch`). The upload is also re-hashed while it
  streams, so a file that changes under us never completes. (moto stores the
  checksum it is sent without checking it; the tests do not lean on that check.)
* **Verification by content.** ``verify`` trusts ``HeadObject``'s SHA-256 only once
  the endpoint has *proven* that it checks the checksums clients send (a probe once
  per store, ``checksums_proven``), and only a full-object one; otherwise it reads the
  object in full and hashes it (:mod:`catalog.objects.s3_checksums` says why).
* **Retries.** botocore's ``standard`` (or ``adaptive``) retry mode backs off on
  throttling, 5xx and connection errors.

Connection settings are an :class:`~catalog.objects.s3_client.S3Connection` (endpoint,
path style, region, retries) that the caller passes in; this module reads no setting
or environment variable of its own (boto3 still applies its credential chain and
``AWS_ENDPOINT_URL``). Multipart uploads are in :mod:`catalog.objects.s3_multipart`.
The client is created on first use and dropped when the store is pickled, so a store
travels into DataLoader workers and forked processes.

Why this module is longer than ~500 lines: it is one class, the whole
:class:`ObjectStore` contract on S3, whose short methods share the client, the key
prefix and the error context (splitting it would scatter one object's state). What
stands alone is elsewhere: the client factory and error translation
(``s3_client``), multipart uploads (``s3_multipart``), checksum trust (``s3_checksums``)
and listings (``s3_listing``).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from catalog.atomic import atomic_file
from catalog.errors import (
    ChecksumMismatch,
    Conflict,
    InvalidInput,
    NotFound,
    StorageError,
)
from catalog.hashing import CHUNK, is_sha256, sha256_file
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
from catalog.objects.s3_checksums import b64, full_object_sha256, probe_checksums
from catalog.objects.s3_client import (
    KeyExists,
    RetryMode,
    S3Connection,
    WriteInFlight,
    guarded,
    is_stream_error,
    make_client,
    translate,
)
from catalog.objects.s3_listing import list_under, named_keys, unfinished_uploads, versions_of
from catalog.objects.s3_multipart import MIN_PART, upload_multipart

__all__ = ["S3ObjectStore"]

MiB = 1024 * 1024
_T = TypeVar("_T")


class S3ObjectStore(ObjectStore):
    """A content-addressed store in an S3 bucket, under an optional key prefix.

    Args:
        bucket: The bucket (it must exist).
        prefix: Key prefix of this store (``objects/`` and named keys live under it).
        endpoint_url: An S3-compatible endpoint; default ``AWS_ENDPOINT_URL`` or AWS.
        path_style: Path-style addressing; default botocore's configured choice.
        region_name: The region; default boto3's (``AWS_DEFAULT_REGION``, config).
        multipart_threshold: Files larger than this go up as multipart uploads,
            streamed part by part (only one part is in memory at a time).
        part_size: Bytes per part (at least 5 MiB; grown so no upload needs more than
            10,000 parts).
        retry_mode: botocore retry mode, ``"standard"`` or ``"adaptive"``.
        max_attempts: Attempts per request, including the first.
        verify_existing: When a put finds its object already stored and the endpoint
            has no full-object checksum for it that it has proven it computes
            (:attr:`checksums_proven`), read it in full to check it (by default only
            its size, and any stored checksum, are checked).
    """

    #: Attempts and base backoff for a conditional write that meets a 409 (a concurrent
    #: conditional write to the same key in flight); botocore does not retry those.
    _conflict_attempts = 6
    _conflict_backoff_s = 0.05

    #: Where the checksum probe writes (outside ``objects/`` and outside the named-key
    #: alphabet's listings, which skip this folder).
    _probe_dir = "_vidlake/checksum-probe"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        path_style: bool | None = None,
        region_name: str | None = None,
        multipart_threshold: int = 64 * MiB,
        part_size: int = 16 * MiB,
        retry_mode: RetryMode = "standard",
        max_attempts: int = 8,
        verify_existing: bool = False,
    ) -> None:
        if not bucket or "/" in bucket:
            raise InvalidInput(f"invalid bucket name {bucket!r}", field="bucket")
        if part_size < MIN_PART:
            raise InvalidInput(
                f"part_size must be at least {MIN_PART} bytes (S3's minimum), got {part_size}",
                field="part_size",
            )
        if multipart_threshold < 1:
            raise InvalidInput("multipart_threshold must be positive", field="multipart_threshold")
        #: How this store reaches S3; references to ``s3://`` URLs are read the same way.
        self.s3_connection = S3Connection(
            endpoint_url=endpoint_url,
            path_style=path_style,
            region_name=region_name,
            retry_mode=retry_mode,
            max_attempts=max_attempts,
        )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.verify_existing = verify_existing
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client: Any = None
        self._client_pid = 0
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()
        self._checksums_proven: bool | None = None

    @property
    def endpoint_url(self) -> str | None:
        return self.s3_connection.endpoint_url

    @property
    def path_style(self) -> bool | None:
        return self.s3_connection.path_style

    @property
    def region_name(self) -> str | None:
        return self.s3_connection.region_name

    @property
    def retry_mode(self) -> RetryMode:
        return self.s3_connection.retry_mode

    @property
    def max_attempts(self) -> int:
        return self.s3_connection.max_attempts

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint_url: str | None = None,
        path_style: bool | None = None,
        **kwargs: Any,
    ) -> S3ObjectStore:
        """Open ``s3://bucket[/prefix]``; other arguments as for the constructor."""
        if not url.startswith("s3://"):
            raise InvalidInput(f"not an s3:// URL: {url!r}", field="url")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise InvalidInput(f"no bucket in {url!r}", field="url")
        return cls(bucket, prefix, endpoint_url=endpoint_url, path_style=path_style, **kwargs)

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url!r}, endpoint_url={self.endpoint_url!r})"

    # -- pickling: no live client crosses a process boundary ---------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_client_pid"] = 0
        del state["_lock"]
        del state["_probe_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 S3 client, created on first use (and again after a fork)."""
        pid = os.getpid()
        if self._client is None or self._client_pid != pid:
            with self._lock:
                if self._client is None or self._client_pid != pid:
                    self._client = make_client(self.s3_connection)
                    self._client_pid = pid
        return self._client

    # -- keys --------------------------------------------------------------------------
    def key_of(self, sha256: str) -> str:
        """The S3 key of object ``sha256``."""
        return object_key(self.prefix, sha256)

    def _named(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- content-addressed objects -----------------------------------------------------
    def put_bytes(self, data: bytes, sha256: str | None = None) -> PutResult:
        digest = hashlib.sha256(data)
        actual = digest.hexdigest()
        check_supplied(sha256, actual, len(data))
        key = self.key_of(actual)
        if len(data) > self.multipart_threshold:
            return self._put_large(lambda: io.BytesIO(data), "the data", actual, len(data))

        def attempt() -> bool:
            self._put_object(key, data, digest.digest())
            return True

        return self._conditional_put(key, actual, len(data), attempt)

    def put_file(self, path: str | Path, sha256: str | None = None) -> PutResult:
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise NotFound(f"file {path} not found", path=str(path)) from None
        if size <= self.multipart_threshold:
            # Small enough to hold: send exactly the bytes that were hashed.
            with open(path, "rb") as f:
                return self.put_bytes(f.read(), sha256)
        actual = sha256_file(path)[0]
        check_supplied(sha256, actual, size)
        return self._put_large(lambda: open(path, "rb"), str(path), actual, size)

    def head(self, sha256: str) -> ObjectInfo | None:
        key = self.key_of(sha256)
        try:
            resp = self._call(
                "head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=key)
            )
        except NotFound:
            return None
        return ObjectInfo(sha256, int(resp["ContentLength"]))

    def get(self, sha256: str) -> bytes:
        key = self.key_of(sha256)
        chunks: list[bytes] = []
        actual, size = self._read_all(key, chunks.append, chunks.clear)
        if actual != sha256:
            raise corrupt(sha256, actual, size, key=key)
        return b"".join(chunks)

    def get_range(self, sha256: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        key = self.key_of(sha256)
        if length == 0:  # S3 has no empty range; the object must still exist
            if self.head(sha256) is None:
                raise NotFound(f"object {sha256} not found", sha256=sha256, key=key)
            return b""
        rng = f"bytes={offset}-{offset + length - 1}"
        try:
            resp = self._call(
                "get",
                key,
                lambda: self.client.get_object(Bucket=self.bucket, Key=key, Range=rng),
            )
        except StorageError as exc:
            if exc.details.get("code") != "InvalidRange":
                raise
            info = self.head(sha256)
            raise range_error(sha256, offset, length, info.size if info else 0) from exc
        data: bytes = self._call("get", key, resp["Body"].read)
        if len(data) != length:  # S3 truncates a range that runs past the end
            raise range_error(sha256, offset, length, _total_from_range(resp, len(data)))
        return data

    def download(self, sha256: str, dest: str | Path) -> ObjectInfo:
        key = self.key_of(sha256)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(dest) as f:

            def reset() -> None:
                f.seek(0)
                f.truncate()

            actual, size = self._read_all(key, f.write, reset)
            if actual != sha256:
                raise corrupt(sha256, actual, size, key=key)
        return ObjectInfo(sha256, size)

    def verify(self, sha256: str) -> ObjectInfo:
        """Prove the stored bytes hash to ``sha256``: by the endpoint's full-object
        SHA-256 where :attr:`checksums_proven`, else by a full read (module docstring)."""
        key = self.key_of(sha256)
        if not self.checksums_proven:
            # No stored checksum would count: a HEAD first would only add a round trip.
            actual, size = self._read_all(key)
            if actual != sha256:
                raise corrupt(sha256, actual, size, key=key)
            return ObjectInfo(sha256, size)
        resp = self._call(
            "head",
            key,
            lambda: self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"),
        )
        size = int(resp["ContentLength"])
        stored = full_object_sha256(resp)
        if stored is not None:
            if stored != sha256:
                raise corrupt(sha256, stored, size, key=key)
            return ObjectInfo(sha256, size)
        actual, size = self._read_all(key)
        if actual != sha256:
            raise corrupt(sha256, actual, size, key=key)
        return ObjectInfo(sha256, size)

    @property
    def checksums_proven(self) -> bool:
        """Whether this endpoint has shown that it checks the SHA-256 a client sends
        (probed once per store; see the module docstring)."""
        if self._checksums_proven is None:
            with self._probe_lock:
                if self._checksums_proven is None:
                    self._checksums_proven = self._probe_checksums()
        return self._checksums_proven

    def _probe_checksums(self) -> bool:
        name = f"{self._probe_dir}/{uuid.uuid4().hex}"
        key = f"{self.prefix}/{name}" if self.prefix else name
        return probe_checksums(self.client, self.bucket, key, self.url)

    def delete(self, sha256: str, *, reason: str) -> bool:
        check_reason(reason)
        key = self.key_of(sha256)
        existed = self.head(sha256) is not None
        log.warning("deleting object %s from %s: %s", sha256, self.url, reason)
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))
        # In a versioned bucket that only added a delete marker; a takedown must erase
        # the bytes, so every version of the key goes (an unversioned bucket lists none).
        versions = versions_of(self.client, self.bucket, key)
        for version in versions:
            erase = functools.partial(
                self.client.delete_object, Bucket=self.bucket, Key=key, VersionId=version
            )
            self._call("delete", key, erase)
        return existed or bool(versions)

    def abort_uploads(self, sha256: str) -> int:
        key = self.key_of(sha256)
        uploads = unfinished_uploads(self.client, self.bucket, key)
        for upload_id in uploads:
            abort = functools.partial(
                self.client.abort_multipart_upload, Bucket=self.bucket, Key=key, UploadId=upload_id
            )
            self._call("delete", key, abort)
        return len(uploads)

    def iter_objects(self) -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/{OBJECTS_DIR}/" if self.prefix else f"{OBJECTS_DIR}/"
        for item in list_under(self.client, self.bucket, base):
            sha = item["Key"].rpartition("/")[2]
            # Anything else under objects/ (a stray key) is not an object of this store.
            if is_sha256(sha) and item["Key"] == self.key_of(sha):
                yield ObjectInfo(sha, int(item["Size"]))

    # -- named, create-only keys -------------------------------------------------------
    def put_key(self, key: str, data: bytes) -> None:
        full = self._named(key)

        def attempt() -> None:
            try:
                self._put_object(full, data, hashlib.sha256(data).digest())
            except KeyExists:
                raise Conflict(f"key {key!r} already exists", key=key) from None

        self._retry_conflicts(full, attempt)

    def get_key(self, key: str) -> bytes:
        full = self._named(key)
        try:
            resp = self._call(
                "get", full, lambda: self.client.get_object(Bucket=self.bucket, Key=full)
            )
            data: bytes = self._call("get", full, resp["Body"].read)
        except NotFound:
            raise NotFound(f"key {key!r} not found", key=key) from None
        return data

    def key_exists(self, key: str) -> bool:
        full = self._named(key)
        try:
            self._call("head", full, lambda: self.client.head_object(Bucket=self.bucket, Key=full))
        except NotFound:
            return False
        return True

    def key_etag(self, key: str) -> str:
        """The ETag S3 reports for named key ``key`` (NotFound when absent)."""
        full = self._named(key)
        head = self._call(
            "head", full, lambda: self.client.head_object(Bucket=self.bucket, Key=full)
        )
        return str(head.get("ETag", "")).strip('"')

    def list_keys(self, prefix: str) -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        return named_keys(self.client, self.bucket, root, prefix)

    # -- internals ---------------------------------------------------------------------
    def _put_object(self, key: str, data: bytes, sha256_digest: bytes) -> None:
        """A create-only PUT whose bytes the endpoint checks against their SHA-256."""
        self._call(
            "put",
            key,
            lambda: self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=data,
                IfNoneMatch="*",
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=b64(sha256_digest),
            ),
        )

    def _conditional_put(
        self, key: str, sha256: str, size: int, attempt: Callable[[], bool]
    ) -> PutResult:
        """Run a conditional upload; a 412 turns into a checked created=False result."""

        def once() -> PutResult:
            try:
                attempt()
            except KeyExists:
                existing = self._existing(key, sha256, size)
                if existing is None:  # deleted since the 412: the next attempt creates it
                    raise _Retry() from None
                return existing
            return PutResult(ObjectInfo(sha256, size), created=True)

        return self._retry_conflicts(key, once)

    def _retry_conflicts(self, key: str, attempt: Callable[[], _T]) -> _T:
        """Retry ``attempt`` on 409 ConditionalRequestConflict, with jittered backoff."""
        tries = self._conflict_attempts
        for n in range(tries):
            try:
                return attempt()
            except (_Retry, WriteInFlight):
                if n == tries - 1:
                    break
                time.sleep(min(2.0, self._conflict_backoff_s * 2**n) * (0.5 + random.random()))
        raise Conflict(
            f"conditional write of {key!r} kept conflicting with concurrent writers",
            key=key,
        )

    def _existing(self, key: str, sha256: str, size: int) -> PutResult | None:
        """A created=False result if ``key`` holds the object (checked), else None."""
        try:
            resp = self._call(
                "head",
                key,
                lambda: self.client.head_object(
                    Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"
                ),
            )
        except NotFound:
            return None
        stored_size = int(resp["ContentLength"])
        if stored_size != size:
            raise ChecksumMismatch(
                f"stored object {sha256} has {stored_size} bytes, its content has {size}",
                sha256=sha256,
                expected_size=size,
                actual_size=stored_size,
                key=key,
            )
        stored = full_object_sha256(resp)
        if stored is not None and stored != sha256:
            raise corrupt(sha256, stored, size, key=key)
        if self.verify_existing and (stored is None or not self.checksums_proven):
            self.verify(sha256)
        return PutResult(ObjectInfo(sha256, size), created=False)

    def _put_large(
        self, open_source: Callable[[], BinaryIO], what: str, sha256: str, size: int
    ) -> PutResult:
        key = self.key_of(sha256)
        # A large upload is worth a HEAD: skip it when the object is already there.
        existing = self._existing(key, sha256, size)
        if existing is not None:
            return existing

        def attempt() -> bool:
            upload_multipart(
                self._call,
                self.client,
                self.bucket,
                key,
                open_source,
                what=what,
                sha256=sha256,
                size=size,
                part_size=self.part_size,
            )
            return True

        return self._conditional_put(key, sha256, size, attempt)

    def _read_all(
        self,
        key: str,
        sink: Callable[[bytes], object] | None = None,
        reset: Callable[[], object] | None = None,
    ) -> tuple[str, int]:
        """Stream an object into ``sink``; return (SHA-256 hex, size).

        A connection that breaks mid-stream (which botocore's retries do not cover) is
        retried from the start, after ``reset()`` discards what ``sink`` got.
        """
        tries = 3
        for n in range(tries):
            digest = hashlib.sha256()
            size = 0
            resp = self._call(
                "get", key, lambda: self.client.get_object(Bucket=self.bucket, Key=key)
            )
            try:
                for chunk in resp["Body"].iter_chunks(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    if sink is not None:
                        sink(chunk)
            except Exception as exc:
                if n == tries - 1 or not is_stream_error(exc):
                    raise self._translated(exc, "get", key) from exc
                log.warning("reading %s broke off (%s); starting over", key, exc)
                if reset is not None:
                    reset()
                continue
            return digest.hexdigest(), size
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, op: str, key: str, fn: Callable[[], _T]) -> _T:
        """``fn()`` with botocore's errors translated (:func:`s3_client.translate`)."""
        return guarded(op, f"s3://{self.bucket}/{key}", fn, **self._context(key))

    def _translated(self, exc: BaseException, op: str, key: str) -> BaseException:
        return translate(exc, op, f"s3://{self.bucket}/{key}", **self._context(key))

    def _context(self, key: str) -> dict[str, str]:
        """The details of an error about ``key`` (its SHA-256 when it is an object)."""
        name = key.rpartition("/")[2]
        if is_sha256(name) and key == self.key_of(name):
            return {"key": key, "sha256": name}
        return {"key": key}


class _Retry(Exception):
    """Internal: try the conditional write again."""


def _total_from_range(resp: dict[str, Any], got: int) -> int:
    total = str(resp.get("ContentRange", "")).rpartition("/")[2]
    return int(total) if total.isdigit() else got
