"""Byte streaming with Range support: ``GET /v1/objects/{sha256}`` (latents and any
other stored object) and the helper the artifact endpoint shares.

Every response names the SHA-256 of the *whole* object in ``X-Vidlake-SHA256`` (and
as a strong ``ETag``), so that a client reassembling ranges can verify what it got.
One ``bytes=`` range per request is honoured (``a-b``, ``a-``, ``-n``) with a 206
and ``Content-Range``; a range naming no byte is a 416; a ``Range`` in another unit
or with several ranges is ignored (a 200 with the whole object), as RFC 9110 allows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Header, Path
from fastapi.responses import StreamingResponse

from catalog.errors import NotFound
from catalog.objects import ObjectStore
from catalog.objects.refs import RefStore
from service.deps import Reader, Svc
from service.errors import RangeNotSatisfiable
from service.metrics import Metrics
from service.schemas import ErrorResponse

__all__ = ["BYTES_RESPONSES", "parse_range", "router", "stream_bytes"]

router = APIRouter(prefix="/v1", tags=["objects"])

CHUNK = 1 << 20
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)
SHA256_PATTERN = r"^[0-9a-f]{64}$"

BYTES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The whole object",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            "X-Vidlake-SHA256": {
                "description": "SHA-256 of the whole object",
                "schema": {"type": "string"},
            }
        },
    },
    206: {
        "description": "The requested byte range",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    401: {"model": ErrorResponse},
    403: {"model": ErrorResponse},
    404: {"model": ErrorResponse},
    416: {"model": ErrorResponse},
    422: {"model": ErrorResponse},
}


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, stop)`` (stop exclusive) of a single ``bytes`` range, or None for
    the whole object.

    Raises:
        RangeNotSatisfiable: the range names no byte of a ``size``-byte object.
    """
    if header is None or not header.strip().lower().startswith("bytes") or "," in header:
        return None
    match = _RANGE.match(header)
    if match is None:
        raise RangeNotSatisfiable(f"malformed Range header {header[:100]!r}", size=size)
    first, last = match.group(1), match.group(2)
    if first == "" and last == "":
        raise RangeNotSatisfiable(f"malformed Range header {header[:100]!r}", size=size)
    if first == "":
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(f"range {header[:100]!r} is empty", size=size)
        return max(0, size - suffix), size
    start = int(first)
    stop = size if last == "" else min(size, int(last) + 1)
    if start >= size or (last != "" and int(last) < start):
        raise RangeNotSatisfiable(
            f"range {header[:100]!r} is outside the {size}-byte object", size=size
        )
    return start, stop


def stream_bytes(
    store: ObjectStore,
    sha256: str,
    size: int,
    range_header: str | None,
    *,
    metrics: Metrics,
    kind: str,
    name: str,
) -> StreamingResponse:
    """A (ranged) streaming response over object ``sha256`` of ``size`` bytes."""
    span = parse_range(range_header, size)
    start, stop = span if span is not None else (0, size)
    headers = {
        "Accept-Ranges": "bytes",
        "X-Vidlake-SHA256": sha256,
        "ETag": f'"{sha256}"',
        "Cache-Control": "public, max-age=31536000, immutable",
        "Content-Length": str(stop - start),
    }
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    served = metrics.served_bytes.labels(kind, name)

    def chunks() -> Iterator[bytes]:
        offset = start
        while offset < stop:
            data = store.get_range(sha256, offset, min(CHUNK, stop - offset))
            if not data:
                break
            served.inc(len(data))
            offset += len(data)
            yield data

    return StreamingResponse(
        chunks(),
        status_code=206 if span is not None else 200,
        headers=headers,
        media_type="application/octet-stream",
    )


@router.get(
    "/objects/{sha256}",
    response_class=StreamingResponse,
    responses=BYTES_RESPONSES,
    summary="Stream a stored object (latents), Range supported",
)
def get_object(
    services: Svc,
    principal: Reader,
    sha256: str = Path(pattern=SHA256_PATTERN, description="SHA-256 of the object"),
    range_header: str | None = Header(None, alias="Range"),
) -> StreamingResponse:
    # Adopted objects (TAR shards imported by reference) are served from where they live.
    store = RefStore(services.catalog.objects)
    info = store.head(sha256)
    if info is None:
        raise NotFound(f"no object {sha256}", sha256=sha256)
    return stream_bytes(
        store,
        sha256,
        info.size,
        range_header,
        metrics=services.metrics,
        kind="object",
        name="object",
    )
