"""The incremental key cache: each table's key columns, kept at its current snapshot.

Ingest checks every batch against what the catalog already holds (duplicate ids,
references to assets and clips, recorded near-duplicate links). Reading those keys
from Iceberg on every call would cost a full scan; :class:`KeyCache` keeps, per
:class:`Spec`, the key columns at one snapshot with a sorted digest index
(:func:`catalog.rules.sorted_index`) and reads only the files appended since
(``incremental_append_scan``), or rescans when anything but appends happened. After
its own append the catalog extends the cache with the rows it wrote
(:meth:`KeyCache.advance`), unless another writer committed in between.

The id helpers (:func:`find_ids`, :func:`find_refs`, :func:`first_occurrence`,
:func:`latent_key`) are the lookups the ingest planners (:mod:`catalog.ingest`) run
against a :class:`Cached` entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pyiceberg.expressions import AlwaysTrue, BooleanExpression, EqualTo
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from catalog import rules
from catalog.backends import BACKEND_ERRORS
from catalog.errors import StorageError
from catalog.tables import arrow_schema

__all__ = [
    "SPECS",
    "Cached",
    "KeyCache",
    "Spec",
    "combined",
    "find_ids",
    "find_refs",
    "first_occurrence",
    "latent_key",
    "snapshot_id",
    "to_numpy",
]


@dataclass
class Cached:
    """Key columns of one table at one snapshot, arrays derived from them, and a sorted
    digest index over the key (see :func:`rules.digest_matches`)."""

    snapshot_id: int | None
    data: pa.Table
    derived: dict[str, NDArray[Any]] = field(default_factory=dict)
    index: tuple[NDArray[np.uint64], NDArray[np.int64]] | None = None

    def find(
        self, key: str, values: pa.ChunkedArray | pa.Array, digests: NDArray[np.uint64]
    ) -> NDArray[np.int64]:
        """Row of each value in column ``key`` (-1 where absent): digest candidates,
        then an exact comparison, so a digest collision never fakes a match."""
        found = np.full(len(values), -1, dtype=np.int64)
        if self.index is None or len(self.index[0]) == 0 or len(values) == 0:
            return found
        qi, rows = rules.digest_matches(self.index, digests)
        if len(qi):
            mine = pc.take(values, pa.array(qi))
            theirs = pc.take(self.data[key], pa.array(rows))
            same = to_numpy(pc.fill_null(pc.equal(mine, theirs), False)).astype(np.bool_)
            found[qi[same]] = rows[same]
        return found


@dataclass(frozen=True)
class Spec:
    """A cached key view of a table: the columns read and the rows kept."""

    name: str
    table: str
    columns: tuple[str, ...]
    keep: tuple[str, ...]
    row_filter: BooleanExpression = field(default_factory=AlwaysTrue)
    digest_of: str | None = None


def _eq(column: str, value: Any) -> BooleanExpression:
    """A pyiceberg predicate (its pydantic signature defeats mypy's reading)."""
    kind: type[Any] = EqualTo
    expr: BooleanExpression = kind(column, value)
    return expr


SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        Spec(
            "assets",
            "assets",
            (
                "asset_id",
                "split",
                "probe_bitrate",
                "duplicate_of",
                "near_duplicates",
                "fingerprint",
            ),
            (),
            digest_of="asset_id",
        ),
        Spec("clips", "clips", ("clip_id",), ("clip_id",), digest_of="clip_id"),
        Spec(
            "latents",
            "latents",
            ("clip_id", "rung", "tokenizer_version", "member_sha256"),
            (),
            digest_of="clip_id",
        ),
        Spec(
            "near_dup_events",
            "asset_events",
            ("asset_id", "related_asset_id", "event"),
            ("asset_id", "related_asset_id"),
            _eq("event", "near_duplicate"),
        ),
    )
}


