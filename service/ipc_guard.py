"""Bounded decoding of Arrow IPC stream bodies.

A small body can declare a huge table: ZSTD or LZ4 buffers inflate by orders of
magnitude, and a record batch may claim billions of rows of absent columns. Before
pyarrow decodes anything, :func:`read_stream` walks the stream message by message
with :class:`pyarrow.ipc.MessageReader` (zero copy over the body) and reads each
message's flatbuffer header itself, because pyarrow does not expose it:

* a record batch's row count (``RecordBatch.length``), so that rows x columns of
  the whole stream is bounded by ``max_cells``;
* each body buffer's decoded size: a compressed buffer starts with its
  uncompressed length (an int64, ``-1`` when stored raw), so that the decoded
  bytes of every batch and dictionary are bounded by ``max_decoded_bytes``.

Only a stream within both bounds is decoded (by pyarrow, batch by batch), and a
dictionary-encoded column's expansion counts against the same decoded-bytes bound.
A truncated or malformed stream is an :class:`~catalog.errors.InvalidBatch` (422);
a stream over a bound is a :class:`~service.errors.PayloadTooLarge` (413).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from catalog.errors import InvalidBatch
from service.errors import PayloadTooLarge

__all__ = ["IpcLimits", "read_stream"]

_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3  # MessageHeader union tags (Message.fbs)


@dataclass(frozen=True)
class IpcLimits:
    """Bounds on what one Arrow IPC body may decode to.

    Attributes:
        max_decoded_bytes: Decoded (uncompressed, dictionary-expanded) bytes of every
            batch and dictionary of the stream together.
        max_cells: Rows of the stream x its columns (at least ``min_columns``).
        min_columns: Columns the receiver materialises whatever the body sends (a
            catalog table fills its absent columns with nulls).
    """

    max_decoded_bytes: int
    max_cells: int
    min_columns: int = 1


class _Malformed(Exception):
    """A flatbuffer offset or length points outside the message header."""


class _Flat:
    """Just enough of the flatbuffers wire format to read Arrow's ``Message``."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def _u(self, fmt: str, at: int) -> int:
        if at < 0 or at + struct.calcsize(fmt) > len(self.data):
            raise _Malformed(at)
        value: int = struct.unpack_from(fmt, self.data, at)[0]
        return value

    def root(self) -> int:
        return self._u("<I", 0)

    def field(self, table: int, index: int) -> int | None:
        """Absolute position of field ``index`` of the table at ``table``, or None."""
        vtable = table - self._u("<i", table)
        size = self._u("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        offset = self._u("<H", vtable + slot)
        return table + offset if offset else None

    def scalar(self, table: int, index: int, fmt: str, default: int = 0) -> int:
        at = self.field(table, index)
        return default if at is None else self._u(fmt, at)

    def ref(self, table: int, index: int) -> int | None:
        """The table or vector field ``index`` points to, or None."""
        at = self.field(table, index)
        return None if at is None else at + self._u("<I", at)

    def structs(self, table: int, index: int, width: int) -> list[int]:
        """Positions of the fixed-size structs of vector field ``index``."""
        vector = self.ref(table, index)
        if vector is None:
            return []
        count = self._u("<I", vector)
        if vector + 4 + count * width > len(self.data):
            raise _Malformed(vector)
        return [vector + 4 + i * width for i in range(count)]

    def long(self, at: int) -> int:
        return self._u("<q", at)


@dataclass(frozen=True)
class _Batch:
    rows: int
    decoded_bytes: int


def _batch_header(message: pa.ipc.Message) -> _Batch | None:
    """Rows and decoded body bytes a record batch or dictionary message declares
    (None for a schema message)."""
    flat = _Flat(message.metadata.to_pybytes())
    root = flat.root()
    kind = flat.scalar(root, 1, "<B")
    header = flat.ref(root, 2)
    if kind == _SCHEMA:
        return None
    if header is None or kind not in (_DICTIONARY, _RECORD_BATCH):
        raise _Malformed(kind)
    batch = flat.ref(header, 1) if kind == _DICTIONARY else header
    if batch is None:
        raise _Malformed(header)
    rows = flat.scalar(batch, 0, "<q")
    compressed = flat.ref(batch, 3) is not None
    body = message.body
    total = 0
    for at in flat.structs(batch, 2, 16):  # Buffer {offset: long, length: long}
        offset, length = flat.long(at), flat.long(at + 8)
        if offset < 0 or length < 0 or offset + length > body.size:
            raise _Malformed(at)
        total += _decoded_length(body, offset, length) if compressed else length
    if rows < 0:
        raise _Malformed(rows)
    return _Batch(rows=rows if kind == _RECORD_BATCH else 0, decoded_bytes=total)


def _decoded_length(body: pa.Buffer, offset: int, length: int) -> int:
    if length == 0:
        return 0
    if length < 8:
        raise _Malformed(offset)
    declared: int = struct.unpack("<q", body.slice(offset, 8).to_pybytes())[0]
    if declared == -1:  # stored uncompressed after the prefix
        return length - 8
    if declared < 0:
        raise _Malformed(offset)
    return declared


def _scan(body: bytes, limits: IpcLimits) -> None:
    """Check every message's declared size before anything is decoded."""
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(body))
    columns: int | None = None
    rows = decoded = 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        header = _batch_header(message)
        if header is None:
            columns = len(pa.ipc.read_schema(message))
            continue
        if columns is None:
            raise InvalidBatch("the Arrow IPC stream has no schema first", row=None, field=None)
        rows += header.rows
        decoded += header.decoded_bytes
        _check(limits, rows * max(columns, limits.min_columns), decoded)
    if columns is None:
        raise InvalidBatch("the Arrow IPC stream is empty (no schema)", row=None, field=None)


