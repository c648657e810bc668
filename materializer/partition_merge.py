"""The partitioned cut's kept samples outside the driver, and the streaming merge
that writes the manifest and the index from them in bounded memory.

Each clip partition (:func:`materializer.partition.run_partition`) writes its kept
samples, every column, sorted by ``(rung, clip_id)``, as an Arrow IPC file in the
cut's scratch (:func:`spill_kept`) and returns to the driver only the *driver
columns* (:func:`driver_columns`: what selection's drops, the plan, the pools check
and the quality report read) with the row's position ``_pos`` in its file (and
``_clip``, the clip's number in the partition, where the driver has no clip id: the
snapshot counts distinct clips; asset ids come as the 32 bytes their hex spells). The
driver adds the partition number ``_part``;
because partitions are ascending ``clip_id`` ranges, ``(rung, _part, _pos)`` is the
``(rung, clip_id)`` order (:func:`merge_order`), so no clip id is needed to merge.

After selection and the scatter (a permutation ``order``: manifest row ``i`` is the
sorted sample ``order[i]``), :func:`stream_artifacts` writes ``manifest.parquet``
and ``index.arrow`` by an external shuffle in two passes:

1. each partition file in turn (one partition's rows in memory: what a worker held)
   is cut by destination: each selected row goes to the chunk of :data:`CHUNK_ROWS`
   manifest rows it lands in, appended to that chunk's spill file, and the
   partition file is removed (the scratch holds one copy of the rows);
2. each chunk in turn is read, put in manifest order, joined with the driver's
   ``bucket`` column and written as one row group of the manifest and one record
   batch of the index.

The one-process cut writes the whole table at once in row groups and (compacted,
:func:`compact_batches`) index batches of the same size, so the bytes are equal. The
driver holds the driver columns, ``order`` and its inverse (8 B a row each), one
partition and one chunk: never every kept row's wide columns. After each partition and
each chunk it gives the freed Arrow memory back (:mod:`materializer.memory`), so
the next one does not add to what the allocator keeps.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from manifests.ipc import ipc_writer, read_table, write_table
from materializer.distinct import DistinctCounts
from materializer.memory import release_unused

if TYPE_CHECKING:
    from materializer.recipe import Recipe

__all__ = [
    "CHUNK_ROWS",
    "KeptParts",
    "compact_batches",
    "distinct_clips",
    "driver_columns",
    "merge_order",
    "packed_ids",
    "spill_kept",
    "stream_artifacts",
]

#: Manifest rows per chunk of the second pass: one of the manifest's row groups and
#: one of the index's record batches (both paths write the index in batches of this
#: many rows), so the chunked files equal whole ones and a chunk's wide rows, the
#: most the driver holds of them, are a few hundred MB whatever the cut's size.
CHUNK_ROWS = 1 << 18
#: Driver-side bookkeeping columns: partition number and row position in its file.
PART, POS = "_part", "_pos"
#: Columns every cut's driver reads: selection's drops (no latent frames, buckets,
#: streams), the phase masks and pools. The quality report's keys are read from the
#: written manifest, the distinct clips and assets counted in the streamed write
#: (:mod:`materializer.distinct`).
_ALWAYS = ("rung", "tier", "stream", "tokens", "latent_frames", "aspect")


def driver_columns(recipe: Recipe) -> tuple[str, ...]:
    """The kept-sample columns the driver of a cut of ``recipe`` reads; the others
    stay in the partitions' files. The clip id and the rank score only when the
    recipe drops by embeddings, the tensor keys only when it names some."""
    names = list(_ALWAYS)
    if recipe.tensor_keys:
        names.append("tensor_keys")
    if recipe.exclusions.eval_near_duplicates is not None or recipe.semantic_dedup:
        names.append("clip_id")
    if recipe.semantic_dedup is not None:
        names.append(f"score_{recipe.semantic_dedup.rank_by}")
    return tuple(names)


def spill_kept(kept: pa.Table, directory: str, columns: tuple[str, ...]) -> tuple[pa.Table, str]:
    """Write ``kept`` (one partition's, sorted) to a new file in ``directory``; its
    ``columns`` that exist, with ``_pos``, and the file's path. A retried task
    writes a file of its own (the name is random), so no two tasks share one."""
    path = str(Path(directory) / f"kept-{uuid.uuid4().hex}.arrow")
    write_table(path, kept)
    narrow = kept.select([c for c in columns if c in kept.column_names])
    if "asset_id" in narrow.column_names:
        at = narrow.schema.get_field_index("asset_id")
        narrow = narrow.set_column(at, "asset_id", packed_ids(narrow["asset_id"]))
    positions = pa.array(np.arange(kept.num_rows, dtype=np.int64))
    return narrow.append_column(POS, positions), path


_NIBBLE = np.full(256, 255, dtype=np.uint8)
_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


def packed_ids(column: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Hex ids (asset ids: 64 lowercase hex digits) as the bytes they spell, half the
    size and equal exactly where the ids are (the driver only counts and compares
    them: the snapshot's distinct assets, the quality report's codes). A column that
    is not all non-null hex of one even width is returned as it is."""
    ids = column.combine_chunks()
    if len(ids) == 0 or ids.null_count or not pa.types.is_string(ids.type):
        return column
    lengths = pc.utf8_length(ids)
    width = int(pc.min(lengths).as_py())
    if width == 0 or width % 2 or width != int(pc.max(lengths).as_py()):
        return column
    offsets = ids.buffers()[1]
    start = int(np.frombuffer(offsets, dtype=np.int32, count=1, offset=4 * ids.offset)[0])
    text = np.frombuffer(ids.buffers()[2], dtype=np.uint8, count=len(ids) * width, offset=start)
    nibbles = _NIBBLE[text]
    if (nibbles == 255).any():
        return column
    pairs = nibbles.reshape(-1, 2)
    packed = (pairs[:, 0] << 4) | pairs[:, 1]
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width // 2), len(ids), [None, pa.py_buffer(packed.tobytes())]
    )


