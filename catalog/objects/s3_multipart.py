"""Multipart uploads of large objects to S3, one part in memory at a time.

Every part carries its own ``ChecksumSHA256``, so the endpoint refuses bytes that changed
in transit; the whole source is re-hashed while it streams, so a file that changes under
the upload never completes; the completion is conditional (``If-None-Match: *``), so an
object is never overwritten. An upload that fails is aborted (best effort: an unfinished
upload is invisible but billed).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any, BinaryIO

from catalog.errors import ChecksumMismatch
from catalog.objects.base import log
from catalog.objects.s3_checksums import b64

__all__ = ["MAX_PARTS", "MIN_PART", "Call", "part_size_for", "upload_multipart"]

MiB = 1024 * 1024
MIN_PART = 5 * MiB  # S3's minimum size of every part but the last
MAX_PARTS = 10_000

#: The store's guarded call: ``call(op, key, fn)`` runs ``fn`` with botocore errors
#: translated (:func:`catalog.objects.s3_client.guarded`).
Call = Callable[[str, str, Callable[[], Any]], Any]


def part_size_for(size: int, part_size: int) -> int:
    """``part_size``, grown so that ``size`` bytes need no more than 10,000 parts."""
    return max(part_size, math.ceil(size / MAX_PARTS))


def upload_multipart(
    call: Call,
    client: Any,
    bucket: str,
    key: str,
    open_source: Callable[[], BinaryIO],
    *,
    what: str,
    sha256: str,
    size: int,
    part_size: int,
) -> None:
    """Upload ``open_source()``'s bytes to ``key`` in parts; ``what`` names the source."""
    resp = call(
        "put",
        key,
        lambda: client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256"),
    )
    upload_id = resp["UploadId"]
    try:
        parts: list[dict[str, Any]] = []
        digest = hashlib.sha256()
        sent = 0
        with open_source() as f:
            while chunk := f.read(part_size_for(size, part_size)):
                digest.update(chunk)
                sent += len(chunk)
                parts.append(_upload_part(call, client, bucket, key, upload_id, parts, chunk))
        if digest.hexdigest() != sha256 or sent != size:
            raise ChecksumMismatch(
                f"{what} changed while it was uploaded (expected {sha256}, {size} bytes)",
                sha256=sha256,
                actual=digest.hexdigest(),
                source=what,
            )
        call(
            "put",
            key,
            lambda: client.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                IfNoneMatch="*",
            ),
        )
    except BaseException:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception as exc:
            log.warning("could not abort multipart upload of %s: %s", key, exc)
        raise


def _upload_part(
    call: Call,
    client: Any,
    bucket: str,
    key: str,
    upload_id: str,
    done: list[dict[str, Any]],
    chunk: bytes,
) -> dict[str, Any]:
    number = len(done) + 1
    checksum = b64(hashlib.sha256(chunk).digest())
    resp = call(
        "put",
        key,
        lambda: client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=chunk,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=checksum,
        ),
    )
    return {"PartNumber": number, "ETag": resp["ETag"], "ChecksumSHA256": checksum}