def _check(limits: IpcLimits, cells: int, decoded: int) -> None:
    if cells > limits.max_cells:
        raise PayloadTooLarge(
            f"the Arrow batch has more than {limits.max_cells} cells (rows x columns); "
            "split it into smaller requests",
            limit=limits.max_cells,
            what="cells",
        )
    if decoded > limits.max_decoded_bytes:
        raise PayloadTooLarge(
            f"the Arrow batch decodes to more than {limits.max_decoded_bytes} bytes; "
            "split it into smaller requests",
            limit=limits.max_decoded_bytes,
            what="decoded_bytes",
        )


def _expanded_bytes(batch: pa.RecordBatch) -> int:
    """Bytes the dictionary-encoded columns of ``batch`` take once decoded."""
    total = 0
    for column in batch.columns:
        if not pa.types.is_dictionary(column.type):
            continue
        values = column.dictionary
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type):
            sizes = pc.binary_length(values).cast(pa.int64()).fill_null(0)
        elif pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
            sizes = pc.binary_length(values).fill_null(0)
        else:
            total += len(column) * max(1, values.nbytes // max(1, len(values)))
            continue
        taken = pc.take(sizes, column.indices.fill_null(0)) if len(sizes) else None
        total += int(pc.sum(taken).as_py() or 0) if taken is not None else 0
    return total


def read_stream(body: bytes, limits: IpcLimits) -> pa.Table:
    """Decode an Arrow IPC stream body whose decoded size and cells are bounded.

    Raises:
        PayloadTooLarge: the stream declares more cells or decoded bytes than
            ``limits`` allow (nothing of it was decoded).
        InvalidBatch: the stream is truncated, malformed or empty.
    """
    try:
        _scan(body, limits)
        reader = pa.ipc.open_stream(pa.BufferReader(body))
        batches, decoded = [], 0
        for batch in reader:
            decoded += batch.nbytes + _expanded_bytes(batch)
            _check(limits, 0, decoded)
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except (_Malformed, struct.error) as exc:
        raise InvalidBatch(
            f"the body is not a well-formed Arrow IPC stream (bad message header at {exc})",
            row=None,
            field=None,
        ) from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InvalidBatch(
            f"the body is not a complete Arrow IPC stream (truncated or malformed): {exc}",
            row=None,
            field=None,
        ) from None