def distinct_clips(samples: pa.Table) -> int:
    """The distinct clips among ``samples`` (a partitioned driver, without the
    column, counts them in the streamed write: :mod:`materializer.distinct`)."""
    return int(pc.count_distinct(samples["clip_id"]).as_py())


def merge_order(parts: list[pa.Table]) -> pa.Table:
    """The partitions' driver columns as one table (``_part`` added) in
    ``(rung, clip_id)`` order: partition ``p`` holds a lower ``clip_id`` range than
    ``p + 1`` and each is sorted, so ``(rung, _part, _pos)`` is that order."""
    tagged = [
        t.append_column(PART, pa.array(np.full(t.num_rows, p, dtype=np.int32)))
        for p, t in enumerate(parts)
    ]
    merged = pa.concat_tables(tagged, promote_options="permissive")
    if _in_partition_order(tagged):
        # One rung (or rungs that do not interleave across partitions): the
        # concatenation is the order, so it stays as it came, one chunk a partition,
        # instead of a gathered copy of every kept row (~95 B each) beside the parts.
        return merged
    keys = [("rung", "ascending"), (PART, "ascending"), (POS, "ascending")]
    return merged.take(pc.sort_indices(merged.select(["rung", PART, POS]), sort_keys=keys))


def _in_partition_order(parts: list[pa.Table]) -> bool:
    """Whether partition order is ``(rung, _part, _pos)`` order already: each part
    is sorted, so it is when no part's last rung is above the next part's first
    (string order is UTF-8 byte order in both Python and Arrow). A null rung
    (sorted last by Arrow) is left to the sort."""
    ends: list[tuple[str, str]] = []
    for t in parts:
        if t.num_rows == 0:
            continue
        rung = t["rung"]
        if rung.null_count or not pa.types.is_string(rung.type):
            return False
        ends.append((rung[0].as_py(), rung[-1].as_py()))
    return all(a[1] <= b[0] for a, b in pairwise(ends))


