"""Byte streaming with Range support: ``GET|HEAD /v1/objects/{sha256}`` (latents and
any other stored object) and the helper the artifact endpoint shares; uploads with
``PUT /v1/objects/{sha256}`` (write scope, :mod:`service.object_upload`); ``GET|POST
/v1/corrupt-members``, the record of latent members loaders found corrupt
(:mod:`service.corrupt_members`).

``HEAD`` takes the ``read`` or the ``write`` scope: an uploader (write only) asks
whether an object is stored before sending it, which ``PUT`` would tell it anyway.
An object only eval rows reference is a 404 to a caller without the ``eval`` scope
(:mod:`service.eval_objects`), for ``GET``, ``HEAD`` and ranges alike.

Every response names the SHA-256 of the *whole* object in ``X-Vidlake-SHA256`` (and
as a strong ``ETag``), so that a client reassembling ranges can verify what it got.
One ``bytes=`` range per request is honoured (``a-b``, ``a-``, ``-n``) with a 206
and ``Content-Range``; a range naming no byte is a 416; a ``Range`` in another unit
or with several ranges is ignored (a 200 with the whole object), as RFC 9110 allows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from catalog.errors import NotFound
from catalog.objects import ObjectStore
from catalog.objects.refs import RefStore
from service.auth import Principal
from service.corrupt_members import CorruptMemberReport, list_members, report_member
from service.deps import Reader, Services, Svc, Writer, require
from service.errors import RangeNotSatisfiable
from service.metrics import Metrics
from service.object_upload import ObjectPutPublic, receive_object
from service.schemas import ErrorResponse

__all__ = [
    "BYTES_RESPONSES",
    "HEAD_RESPONSES",
    "PUT_RESPONSES",
    "parse_range",
    "router",
    "stream_bytes",
]

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


#: HEAD: the headers of the GET, no body (errors included: a HEAD has no body).
HEAD_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The object exists; Content-Length is its size"},
    206: {"description": "The requested byte range exists"},
    **{code: {"description": "See the GET"} for code in (401, 403, 404, 416, 422)},
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
    head: bool = False,
) -> Response:
    """A (ranged) streaming response over object ``sha256`` of ``size`` bytes (its
    headers only, for ``HEAD``)."""
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
    status = 206 if span is not None else 200
    if head:
        return Response(status_code=status, headers=headers, media_type="application/octet-stream")
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
        status_code=status,
        headers=headers,
        media_type="application/octet-stream",
    )


def _object(
    services: Services, principal: Principal, sha256: str, range_header: str | None, head: bool
) -> Response:
    # Adopted objects (TAR shards imported by reference) are served from where they live.
    store = RefStore(services.catalog.objects)
    missing = NotFound(f"no object {sha256}", sha256=sha256)
    # An eval-only object is absent to a caller without eval: a 404, not a 403, so
    # that its existence is not disclosed either.
    if not principal.sees_eval and services.eval_objects.hidden(sha256, services.pin()):
        raise missing
    info = store.head(sha256)
    if info is None:
        raise missing
    return stream_bytes(
        store,
        sha256,
        info.size,
        range_header,
        metrics=services.metrics,
        kind="object",
        name="object",
        head=head,
    )


#: HEAD: a reader, or an uploader asking before it sends.
ReaderOrWriter = Annotated[Principal, Depends(require("read", "write"))]
_SHA = Path(pattern=SHA256_PATTERN, description="SHA-256 of the object")
_RANGE_HEADER = Header(None, alias="Range")


@router.get(
    "/objects/{sha256}",
    response_class=StreamingResponse,
    responses=BYTES_RESPONSES,
    summary="Stream a stored object (latents), Range supported; eval-only objects need "
    "the eval scope",
)
def get_object(
    services: Svc,
    principal: Reader,
    sha256: str = _SHA,
    range_header: str | None = _RANGE_HEADER,
) -> Response:
    return _object(services, principal, sha256, range_header, head=False)


@router.head(
    "/objects/{sha256}",
    response_class=Response,
    responses=HEAD_RESPONSES,
    summary="A stored object's size and SHA-256 headers, no body (read or write scope)",
)
def head_object(
    services: Svc,
    principal: ReaderOrWriter,
    sha256: str = _SHA,
    range_header: str | None = _RANGE_HEADER,
) -> Response:
    return _object(services, principal, sha256, range_header, head=True)


# -- corrupt members reported by loaders (service.corrupt_members) ----------------------
@router.get(
    "/corrupt-members",
    responses={401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}},
    summary="Latent members recorded as corrupt: the record every loader rank skips by",
)
def get_corrupt_members(services: Svc, principal: Reader) -> dict[str, Any]:
    return list_members(services)


@router.post(
    "/corrupt-members",
    responses={code: {"model": ErrorResponse} for code in (401, 403, 404, 409, 422)},
    summary="Report a member whose bytes failed their SHA-256; recorded only when the "
    "service's own read of it fails too (409 when it verifies)",
)
def post_corrupt_member(
    services: Svc, principal: Reader, report: CorruptMemberReport
) -> dict[str, Any]:
    return report_member(services, principal, report)


PUT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ObjectPutPublic, "description": "The object was already stored"},
    201: {"model": ObjectPutPublic, "description": "The object was stored"},
    **{code: {"model": ErrorResponse} for code in (401, 403, 413, 422)},
}
_PUT_BODY = {
    "requestBody": {
        "required": True,
        "description": "The object's bytes; their SHA-256 must be the path's",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.put(
    "/objects/{sha256}",
    status_code=201,
    response_model=ObjectPutPublic,
    responses=PUT_RESPONSES,
    openapi_extra=_PUT_BODY,
    summary="Upload an object's bytes (write scope): 201 stored, 200 already present, "
    "422 when they do not hash to the path's SHA-256 (nothing stored)",
)
async def put_object(
    request: Request, services: Svc, principal: Writer, sha256: str = _SHA
) -> JSONResponse:
    declared = request.headers.get("content-length")
    outcome = await receive_object(
        services,
        principal,
        sha256,
        request.stream(),
        int(declared) if declared is not None and declared.isdigit() else None,
    )
    status = 201 if outcome.created else 200
    return JSONResponse(outcome.model_dump(mode="json"), status_code=status)
