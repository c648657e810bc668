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
* **Verification by content.** A stored SHA-256 is only as good as the endpoint that
  keeps it: moto (and some S3-compatible servers) store whatever checksum a client
  sends without checking it, so a corrupt object can carry the "right" one. ``verify``
  therefore trusts ``HeadObject``'s checksum only once the endpoint has *proven* that it
  computes checksums itself: a probe PUT (once per store, to a throw-away key under
  ``_vidlake/``) sends a deliberately wrong SHA-256, and only an endpoint that refuses
  it (``BadDigest``, as AWS S3 does) is trusted (``checksums_proven``). An endpoint
  that accepts it (the probe object is deleted again), or a probe that fails in any
  other way (a read-only credential), proves nothing: then every ``verify`` reads the
  object in full and hashes it. Even a trusted checksum counts only when it covers the
  whole object: ``ChecksumType`` is ``FULL_OBJECT``, or, where the endpoint reports no
  type, the object came from a single PUT (its ETag has no ``-N`` part count and the
  value no ``-N`` suffix). A composite multipart checksum or an ETag is never taken as
  a content hash.
* **Retries.** botocore's ``standard`` (or ``adaptive``) retry mode backs off on
  throttling, 5xx and connection errors.

Connection settings follow boto3: the default credential chain, ``AWS_ENDPOINT_URL``
(or ``endpoint_url``), and path-style addressing with ``path_style=True`` or
``VIDLAKE_S3_PATH_STYLE=1``. The client is created on first use and dropped when the
store is pickled, so a store travels into DataLoader workers and forked processes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, NoReturn, TypeVar

from catalog.atomic import atomic_file
from catalog.errors import (
    ChecksumMismatch,
    Conflict,
    InvalidInput,
    NotFound,
    NotInstalled,
    StorageError,
    VidlakeError,
)
from catalog.hashing import CHUNK, is_sha256
from catalog.objects.base import (
    OBJECTS_DIR,
    ObjectInfo,
    ObjectStore,
    PutResult,
    check_key,
    log,
    object_key,
)
from catalog.objects.local import (
    _check_range,
    _check_reason,
    _check_supplied,
    _range_error,
)

__all__ = ["S3ObjectStore"]

MiB = 1024 * 1024
_MIN_PART = 5 * MiB  # S3's minimum size of every part but the last
_MAX_PARTS = 10_000
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})
_T = TypeVar("_T")