@dataclass
class KeptParts:
    """The kept-sample files of a partitioned cut, one per clip partition in
    partition order, in ``directory`` (removed by :meth:`close`)."""

    directory: str
    files: list[str]

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def schema(self) -> pa.Schema:
        """The kept samples' schema: the partitions' unified as the in-memory merge
        unifies them (a column all null in one partition takes the others' type)."""
        schemas = []
        for path in self.files:
            with pa.memory_map(path, "r") as source:
                schemas.append(pa.ipc.open_file(source).schema)
        return pa.unify_schemas(schemas, promote_options="permissive")


def new_parts(scratch: str | None) -> KeptParts:
    """An empty :class:`KeptParts` in a new directory under ``scratch``."""
    return KeptParts(tempfile.mkdtemp(prefix="vidlake-kept-", dir=scratch), [])


TableOf = Callable[[pa.Table], pa.Table]


def stream_artifacts(
    parts: KeptParts,
    selected: pa.Table,
    dest: NDArray[np.int64],
    *,
    index: tuple[Path, TableOf],
    manifest: tuple[Path, TableOf, dict[str, Any]],
) -> tuple[int, int]:
    """Write the index and the manifest of ``selected`` (the driver columns in sorted
    order, with ``bucket``, ``_part`` and ``_pos``), each sorted sample at its manifest
    row ``dest``, from the partition files, in chunks of :data:`CHUNK_ROWS` rows.
    ``index`` and ``manifest`` name each file and turn a chunk of samples (manifest
    order, with ``row``) into its rows; ``manifest`` adds the Parquet writer's options.
    Returns the distinct clips and assets of the selected rows, counted on the way."""
    group = manifest[2]["row_group_size"]
    if group <= 0 or CHUNK_ROWS % group:
        raise ValueError(f"a chunk of {CHUNK_ROWS} rows is not whole row groups of {group}")
    schema = parts.schema()
    spill = Path(parts.directory) / f"shuffle-{uuid.uuid4().hex}"
    spill.mkdir()
    counts = DistinctCounts(spill / "distinct")
    try:
        buckets = _scatter_pass(parts, selected, dest, schema, spill, counts)
        sorted_buckets = selected["bucket"].to_numpy()
        bucket_ids = np.empty_like(sorted_buckets)
        bucket_ids[dest] = sorted_buckets  # in manifest order
        del sorted_buckets
        _write_pass(buckets, bucket_ids, schema, index, manifest)
        return counts.clips, counts.assets()
    finally:
        counts.close()
        shutil.rmtree(spill, ignore_errors=True)


