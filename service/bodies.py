"""Reading and decoding ingest bodies within bounds.

An ingest body is a JSON array of row objects or an Arrow IPC stream. What a body
may cost is bounded before it is materialised:

* **bytes on the wire**: ``max_body_bytes`` for Arrow, the far lower
  ``max_json_body_bytes`` for JSON (Python objects cost ~25x their JSON text). A
  declared ``Content-Length`` over the cap is refused before a byte is read; a
  streamed body is counted as it arrives and refused once past the cap (413).
* **JSON values**: a JSON text of ``n`` values holds at least ``n - 1`` commas, so
  commas + brackets + braces, counted in C before parsing, bound the objects the
  parse creates (``max_json_values``, 413 beyond).
* **Arrow**: declared rows x columns and decoded bytes, checked message by message
  before decoding (:mod:`service.ipc_guard`).

JSON numbers for integer columns must be integral (``1.5`` for ``size`` is a 422,
never a silent ``1``), and a partition column's value must fit a directory name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pyarrow as pa
from fastapi import Request

from catalog.errors import InvalidBatch
from service.errors import PayloadTooLarge, UnsupportedMediaType
from service.ipc_guard import IpcLimits, read_stream

__all__ = [
    "ARROW_STREAM",
    "BodyLimits",
    "check_integral",
    "check_partition_values",
    "decode_batch",
    "media_type",
    "read_body",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"


@dataclass(frozen=True)
class BodyLimits:
    """What one ingest body may cost (see the module docstring)."""

    max_body_bytes: int
    max_json_body_bytes: int
    max_json_values: int
    max_decoded_bytes: int
    max_cells: int

    @classmethod
    def from_settings(cls, settings: Any) -> BodyLimits:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_json_body_bytes=min(settings.max_json_body_bytes, settings.max_body_bytes),
            max_json_values=settings.max_json_values,
            max_decoded_bytes=settings.max_decoded_bytes,
            max_cells=settings.max_batch_cells,
        )

    def wire_limit(self, media: str) -> int:
        return self.max_body_bytes if media == ARROW_STREAM else self.max_json_body_bytes


def media_type(content_type: str | None) -> str:
    """The body's media type, checked to be one an ingest endpoint reads.

    Raises:
        UnsupportedMediaType: neither JSON nor an Arrow IPC stream.
    """
    media = (content_type or "application/json").split(";")[0].strip().lower()
    if media == ARROW_STREAM or media == "application/json" or media.endswith("+json"):
        return media
    raise UnsupportedMediaType(
        f"send application/json or {ARROW_STREAM}, not {media!r}", media_type=media
    )


def _too_large(limit: int, media: str) -> PayloadTooLarge:
    hint = "" if media == ARROW_STREAM else f"; send larger batches as {ARROW_STREAM}"
    return PayloadTooLarge(
        f"the request body is larger than {limit} bytes{hint}", limit=limit, what="body_bytes"
    )


async def read_body(request: Request, limits: BodyLimits) -> tuple[str, bytes]:
    """The body's media type and bytes, read as a stream with a running cap.

    Raises:
        UnsupportedMediaType: the body is neither JSON nor Arrow (nothing is read).
        PayloadTooLarge: the declared or streamed length is over the media type's cap.
    """
    media = media_type(request.headers.get("content-type"))
    limit = limits.wire_limit(media)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, media)
    parts: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _too_large(limit, media)
        parts.append(chunk)
    return media, b"".join(parts)


def decode_batch(
    media: str, body: bytes, limits: BodyLimits, columns: int
) -> pa.Table | list[dict[str, Any]]:
    """A body as an Arrow table or a list of row dicts, within ``limits``.

    Args:
        media: From :func:`media_type`.
        body: The bytes.
        limits: The bounds.
        columns: Columns the receiving table materialises (rows x this is bounded).

    Raises:
        PayloadTooLarge: over a bound (nothing was materialised).
        InvalidBatch: the body does not parse, or is not a list of objects.
    """
    if media == ARROW_STREAM:
        ipc = IpcLimits(limits.max_decoded_bytes, limits.max_cells, min_columns=columns)
        return read_stream(body, ipc)
    return _json_rows(body, limits, columns)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are distinct: with a key given twice, which value counts
    differs between parsers (Python's last, others' first), so neither does."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise InvalidBatch(f"key {key!r} is given twice in one object", row=None, field=key)
    return obj


def _json_rows(body: bytes, limits: BodyLimits, columns: int) -> list[dict[str, Any]]:
    if len(body) > limits.max_json_body_bytes:
        raise _too_large(limits.max_json_body_bytes, media="application/json")
    values = body.count(b",") + body.count(b"{") + body.count(b"[")
    if values > limits.max_json_values:
        raise PayloadTooLarge(
            f"the JSON body holds more than {limits.max_json_values} values; "
            f"split it or send it as {ARROW_STREAM}",
            limit=limits.max_json_values,
            what="json_values",
        )
    try:
        rows = json.loads(body, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise InvalidBatch(f"the body is not valid JSON: {exc}", row=None, field=None) from None
    if not isinstance(rows, list):
        raise InvalidBatch("a JSON body must be an array of row objects", row=None, field=None)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InvalidBatch(f"row {i} is not an object", row=i, field=None)
    if len(rows) * max(columns, 1) > limits.max_cells:
        raise PayloadTooLarge(
            f"the batch has more than {limits.max_cells} cells (rows x columns); split it",
            limit=limits.max_cells,
            what="cells",
        )
    return rows


#: Longest file name the warehouse's filesystems take (a partition directory is one).
MAX_PATH_SEGMENT = 255


def check_partition_values(
    batch: pa.Table | Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> None:
    """Reject values of partition columns whose warehouse directory name
    (``column=<percent-encoded value>``) would be longer than a file name may be:
    the append would fail in the filesystem, after validation.

    Raises:
        InvalidBatch: naming the first such row and field.
    """
    for name in columns:
        if isinstance(batch, pa.Table):
            if name not in batch.column_names:
                continue
            values: list[Any] = batch.column(name).to_pylist()
        else:
            values = [row.get(name) for row in batch]
        seen: set[str] = set()
        for i, value in enumerate(values):
            if not isinstance(value, str) or value in seen:
                continue
            seen.add(value)
            if len(f"{name}={quote(value, safe='')}".encode()) > MAX_PATH_SEGMENT:
                raise InvalidBatch(
                    f"row {i}, field {name!r}: the value is too long to partition by "
                    f"({MAX_PATH_SEGMENT} bytes once percent-encoded, with the column name)",
                    row=i,
                    field=name,
                )


def check_integral(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> None:
    """Reject JSON numbers with a fraction where the column is an integer (pyarrow
    would truncate ``1.5`` to ``1``); nested ``probe`` fields and lists included.

    Raises:
        InvalidBatch: naming the first such row and field.
    """
    types = {f.name: f.type for f in schema}
    probe = {name[len("probe_") :]: typ for name, typ in types.items() if name.startswith("probe_")}
    for i, row in enumerate(rows):
        for name, value in row.items():
            if name == "probe" and isinstance(value, Mapping) and probe:
                for sub, inner in value.items():
                    if sub in probe and not _integral_ok(inner, probe[sub]):
                        raise _not_integral(i, f"probe.{sub}", inner)
            elif name in types and not _integral_ok(value, types[name]):
                raise _not_integral(i, name, value)


def _integral_ok(value: Any, typ: pa.DataType) -> bool:
    if isinstance(value, float) and pa.types.is_integer(typ):
        return value.is_integer()
    if isinstance(value, list) and (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
        return all(_integral_ok(v, typ.value_type) for v in value)
    return True


def _not_integral(row: int, name: str, value: Any) -> InvalidBatch:
    return InvalidBatch(
        f"row {row}, field {name!r}: {value!r} is not an integer", row=row, field=name
    )
