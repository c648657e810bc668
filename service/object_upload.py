"""Object bytes uploaded over REST: what ``PUT /v1/objects/{sha256}`` does.

The body is streamed into a temp file under ``<home>/service/uploads`` while it is
hashed and counted, never held in memory. Then:

* over ``max_object_bytes`` (declared or streamed): 413, the temp file removed;
* a SHA-256 other than the one in the path: 422 ``hash_mismatch``, nothing stored;
* else the file goes into the store with ``put_file`` (the S3 store takes its
  multipart path above its threshold), and the answer says whether this call
  created the object (201) or found it present (200).

A temp file a crashed upload left is removed by a later upload once it has not been
written for :data:`STALE_S` (a live upload writes its file with every chunk).

An object already present is answered 200 before the body is read (content
addressing makes its bytes known), except an eval-only object the caller may not
see: its body is received and verified like a new one and answered 201, so that a
``write`` caller cannot probe which eval objects exist (``GET``/``HEAD`` answer 404).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from catalog.objects.refs import RefStore
from service.auth import Principal
from service.client_errors import HashMismatch
from service.deps import Services
from service.errors import PayloadTooLarge

__all__ = ["STALE_S", "HashMismatch", "ObjectPutPublic", "receive_object"]

#: Seconds after which an upload's temp file no one writes is a crash's leftover.
STALE_S = 3600.0
_PREFIX = ".upload-"


class ObjectPutPublic(BaseModel):
    """An uploaded object: its SHA-256, its size, and whether this upload stored it."""

    model_config = ConfigDict(extra="forbid")

    sha256: str
    size: int = Field(description="Bytes of the object")
    created: bool = Field(description="False: the object was already stored")


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the object is larger than {limit} bytes (max_object_bytes)",
        limit=limit,
        what="object_bytes",
    )


def _visible(services: Services, principal: Principal, sha256: str) -> bool:
    return principal.sees_eval or not services.eval_objects.hidden(sha256, services.pin())


def _remove_stale(directory: Path) -> None:
    cutoff = time.time() - STALE_S
    for path in directory.glob(_PREFIX + "*"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < cutoff:
                path.unlink()


async def _spool(
    chunks: AsyncIterator[bytes], directory: Path, limit: int
) -> tuple[Path, str, int]:
    """The body in a temp file: its path, SHA-256 and size (removed on any failure)."""
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale(directory)
    fd, name = tempfile.mkstemp(dir=directory, prefix=_PREFIX)
    path = Path(name)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                digest.update(chunk)
                f.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, digest.hexdigest(), size


async def receive_object(
    services: Services,
    principal: Principal,
    sha256: str,
    chunks: AsyncIterator[bytes],
    declared: int | None,
) -> ObjectPutPublic:
    """Store the object ``chunks`` stream under ``sha256`` (see the module docstring).

    Raises:
        PayloadTooLarge: the body is over ``max_object_bytes`` (nothing stored).
        HashMismatch: the body's SHA-256 is not ``sha256`` (nothing stored).
    """
    limit = services.settings.max_object_bytes
    if declared is not None and declared > limit:
        raise _too_large(limit)
    info = await run_in_threadpool(RefStore(services.catalog.objects).head, sha256)
    visible = await run_in_threadpool(_visible, services, principal, sha256)
    if info is not None and visible:
        return ObjectPutPublic(sha256=sha256, size=info.size, created=False)
    path, actual, size = await _spool(chunks, services.service_dir / "uploads", limit)
    try:
        if actual != sha256:
            raise HashMismatch(
                f"the body's SHA-256 is {actual}, not {sha256}; nothing was stored",
                expected=sha256,
                actual=actual,
                size=size,
            )
        put = await run_in_threadpool(services.catalog.objects.put_file, path, sha256)
    finally:
        path.unlink(missing_ok=True)
    return ObjectPutPublic(sha256=sha256, size=put.info.size, created=put.created or not visible)
