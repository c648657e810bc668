"""The one reader and writer of a snapshot's Arrow IPC *file* artifacts.

``plan.arrow``, ``index.arrow`` and ``lineage.arrow`` (:mod:`manifests.format`) are
uncompressed Arrow IPC files, so every reader memory-maps them and nothing is copied:

* :func:`open_mapped` maps a file until the caller closes it (or leaves its ``with``
  block), :func:`read_table` returns the whole
  file as a zero-copy table (the mapping lives as long as the table's buffers),
  :func:`iter_batches` walks the record batches through a short-lived mapping,
  :func:`read_columns` copies whole columns out of one.
  Each checks what it opens: the expected size (``size``), that it is an Arrow IPC
  file at all, and its schema (``schema``, metadata ignored); a failure is an
  :class:`~catalog.errors.IntegrityError` naming the file.
* :func:`ipc_writer` and :func:`write_table` write uncompressed IPC files atomically
  (:mod:`catalog.atomic`: temp file, fsync, rename), so a reader never maps half a file.

Streams (request and response bodies of the service) are not files and are not read
here. Standard library, pyarrow and ``catalog`` only: the loader imports this module.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from catalog.atomic import atomic_path
from catalog.errors import IntegrityError

__all__ = [
    "MappedIpc",
    "ipc_writer",
    "iter_batches",
    "open_mapped",
    "read_columns",
    "read_table",
    "write_table",
]

#: Rows per record batch when a whole table is written (readers locate by stride).
DEFAULT_CHUNK = 1 << 20
_OPTIONS = pa.ipc.IpcWriteOptions(compression=None)

PathLike = str | os.PathLike[str]


@dataclass
class MappedIpc:
    """An open memory map of an IPC file and its reader; :meth:`close` unmaps it."""

    path: Path
    source: pa.MemoryMappedFile
    reader: pa.ipc.RecordBatchFileReader

    @property
    def schema(self) -> pa.Schema:
        return self.reader.schema

    @property
    def num_batches(self) -> int:
        return int(self.reader.num_record_batches)

    def batch(self, i: int) -> pa.RecordBatch:
        return self.reader.get_batch(i)

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> MappedIpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _what(path: Path, what: str | None) -> str:
    return what or path.name


def _check_size(path: Path, size: int | None, what: str) -> None:
    if size is None:
        return
    try:
        found = path.stat().st_size
    except FileNotFoundError:
        raise IntegrityError(f"{what} at {path} is missing", path=str(path)) from None
    if found != size:
        raise IntegrityError(
            f"{what} at {path} has {found} bytes, expected {size}",
            path=str(path),
            size=found,
            expected_size=size,
        )


def open_mapped(
    path: PathLike,
    *,
    schema: pa.Schema | None = None,
    size: int | None = None,
    what: str | None = None,
) -> MappedIpc:
    """Memory-map IPC file ``path`` and open its reader (the caller closes it).

    Raises:
        IntegrityError: ``path`` has another ``size``, is not an Arrow IPC file, or
            its schema differs from ``schema`` (metadata aside).
    """
    path = Path(path)
    name = _what(path, what)
    _check_size(path, size, name)
    source = pa.memory_map(str(path), "r")
    try:
        try:
            reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid as exc:
            raise IntegrityError(
                f"{name} at {path} is not an Arrow IPC file: {exc}", path=str(path)
            ) from exc
        found = reader.schema
        if schema is not None and not found.remove_metadata().equals(schema.remove_metadata()):
            raise IntegrityError(
                f"{name} at {path} has schema {found}, expected {schema}", path=str(path)
            )
    except BaseException:
        source.close()
        raise
    return MappedIpc(path, source, reader)


def iter_batches(
    path: PathLike,
    *,
    schema: pa.Schema | None = None,
    size: int | None = None,
    what: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Every record batch of ``path``, through a mapping unmapped when the walk ends
    (whole-file passes then leave no pages resident in the process). Copy what must
    outlive the walk."""
    with open_mapped(path, schema=schema, size=size, what=what) as m:
        for i in range(m.num_batches):
            yield m.batch(i)


def read_table(
    path: PathLike,
    *,
    schema: pa.Schema | None = None,
    size: int | None = None,
    what: str | None = None,
) -> pa.Table:
    """The whole of IPC file ``path`` as a zero-copy table over its memory map (the
    mapping stays alive while the table's buffers do)."""
    with open_mapped(path, schema=schema, size=size, what=what) as m:
        return m.reader.read_all()


def read_columns(path: PathLike, names: list[str], *, what: str | None = None) -> list[pa.Array]:
    """Whole columns ``names`` of IPC file ``path``, read batch by batch from a memory
    map (list columns come back flattened). The arrays are concatenated into fresh
    memory, so they outlive the file."""
    with open_mapped(path, what=what) as m:
        chunks: dict[str, list[pa.Array]] = {n: [] for n in names}
        for i in range(m.num_batches):
            batch = m.batch(i)
            for n in names:
                column = batch.column(n)
                if pa.types.is_list(column.type):
                    column = column.flatten()
                chunks[n].append(column)
        result = []
        for n in names:
            kind = m.schema.field(n).type
            empty = pa.array([], kind.value_type if pa.types.is_list(kind) else kind)
            result.append(pa.concat_arrays([empty, *chunks[n]]))
        return result


@contextlib.contextmanager
def ipc_writer(
    path: PathLike, schema: pa.Schema, *, exclusive: bool = False
) -> Iterator[pa.ipc.RecordBatchFileWriter]:
    """A writer of an uncompressed IPC file that appears at ``path`` whole, on a clean
    exit of the block (raising in the block leaves ``path`` as it was)."""
    with (
        atomic_path(path, exclusive=exclusive) as tmp,
        pa.OSFile(str(tmp), "wb") as sink,
        pa.ipc.new_file(sink, schema, options=_OPTIONS) as writer,
    ):
        yield writer


def write_table(
    path: PathLike,
    table: pa.Table | Iterable[pa.RecordBatch],
    schema: pa.Schema | None = None,
    *,
    max_chunksize: int = DEFAULT_CHUNK,
) -> None:
    """Write ``table`` (or ``batches`` of ``schema``) as an uncompressed IPC file at
    ``path``, atomically; a table is split into batches of ``max_chunksize`` rows."""
    if isinstance(table, pa.Table):
        with ipc_writer(path, schema or table.schema) as writer:
            writer.write_table(table, max_chunksize=max_chunksize)
        return
    if schema is None:
        raise TypeError("write_table needs the schema of an iterable of batches")
    with ipc_writer(path, schema) as writer:
        for batch in table:
            writer.write_batch(batch)