class KeyCache:
    """The :data:`SPECS` views of a catalog's tables, read incrementally.

    Args:
        load: Loads a table by name (fresh metadata).
        window: Leading fingerprint frames kept per asset (the near-duplicate rule's).
    """

    def __init__(self, load: Callable[[str], Table], window: int) -> None:
        self._load = load
        self._window = window
        self._entries: dict[str, Cached] = {}

    def get(self, name: str, tbl: Table | None = None) -> Cached:
        """The key rows of view ``name`` at its table's current snapshot (``tbl``'s,
        when given): only the files appended since the cached snapshot are scanned."""
        spec = SPECS[name]
        tbl = tbl if tbl is not None else self._load(spec.table)
        current = snapshot_id(tbl)
        entry = self._entries.get(name)
        if entry is not None and entry.snapshot_id == current:
            return entry
        try:
            entry = self._read(spec, tbl, entry, current)
        except BACKEND_ERRORS as exc:
            raise StorageError(f"reading {spec.table} failed: {exc}", table=spec.table) from exc
        self._entries[name] = entry
        return entry

    def _read(self, spec: Spec, tbl: Table, entry: Cached | None, current: int | None) -> Cached:
        if (
            entry is not None
            and entry.snapshot_id is not None
            and current is not None
            and _appends_only(tbl, entry.snapshot_id, current)
        ):
            added = tbl.incremental_append_scan(
                from_snapshot_id_exclusive=entry.snapshot_id,
                to_snapshot_id_inclusive=current,
                row_filter=spec.row_filter,
                selected_fields=spec.columns,
            ).to_arrow()
            return _merge(entry, current, self._reduce(spec, added))
        if current is None:
            rows = arrow_schema(tbl.schema()).empty_table().select(list(spec.columns))
        else:
            scan = tbl.scan(
                row_filter=spec.row_filter, selected_fields=spec.columns, snapshot_id=current
            )
            rows = scan.to_arrow()
        fresh = self._reduce(spec, rows)
        fresh.snapshot_id = current
        return fresh

    def advance(
        self, table: str, base: int | None, parent: int | None, new: int, rows: pa.Table
    ) -> None:
        """After our own append: extend the caches of ``table`` with the rows we wrote,
        when nobody else committed in between (else drop them; the next read rescans)."""
        for name, spec in SPECS.items():
            if spec.table != table:
                continue
            entry = self._entries.get(name)
            if entry is None:
                continue
            if entry.snapshot_id == base == parent and isinstance(spec.row_filter, AlwaysTrue):
                self._entries[name] = _merge(
                    entry, new, self._reduce(spec, rows.select(list(spec.columns)))
                )
            else:
                del self._entries[name]

    def _reduce(self, spec: Spec, rows: pa.Table) -> Cached:
        """The cached form of a table's key rows (see :data:`SPECS`); no snapshot yet."""
        digests = rules.hex_prefix64(rows[spec.digest_of]) if spec.digest_of else None
        index = rules.sorted_index(digests) if digests is not None else None
        if spec.name == "assets":
            frames, lengths = rules.fingerprint_matrix(rows["fingerprint"], self._window)
            bitrate = rules.bitrates(rows)
            data = rows.select(["asset_id", "split", "duplicate_of", "near_duplicates"])
            derived = {"frames": frames, "lengths": lengths, "bitrate": bitrate}
            return Cached(None, data.combine_chunks(), derived, index)
        if spec.name == "latents":
            key = latent_key(
                rows["clip_id"], rows["rung"], rows["tokenizer_version"], rows["member_sha256"]
            )
            return Cached(None, pa.table({"key": key}), {}, index)
        return Cached(None, rows.select(list(spec.keep)).combine_chunks(), {}, index)