def _scatter_pass(
    parts: KeptParts,
    selected: pa.Table,
    dest: NDArray[np.int64],
    schema: pa.Schema,
    spill: Path,
    counts: DistinctCounts,
) -> list[Path]:
    """Pass 1: every partition file's selected rows, cut by destination chunk and
    appended to that chunk's spill file (rows with their manifest row ``_dest``),
    and added to ``counts``; each partition file is removed once read."""
    n = selected.num_rows
    count = max(1, -(-n // CHUNK_ROWS))
    paths = [spill / f"chunk-{j:06d}.arrows" for j in range(count)]
    with_dest = schema.append(pa.field("_dest", pa.int64()))
    part = selected[PART].to_numpy()
    pos = selected[POS].to_numpy()
    with ExitStack() as stack:
        writers = [
            stack.enter_context(pa.ipc.new_stream(str(p), with_dest, options=_SPILL)) for p in paths
        ]
        for p, path in enumerate(parts.files):
            mine = np.flatnonzero(part == p)
            if mine.size == 0:
                Path(path).unlink()
                continue
            rows, to = pos[mine], dest[mine]
            by = np.argsort(to, kind="stable")  # chunk by chunk, each in manifest order
            rows, to = rows[by], to[by]
            table = _conform(read_table(path).take(pa.array(rows)), schema)
            counts.add(table)
            table = table.append_column("_dest", pa.array(to))
            for j, lo, hi in _runs(to // CHUNK_ROWS):
                writers[j].write_table(table.slice(lo, hi - lo))
            del table
            Path(path).unlink()  # read once: the scratch holds one copy of the rows
            release_unused()  # else each partition's gathered rows stay resident
    return paths


def _runs(keys: NDArray[np.int64]) -> Iterator[tuple[int, int, int]]:
    """``(key, lo, hi)`` for each run of equal values of sorted ``keys``."""
    bounds = np.flatnonzero(np.diff(keys)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [keys.size]])
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(keys[lo]), lo, hi


def _write_pass(
    chunks: list[Path],
    bucket_ids: NDArray[Any],
    schema: pa.Schema,
    index: tuple[Path, TableOf],
    manifest: tuple[Path, TableOf, dict[str, Any]],
) -> None:
    """Pass 2: each chunk's rows in manifest order, with ``row`` first and the
    driver's ``bucket`` last (the one-process cut's sample view), as index and
    manifest rows."""
    index_path, index_of = index
    manifest_path, manifest_of, options = manifest
    first = 0
    with ExitStack() as stack:
        index_writer: Any = None
        parquet: pq.ParquetWriter | None = None
        for path in chunks:
            with pa.memory_map(str(path), "r") as source:
                table = pa.ipc.open_stream(source).read_all()
            table = table.take(pc.sort_indices(table["_dest"]))
            m = table.num_rows
            rows = pa.array(np.arange(first, first + m, dtype=np.int64))
            if not np.array_equal(table["_dest"].to_numpy(), rows.to_numpy()):
                raise AssertionError(f"chunk {path.name} does not hold rows {first}..{first + m}")
            samples = table.drop_columns(["_dest"]).add_column(0, "row", rows)
            bucket = pa.array(bucket_ids[first : first + m], pa.int32())
            samples = samples.append_column("bucket", bucket).combine_chunks()
            rows_of_index = index_of(samples)
            if index_writer is None:
                index_writer = stack.enter_context(ipc_writer(index_path, rows_of_index.schema))
            for batch in compact_batches(rows_of_index, CHUNK_ROWS):
                index_writer.write_batch(batch)
            rows_of_manifest = manifest_of(samples)
            if parquet is None:
                parquet = pq.ParquetWriter(
                    str(manifest_path), rows_of_manifest.schema, **_writer_options(options)
                )
                stack.callback(parquet.close)
            parquet.write_table(rows_of_manifest, row_group_size=options["row_group_size"])
            first += m
            del table, samples, rows_of_index, rows_of_manifest
            release_unused()  # one chunk's wide rows resident at a time, not every one's


def compact_batches(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    """``table`` as record batches of ``rows`` rows whose list columns hold only their
    own values. Arrow's IPC writer writes a sliced list column's child values up to
    the end of the whole column, so a table written in slices repeated every later
    batch's strings in each batch (and a file written chunk by chunk differed from
    one written whole); a compacted batch's bytes depend only on its rows."""
    for lo in range(0, table.num_rows, rows):
        batch = table.slice(lo, rows).combine_chunks().to_batches()
        one = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=table.schema)
        columns = [pa.concat_arrays([c]) if _nested(c.type) else c for c in one.columns]
        yield pa.RecordBatch.from_arrays(columns, schema=table.schema)


def _nested(kind: pa.DataType) -> bool:
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind))


def _writer_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "row_group_size"}


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s types (a partition's all-null column is cast)."""
    return table if table.schema.equals(schema) else table.cast(schema)


#: The shuffle's spill files are read once, right after they are written.
_SPILL = pa.ipc.IpcWriteOptions(compression=None)