class S3ObjectStore(ObjectStore):
    """A content-addressed store in an S3 bucket, under an optional key prefix.

    Args:
        bucket: The bucket (it must exist).
        prefix: Key prefix of this store (``objects/`` and named keys live under it).
        endpoint_url: An S3-compatible endpoint; default ``AWS_ENDPOINT_URL`` or AWS.
        path_style: Path-style addressing; default ``VIDLAKE_S3_PATH_STYLE=1`` or
            botocore's automatic choice.
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
        retry_mode: Literal["standard", "adaptive"] = "standard",
        max_attempts: int = 8,
        verify_existing: bool = False,
    ) -> None:
        if not bucket or "/" in bucket:
            raise InvalidInput(f"invalid bucket name {bucket!r}", field="bucket")
        if part_size < _MIN_PART:
            raise InvalidInput(
                f"part_size must be at least {_MIN_PART} bytes (S3's minimum), got {part_size}",
                field="part_size",
            )
        if max_attempts < 1:
            raise InvalidInput("max_attempts must be at least 1", field="max_attempts")
        if multipart_threshold < 1:
            raise InvalidInput("multipart_threshold must be positive", field="multipart_threshold")
        if retry_mode not in ("standard", "adaptive"):
            raise InvalidInput(
                f"retry_mode must be 'standard' or 'adaptive', got {retry_mode!r}",
                field="retry_mode",
            )
        if path_style is None:
            path_style = os.environ.get("VIDLAKE_S3_PATH_STYLE", "").lower() in ("1", "true")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.path_style = path_style
        self.region_name = region_name
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.retry_mode: Literal["standard", "adaptive"] = retry_mode
        self.max_attempts = max_attempts
        self.verify_existing = verify_existing
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client: Any = None
        self._client_pid = 0
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()
        self._checksums_proven: bool | None = None

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
                    self._client = self._make_client()
                    self._client_pid = pid
        return self._client

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover - boto3 is a core dependency
            raise NotInstalled("the S3 object store needs boto3: pip install boto3") from exc
        config = Config(
            retries={"total_max_attempts": self.max_attempts, "mode": self.retry_mode},
            s3={"addressing_style": "path" if self.path_style else "auto"},
            max_pool_connections=32,
            connect_timeout=10,
            read_timeout=120,
        )
        # A session per client: boto3's default session is not thread-safe to create from.
        session = boto3.session.Session()
        return session.client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region_name, config=config
        )

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
        _check_supplied(sha256, actual, len(data))
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
        actual = _hash_file(path)
        _check_supplied(sha256, actual, size)
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
            raise _mismatch(sha256, actual, size, key)
        return b"".join(chunks)

    def get_range(self, sha256: str, offset: int, length: int) -> bytes:
        _check_range(offset, length)
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
            raise _range_error(sha256, offset, length, info.size if info else 0) from exc
        data: bytes = self._call("get", key, resp["Body"].read)
        if len(data) != length:  # S3 truncates a range that runs past the end
            raise _range_error(sha256, offset, length, _total_from_range(resp, len(data)))
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
                raise _mismatch(sha256, actual, size, key)
        return ObjectInfo(sha256, size)

    def verify(self, sha256: str) -> ObjectInfo:
        """Prove the stored bytes hash to ``sha256``: by the endpoint's full-object
        SHA-256 where :attr:`checksums_proven`, else by a full read (module docstring)."""
        key = self.key_of(sha256)
        resp = self._call(
            "head",
            key,
            lambda: self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"),
        )
        size = int(resp["ContentLength"])
        stored = _full_object_sha256(resp)
        if stored is not None and self.checksums_proven:
            if stored != sha256:
                raise _mismatch(sha256, stored, size, key)
            return ObjectInfo(sha256, size)
        actual, size = self._read_all(key)
        if actual != sha256:
            raise _mismatch(sha256, actual, size, key)
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
        """PUT a small body with a wrong SHA-256: True only if the endpoint refuses it."""
        from botocore.exceptions import BotoCoreError, ClientError

        name = f"{self._probe_dir}/{uuid.uuid4().hex}"
        key = f"{self.prefix}/{name}" if self.prefix else name
        body = f"vidlake checksum probe {name}".encode()
        wrong = hashlib.sha256(body + b"!").digest()
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                IfNoneMatch="*",
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=_b64(wrong),
            )
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _DIGEST_CODES:
                log.info("%s checks client checksums: verify trusts its SHA-256", self.url)
                return True
            log.warning(
                "checksum probe on %s failed (%s): verify reads every object in full",
                self.url,
                code or exc,
            )
            return False
        except BotoCoreError as exc:
            log.warning("checksum probe on %s failed (%s): verify reads in full", self.url, exc)
            return False
        log.warning(
            "%s stored a body whose SHA-256 it was told wrongly: it does not check client "
            "checksums, so verify reads every object in full",
            self.url,
        )
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError) as exc:  # harmless garbage; say where it is
            log.warning("could not delete the checksum probe %s: %s", key, exc)
        return False

    def delete(self, sha256: str, *, reason: str) -> bool:
        _check_reason(reason)
        key = self.key_of(sha256)
        existed = self.head(sha256) is not None
        log.warning("deleting object %s from %s: %s", sha256, self.url, reason)
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))
        # In a versioned bucket that only added a delete marker; a takedown must erase
        # the bytes, so every version of the key goes (an unversioned bucket lists none).
        pages = self.client.get_paginator("list_object_versions").paginate(
            Bucket=self.bucket, Prefix=key
        )
        versions = self._call(
            "delete",
            key,
            lambda: [
                v["VersionId"]
                for page in pages
                for v in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
                if v["Key"] == key
            ],
        )
        for version in versions:
            erase = functools.partial(
                self.client.delete_object, Bucket=self.bucket, Key=key, VersionId=version
            )
            self._call("delete", key, erase)
        return existed or bool(versions)

    def abort_uploads(self, sha256: str) -> int:
        key = self.key_of(sha256)
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=key
        )
        uploads = self._call(
            "delete",
            key,
            lambda: [u["UploadId"] for p in pages for u in p.get("Uploads", []) if u["Key"] == key],
        )
        for upload_id in uploads:
            abort = functools.partial(
                self.client.abort_multipart_upload, Bucket=self.bucket, Key=key, UploadId=upload_id
            )
            self._call("delete", key, abort)
        return len(uploads)

    def iter_objects(self) -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/{OBJECTS_DIR}/" if self.prefix else f"{OBJECTS_DIR}/"
        for item in self._list(base):
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
            except _Exists:
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

    def list_keys(self, prefix: str) -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        # One delimited listing of the top level, so that objects/ is never enumerated.
        top_level = self._list(root, delimiter="/", prefixes=True)
        for item in top_level:
            name = item["Key"][len(root) :]
            if name.endswith("/"):
                if name == f"{OBJECTS_DIR}/" or not (
                    name.startswith(prefix) or prefix.startswith(name)
                ):
                    continue
                sub = root + (prefix if prefix.startswith(name) else name)
                keys.extend(i["Key"][len(root) :] for i in self._list(sub))
            elif name.startswith(prefix):
                keys.append(name)
        return sorted(k for k in keys if _valid_key(k))

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
                ChecksumSHA256=_b64(sha256_digest),
            ),
        )

    def _conditional_put(
        self, key: str, sha256: str, size: int, attempt: Callable[[], bool]
    ) -> PutResult:
        """Run a conditional upload; a 412 turns into a checked created=False result."""

        def once() -> PutResult:
            try:
                attempt()
            except _Exists:
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
            except (_Retry, _ConcurrentWrite):
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
        stored = _full_object_sha256(resp)
        if stored is not None and stored != sha256:
            raise _mismatch(sha256, stored, size, key)
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
        return self._conditional_put(
            key, sha256, size, lambda: self._multipart(open_source, what, key, sha256, size)
        )

    def _multipart(
        self, open_source: Callable[[], BinaryIO], what: str, key: str, sha256: str, size: int
    ) -> bool:
        """Upload in parts, one part in memory at a time, re-hashing what is sent; the
        completion is conditional (``If-None-Match: *``)."""
        part_size = max(self.part_size, math.ceil(size / _MAX_PARTS))
        resp = self._call(
            "put",
            key,
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256"
            ),
        )
        upload_id = resp["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            digest = hashlib.sha256()
            sent = 0
            with open_source() as f:
                while chunk := f.read(part_size):
                    digest.update(chunk)
                    sent += len(chunk)
                    parts.append(self._upload_part(key, upload_id, len(parts) + 1, chunk))
            if digest.hexdigest() != sha256 or sent != size:
                raise ChecksumMismatch(
                    f"{what} changed while it was uploaded (expected {sha256}, {size} bytes)",
                    sha256=sha256,
                    actual=digest.hexdigest(),
                    source=what,
                )
            self._call(
                "put",
                key,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    IfNoneMatch="*",
                ),
            )
        except BaseException:
            # An unfinished upload is invisible but billed: abort it, best effort.
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception as exc:
                log.warning("could not abort multipart upload of %s: %s", key, exc)
            raise
        return True

    def _upload_part(self, key: str, upload_id: str, number: int, chunk: bytes) -> dict[str, Any]:
        checksum = _b64(hashlib.sha256(chunk).digest())
        resp = self._call(
            "put",
            key,
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=chunk,
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=checksum,
            ),
        )
        return {"PartNumber": number, "ETag": resp["ETag"], "ChecksumSHA256": checksum}

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
                if n == tries - 1 or not _is_stream_error(exc):
                    self._translate(exc, "get", key)
                log.warning("reading %s broke off (%s); starting over", key, exc)
                if reset is not None:
                    reset()
                continue
            return digest.hexdigest(), size
        raise AssertionError("unreachable")  # pragma: no cover

    def _list(
        self, prefix: str, delimiter: str = "", prefixes: bool = False
    ) -> Iterator[dict[str, Any]]:
        """List keys under ``prefix``; with ``prefixes``, common prefixes come as keys too."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(**kwargs):
                yield from page.get("Contents", [])
                if prefixes:
                    for common in page.get("CommonPrefixes", []):
                        yield {"Key": common["Prefix"], "Size": 0}
        except VidlakeError:
            raise
        except Exception as exc:
            self._translate(exc, "list", prefix)

    def _call(self, op: str, key: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except VidlakeError:
            raise
        except Exception as exc:
            self._translate(exc, op, key)

    def _translate(self, exc: Exception, op: str, key: str) -> NoReturn:
        """Turn a botocore error into ours; the one place that knows botocore's shapes."""
        from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError

        where = f"s3://{self.bucket}/{key}"
        name = key.rpartition("/")[2]
        sha = {"sha256": name} if is_sha256(name) and key == self.key_of(name) else {}
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code == "NoSuchBucket":
                raise StorageError(
                    f"bucket {self.bucket!r} does not exist", bucket=self.bucket, code=code
                ) from exc
            if code in _NOT_FOUND_CODES or (status == 404 and op != "list"):
                raise NotFound(f"{where} not found", key=key, **sha) from exc
            if code == "PreconditionFailed" or status == 412:
                raise _Exists(key) from exc
            if code == "ConditionalRequestConflict" or status == 409:
                raise _ConcurrentWrite(key) from exc
            if code in _DIGEST_CODES:
                raise ChecksumMismatch(
                    f"the endpoint rejected the bytes of {where}: {code}", key=key, code=code
                ) from exc
            raise StorageError(
                f"S3 {op} of {where} failed: {code} {err.get('Message', '')}".rstrip(),
                key=key,
                code=code,
                status=status,
            ) from exc
        if isinstance(exc, FlexibleChecksumError):
            raise ChecksumMismatch(
                f"{where} failed its transfer checksum: {exc}", key=key, **sha
            ) from exc
        if isinstance(exc, BotoCoreError | OSError):
            raise StorageError(f"S3 {op} of {where} failed: {exc}", key=key) from exc
        raise exc


class _Exists(Conflict):
    """A 412 on a conditional write: the key exists (internal; put_* resolves it)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key!r} already exists", key=key)


class _ConcurrentWrite(Conflict):
    """A 409 ConditionalRequestConflict: retried, then reported as Conflict."""

    def __init__(self, key: str) -> None:
        super().__init__(f"a concurrent conditional write to {key!r} is in flight", key=key)


class _Retry(Exception):
    """Internal: try the conditional write again."""


def _full_object_sha256(head: dict[str, Any]) -> str | None:
    """The hex SHA-256 of the whole object from a HeadObject response, if it has one.

    Composite (multipart) checksums and ETags never qualify (see the module docstring).
    """
    value = head.get("ChecksumSHA256")
    if not value:
        return None
    kind = head.get("ChecksumType")
    if kind is not None:
        if kind != "FULL_OBJECT":
            return None
    elif "-" in value or "-" in str(head.get("ETag", "")).strip('"'):
        return None  # no type reported: trust only a single-PUT object's checksum
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _hash_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _mismatch(sha256: str, actual: str, size: int, key: str) -> ChecksumMismatch:
    return ChecksumMismatch(
        f"object {sha256} is corrupt: its {size} bytes hash to {actual}",
        sha256=sha256,
        actual=actual,
        size=size,
        key=key,
    )


def _total_from_range(resp: dict[str, Any], got: int) -> int:
    total = str(resp.get("ContentRange", "")).rpartition("/")[2]
    return int(total) if total.isdigit() else got


def _is_stream_error(exc: Exception) -> bool:
    from botocore.exceptions import (
        ConnectionClosedError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    return isinstance(
        exc, ConnectionClosedError | IncompleteReadError | ReadTimeoutError | ResponseStreamingError
    )


def _valid_key(key: str) -> bool:
    try:
        check_key(key)
    except InvalidInput:
        return False
    return True
