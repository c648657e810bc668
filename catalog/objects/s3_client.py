"""The one place vidlake builds boto3 S3 clients and reads botocore's error shapes.

* :class:`S3Connection` — how to reach S3: endpoint, addressing style, region and
  retries. It is a plain frozen value, read from nowhere: the settings
  (:mod:`service.settings`) or a caller build it and pass it down. An unset endpoint
  or region is boto3's own choice (``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, the
  AWS config file); an unset path style is botocore's automatic addressing.
* :func:`make_client` builds a client for a connection; :func:`shared_client` keeps one
  per connection and process (boto3 clients are thread-safe, not fork-safe).
* :func:`translate` turns a botocore (or socket) error into vidlake's tree:
  ``NoSuchBucket`` → :class:`StorageError`, 404 → :class:`NotFound`, 412 →
  :class:`KeyExists`, 409 → :class:`WriteInFlight` (both :class:`Conflict`), a digest
  error → :class:`ChecksumMismatch`, anything else → :class:`StorageError` with S3's
  error ``code`` and HTTP ``status`` in its details.

boto3 is imported lazily, so that importing this module costs nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from catalog.errors import (
    ChecksumMismatch,
    Conflict,
    InvalidInput,
    NotFound,
    NotInstalled,
    StorageError,
    VidlakeError,
)

__all__ = [
    "DIGEST_CODES",
    "KeyExists",
    "S3Connection",
    "WriteInFlight",
    "guarded",
    "is_stream_error",
    "make_client",
    "shared_client",
    "split_s3_url",
    "translate",
]

RetryMode = Literal["standard", "adaptive"]
_T = TypeVar("_T")

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
#: Codes with which an endpoint refuses bytes that do not match their checksum.
DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})


@dataclass(frozen=True)
class S3Connection:
    """How to reach an S3 (or S3-compatible) endpoint.

    Args:
        endpoint_url: An S3-compatible endpoint; None is boto3's (``AWS_ENDPOINT_URL``,
            else AWS).
        path_style: True for path-style addressing, False for botocore's automatic
            choice, None to leave it to botocore's configuration.
        region_name: The region; None is boto3's (``AWS_DEFAULT_REGION``, config).
        retry_mode: botocore retry mode, ``"standard"`` or ``"adaptive"``.
        max_attempts: Attempts per request, including the first.
    """

    endpoint_url: str | None = None
    path_style: bool | None = None
    region_name: str | None = None
    retry_mode: RetryMode = "standard"
    max_attempts: int = 8

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidInput("max_attempts must be at least 1", field="max_attempts")
        if self.retry_mode not in ("standard", "adaptive"):
            raise InvalidInput(
                f"retry_mode must be 'standard' or 'adaptive', got {self.retry_mode!r}",
                field="retry_mode",
            )


def make_client(conn: S3Connection) -> Any:
    """A new boto3 S3 client for ``conn`` (a session of its own: boto3's default session
    is not thread-safe to create clients from)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is a core dependency
        raise NotInstalled("S3 access needs boto3: pip install boto3") from exc
    options: dict[str, Any] = {
        "retries": {"total_max_attempts": conn.max_attempts, "mode": conn.retry_mode},
        "max_pool_connections": 32,
        "connect_timeout": 10,
        "read_timeout": 120,
    }
    if conn.path_style is not None:
        options["s3"] = {"addressing_style": "path" if conn.path_style else "auto"}
    return boto3.session.Session().client(
        "s3", endpoint_url=conn.endpoint_url, region_name=conn.region_name, config=Config(**options)
    )


_SHARED: dict[S3Connection, tuple[int, Any]] = {}
_SHARED_LOCK = threading.Lock()


def shared_client(conn: S3Connection) -> Any:
    """The process's client for ``conn``, created on first use and again after a fork."""
    pid = os.getpid()
    with _SHARED_LOCK:
        owner, client = _SHARED.get(conn, (0, None))
        if client is None or owner != pid:
            client = make_client(conn)
            _SHARED[conn] = (pid, client)
        return client


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` → ``(bucket, key)``; InvalidInput when either is missing."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    if not url.startswith("s3://") or not bucket or not key:
        raise InvalidInput(f"not an s3://bucket/key URL: {url!r}", url=url)
    return bucket, key


class KeyExists(Conflict):
    """A 412 on a conditional (``If-None-Match: *``) write: the key exists."""


class WriteInFlight(Conflict):
    """A 409 ConditionalRequestConflict: a concurrent conditional write to the key."""


def translate(exc: BaseException, op: str, url: str, /, **context: Any) -> BaseException:
    """The vidlake error for botocore error ``exc`` of S3 operation ``op`` on ``url``.

    ``context`` (``key=``, ``sha256=``, ``url=``…) rides in the details of the result.
    Anything that is not a botocore or socket error comes back unchanged, so that
    callers can always ``raise translate(exc, …) from exc``.
    """
    from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError

    if isinstance(exc, ClientError):
        return _client_error(exc, op, url, context)
    if isinstance(exc, FlexibleChecksumError):
        return ChecksumMismatch(f"{url} failed its transfer checksum: {exc}", **context)
    if isinstance(exc, BotoCoreError | OSError):
        return StorageError(f"S3 {op} of {url} failed: {exc}", **context)
    return exc


def guarded(op: str, url: str, fn: Callable[[], _T], /, **context: Any) -> _T:
    """``fn()``, with any botocore error turned into vidlake's (see :func:`translate`)."""
    try:
        return fn()
    except VidlakeError:
        raise
    except Exception as exc:
        err = translate(exc, op, url, **context)
        if err is exc:
            raise
        raise err from exc


def _client_error(exc: Any, op: str, url: str, context: dict[str, Any]) -> BaseException:
    err = exc.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    if code == "NoSuchBucket":
        bucket = url.removeprefix("s3://").partition("/")[0]
        return StorageError(f"bucket {bucket!r} does not exist", bucket=bucket, code=code)
    if code in _NOT_FOUND_CODES or (status == 404 and op != "list"):
        return NotFound(f"{url} not found", **context)
    if code == "PreconditionFailed" or status == 412:
        return KeyExists(f"{url} already exists", **context)
    if code == "ConditionalRequestConflict" or status == 409:
        return WriteInFlight(f"a concurrent conditional write to {url} is in flight", **context)
    if code in DIGEST_CODES:
        return ChecksumMismatch(
            f"the endpoint rejected the bytes of {url}: {code}", code=code, **context
        )
    detail = f"{code} {err.get('Message', '')}".strip() or str(exc)
    return StorageError(f"S3 {op} of {url} failed: {detail}", code=code, status=status, **context)


def is_stream_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection that broke while a body streamed (which
    botocore's retries do not cover)."""
    from botocore.exceptions import (
        ConnectionClosedError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    return isinstance(
        exc, ConnectionClosedError | IncompleteReadError | ReadTimeoutError | ResponseStreamingError
    )