def _merge(entry: Cached, snapshot_id: int, part: Cached) -> Cached:
    """``entry`` extended with rows appended after it (``part``, from ``_reduce``)."""
    merged = pa.concat_tables([entry.data, part.data.cast(entry.data.schema)])
    if merged.column(0).num_chunks > 64:  # keep takes cheap without copying every time
        merged = merged.combine_chunks()
    arrays = {k: np.concatenate([entry.derived[k], part.derived[k]]) for k in entry.derived}
    index = entry.index
    if index is not None and part.index is not None:
        index = rules.index_merge(index, part.index, entry.data.num_rows)
    return Cached(snapshot_id, merged, arrays, index)


def snapshot_id(tbl: Table) -> int | None:
    """``tbl``'s current snapshot id (None: the table is empty)."""
    snap = tbl.current_snapshot()
    return None if snap is None else snap.snapshot_id


def _appends_only(tbl: Table, since: int, until: int) -> bool:
    """Whether ``since`` is an ancestor of ``until`` with only appends in between."""
    snap = tbl.metadata.snapshot_by_id(until)
    while snap is not None:
        if snap.snapshot_id == since:
            return True
        if snap.summary is None or snap.summary.operation != Operation.APPEND:
            return False
        parent = snap.parent_snapshot_id
        snap = tbl.metadata.snapshot_by_id(parent) if parent is not None else None
    return False


# -- lookups against a cached entry ---------------------------------------------------
def find_refs(entry: Cached, key: str, ids: pa.ChunkedArray | pa.Array) -> NDArray[np.int64]:
    """:func:`find_ids` for references that repeat many times (an asset has many
    clips): each distinct id is looked up once (~3x cheaper)."""
    refs = pc.dictionary_encode(combined(ids))
    at = find_ids(entry, key, refs.dictionary)
    at = at[to_numpy(refs.indices.fill_null(0)).astype(np.int64)]
    if refs.indices.null_count:
        at[to_numpy(pc.is_null(refs.indices)).astype(np.bool_)] = -1
    return at


def find_ids(entry: Cached, key: str, ids: pa.ChunkedArray | pa.Array) -> NDArray[np.int64]:
    """Row of each hex id in ``entry`` (-1 where absent or null)."""
    valid = to_numpy(pc.is_valid(ids)).astype(np.bool_)
    if valid.all():
        return entry.find(key, ids, rules.hex_prefix64(ids))
    found = np.full(len(ids), -1, dtype=np.int64)
    some = pc.filter(ids, pa.array(valid))
    found[valid] = entry.find(key, some, rules.hex_prefix64(some))
    return found


def first_occurrence(
    keys: pa.ChunkedArray | pa.Array, digests: NDArray[np.uint64] | None = None
) -> NDArray[np.bool_]:
    """True at the first row of each distinct key. ``digests`` (equal keys have equal
    digests) give a cheap answer for the usual batch, which repeats nothing."""
    n = len(keys)
    if digests is not None:
        ordered = np.sort(digests)
        if not (ordered[1:] == ordered[:-1]).any():
            return np.ones(n, dtype=np.bool_)
    elif pc.count_distinct(keys).as_py() == n:
        return np.ones(n, dtype=np.bool_)
    grouped = (
        pa.table({"k": keys, "i": pa.array(np.arange(n, dtype=np.int64))})
        .group_by("k")
        .aggregate([("i", "min")])
    )
    first = np.zeros(n, dtype=np.bool_)
    first[grouped["i_min"].to_numpy()] = True
    return first


def latent_key(*cols: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One string per latent: clip, rung, tokenizer, member SHA-256 (unit-separated)."""
    joined = pc.binary_join_element_wise(
        *(c.cast(pa.large_string()) for c in cols), pa.scalar("\x1f", pa.large_string())
    )
    return combined(joined)


def combined(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``col`` as one contiguous array."""
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def to_numpy(col: pa.ChunkedArray | pa.Array) -> NDArray[Any]:
    """``col`` as a numpy array (copying where Arrow cannot share the buffer)."""
    return np.asarray(col.to_numpy(zero_copy_only=False))
