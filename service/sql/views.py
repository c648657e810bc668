"""The catalog tables as SQL views at a pin, eval material hidden unless asked for.

Eval isolation never depends on what a caller names. The eval id sets come from the
``clips`` and ``assets`` tables at two states and are united:

* the caller's pin for those tables (when it names them), and
* their *current* snapshots, loaded fresh from the catalog after the pin was fixed.

Eval is decided at ingest and never changes, and a row can only reference an asset or
clip that was committed before it, so the current ``assets``/``clips`` hold every eval
id that any row at any pin can reference: a pin that names ``captions`` but not
``clips``, or names every table at an old state, or races an ingest, cannot make an
eval row look like a train row. The pinned state is united in as well, so that a
snapshot id newer than the current metadata read (another process committing) still
counts.

Caches are keyed by everything they depend on: a table's dataset by (table, snapshot
id), an eval id set by (table, snapshot id) of the table it is read from. Filtered
views are never cached; a :class:`View` carries its unfiltered dataset and the filter
separately, so that it can travel to a sandbox worker, which applies the filter and
registers only the filtered result.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from numpy.typing import NDArray

from catalog.table_names import SPLIT_COLUMN, TABLE_NAMES, TRAIN_SPLIT, eval_key

__all__ = ["CATALOG_VIEWS", "CatalogViews", "Source", "View"]

#: Every catalog table is a view of its name (the table definitions' names).
CATALOG_VIEWS = TABLE_NAMES
_CACHE_ENTRIES = 128
_INDEX_BYTES = 512 * 1024 * 1024  # key indexes kept in memory, LRU beyond


@dataclass(frozen=True)
class View:
    """The data of one SQL view: ``data`` with the rows where ``where`` is false (or
    null) removed. Both parts pickle, unlike a filtered pyarrow dataset."""

    data: ds.Dataset | pa.Table
    where: pc.Expression | None = None

    def dataset(self) -> ds.Dataset:
        data = self.data if isinstance(self.data, ds.Dataset) else ds.dataset(self.data)
        return data if self.where is None else data.filter(self.where)


Source = Callable[[], "View | ds.Dataset | pa.Table"]


class _KeyIndex:
    """The sorted 64-bit hashes of one key column of one (immutable) data file, and the
    row groups that hold them: a point lookup reads one row group, not the file.

    Hashes, not the keys: 12 bytes a row instead of the key's width + 8 (40 for a clip
    id, 72 for an asset id), so that the indexes of a 10M-clip catalog fit the cache
    (with whole keys they did not, and every lookup rebuilt them, issue 16); a hash
    collision only adds a candidate row, which :meth:`CatalogViews.lookup` drops.
    """

    def __init__(self, fragment: ds.ParquetFileFragment, column: str) -> None:
        values = fragment.to_table(columns=[column]).column(column).combine_chunks()
        hashes = _key_hashes(values)
        self.order = np.argsort(hashes, kind="stable").astype(
            np.int32 if len(hashes) < 2**31 else np.int64
        )
        self.keys = hashes[self.order]
        meta = fragment.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.order.nbytes)

    def rows(self, wanted: NDArray[np.uint64]) -> NDArray[np.int64]:
        """File row numbers whose key hash is in ``wanted`` (sorted :func:`_key_hashes`):
        the rows of those keys, and any row whose key collides with one."""
        lo = np.searchsorted(self.keys, wanted, side="left")
        hi = np.searchsorted(self.keys, wanted, side="right")
        hits = [self.order[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]
        return np.sort(np.concatenate(hits)).astype(np.int64) if hits else np.zeros(0, np.int64)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _key_hashes(values: pa.Array) -> NDArray[np.uint64]:
    """A 64-bit hash of each string of ``values`` (multiply-xorshift over its 8-byte
    words, vectorised; a value's hash does not depend on the other values' widths)."""
    keys = _fixed_width_bytes(values)
    n, width = len(keys), keys.dtype.itemsize
    words_per_row = (width + 7) // 8
    raw = np.zeros((n, words_per_row * 8), np.uint8)
    raw[:, :width] = keys.view(np.uint8).reshape(n, width)
    words = raw.view("<u8")
    used = (np.char.str_len(keys) + 7) // 8  # a shorter value's padding is not hashed
    h = np.zeros(n, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(words_per_row):
            mixed = (h ^ words[:, j]) * _MIX
            mixed ^= mixed >> np.uint64(29)
            h = np.where(used > j, mixed, h)
    return h


def _fixed_width_bytes(values: pa.Array) -> NDArray[Any]:
    """A string column as a numpy ``S<n>`` array (zero-copy when every value has one
    length, as hex ids do)."""
    if len(values) == 0:
        return np.zeros(0, dtype="S1")
    if values.null_count == 0 and (
        pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    ):
        offset_type = np.int64 if pa.types.is_large_string(values.type) else np.int32
        offsets = np.frombuffer(values.buffers()[1], dtype=offset_type)
        offsets = offsets[values.offset : values.offset + len(values) + 1]
        widths = np.diff(offsets)
        if widths.size and widths.min() == widths.max() and widths[0] > 0:
            raw = np.frombuffer(values.buffers()[2], dtype=np.uint8)
            raw = raw[int(offsets[0]) : int(offsets[-1])]
            return raw.view(f"S{int(widths[0])}").copy()
    return np.array([v or "" for v in values.to_pylist()], dtype="S")


def _union(*arrays: pa.Array) -> pa.Array:
    parts = [a for a in arrays if len(a)]
    if not parts:
        return pa.array([], pa.string())
    return pc.unique(pa.concat_arrays([p.cast(pa.string()) for p in parts]))


def _not_in(column: str, ids: pa.Array) -> pc.Expression:
    # Null keys are hidden too: a row that cannot be attributed is not shown as train.
    return pc.field(column).is_valid() & ~pc.field(column).isin(ids)


class CatalogViews:
    """Arrow datasets of catalog tables at a pin, eval material filtered out unless
    asked for. Datasets of a (table, snapshot id) are cached: an Iceberg snapshot
    never changes."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, int | None], ds.Dataset] = OrderedDict()
        self._eval: OrderedDict[tuple[str, int | None], pa.Array] = OrderedDict()
        self._indexes: OrderedDict[tuple[str, str], _KeyIndex] = OrderedDict()
        self._index_bytes = 0

    # -- views ----------------------------------------------------------------------
    def sources(self, pin: Mapping[str, int | None], include_eval: bool) -> dict[str, Source]:
        """View name -> a factory of its :class:`View` at ``pin`` (only the views a
        query reads get built)."""
        return {
            name: (lambda n=name: self.view(n, pin, include_eval))  # type: ignore[misc]
            for name in CATALOG_VIEWS
        }

    def view(self, table: str, pin: Mapping[str, int | None], include_eval: bool) -> View:
        """``table`` at ``pin``; without ``include_eval`` its eval rows filtered out."""
        data = self._raw(table, pin.get(table))
        if include_eval:
            return View(data)
        return View(data, self.eval_filter(table, pin))

    def dataset(self, table: str, pin: Mapping[str, int | None], include_eval: bool) -> ds.Dataset:
        """``table`` at ``pin`` as one (possibly filtered) dataset."""
        return self.view(table, pin, include_eval).dataset()

    def eval_filter(self, table: str, pin: Mapping[str, int | None]) -> pc.Expression | None:
        """The filter that keeps the train rows of ``table`` (None for a table without
        eval material), by the one eval policy of :mod:`catalog.table_names`."""
        ek = eval_key(table)
        if ek is None:
            return None
        if ek.carries_split(table):
            # ``split`` is decided per asset at ingest and copied to its clips.
            return pc.field(SPLIT_COLUMN) == TRAIN_SPLIT
        return _not_in(ek.key, self.owner_eval_ids(ek.owner, ek.key, pin))

    def clip_filter(self, pin: Mapping[str, int | None]) -> pc.Expression:
        """Keeps the rows of any table with a ``clip_id`` whose clip is not eval."""
        return _not_in("clip_id", self.eval_clip_ids(pin))

    # -- eval id sets -----------------------------------------------------------------
    def eval_clip_ids(self, pin: Mapping[str, int | None]) -> pa.Array:
        """Every eval clip id any row at ``pin`` can reference (see the module
        docstring), at the pinned and at the current ``clips`` snapshot."""
        return self.owner_eval_ids("clips", "clip_id", pin)

    def eval_asset_ids(self, pin: Mapping[str, int | None]) -> pa.Array:
        """Every eval asset id, at the pinned and at the current ``assets`` snapshot."""
        return self.owner_eval_ids("assets", "asset_id", pin)

    def owner_eval_ids(self, owner: str, key: str, pin: Mapping[str, int | None]) -> pa.Array:
        """Every eval id (``key``) of ``owner`` (a table carrying ``split``), at the
        pinned and at the current snapshot of ``owner``."""
        sids = {pin.get(owner), self.catalog.current_snapshot_id(owner)}
        return _union(*(self.eval_ids(owner, key, sid) for sid in sids))

    def eval_ids(self, table: str, key: str, sid: int | None) -> pa.Array:
        """Ids (``key``) of the eval rows of ``table`` (assets or clips) at ``sid``.

        Prefer :meth:`eval_clip_ids` / :meth:`eval_asset_ids`, which complete a pin."""
        with self._lock:
            hit = self._eval.get((table, sid))
        if hit is not None:
            return hit
        got = self._raw(table, sid).to_table(
            columns=[key], filter=pc.field(SPLIT_COLUMN) != TRAIN_SPLIT
        )
        ids = pc.unique(got.column(key).combine_chunks())
        with self._lock:
            self._eval[(table, sid)] = ids
            while len(self._eval) > _CACHE_ENTRIES:
                self._eval.popitem(last=False)
        return ids

    # -- reads for the service's own use (eval rows included) -----------------------
    def read(
        self,
        table: str,
        pin: Mapping[str, int | None],
        where: pc.Expression,
        columns: list[str] | None = None,
    ) -> pa.Table:
        """Rows of ``table`` at ``pin`` where ``where`` holds, eval rows included (the
        caller decides what the principal may see)."""
        return self.dataset(table, pin, include_eval=True).to_table(columns=columns, filter=where)

    def lookup(
        self, table: str, pin: Mapping[str, int | None], column: str, values: list[str]
    ) -> pa.Table:
        """Rows of ``table`` at ``pin`` whose ``column`` is one of ``values`` (eval rows
        included), reading only the row groups that hold them: each data file gets a
        cached index of its keys on first use (data files never change)."""
        data = self._raw(table, pin.get(table))
        if not isinstance(data, ds.FileSystemDataset):
            return data.to_table(filter=pc.field(column).isin(values))
        wanted = np.unique(_key_hashes(pa.array(values, pa.string())))
        parts = []
        for fragment in data.get_fragments():
            index = self._key_index(fragment, column)
            rows = index.rows(wanted)
            if not rows.size:
                continue
            groups = np.searchsorted(index.starts, rows, side="right") - 1
            for group in np.unique(groups).tolist():
                part = fragment.subset(row_group_ids=[group]).to_table(schema=data.schema)
                local = rows[groups == group] - index.starts[group]
                parts.append(part.take(pa.array(local)))
        if not parts:
            return data.schema.empty_table()
        found = pa.concat_tables(parts)
        return found.filter(pc.is_in(found[column], value_set=pa.array(values, pa.string())))

    def _key_index(self, fragment: ds.ParquetFileFragment, column: str) -> _KeyIndex:
        key = (fragment.path, column)
        with self._lock:
            hit = self._indexes.get(key)
            if hit is not None:
                self._indexes.move_to_end(key)
                return hit
        made = _KeyIndex(fragment, column)
        with self._lock:
            self._indexes[key] = made
            self._index_bytes += made.nbytes
            while self._index_bytes > _INDEX_BYTES and len(self._indexes) > 1:
                _, old = self._indexes.popitem(last=False)
                self._index_bytes -= old.nbytes
        return made

    # -- unfiltered datasets ----------------------------------------------------------
    def _raw(self, table: str, sid: int | None) -> ds.Dataset:
        key = (table, sid)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        made = self._files_dataset(table, sid)
        with self._lock:
            self._cache[key] = made
            while len(self._cache) > _CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return made

    def _files_dataset(self, table: str, sid: int | None) -> ds.Dataset:
        return self.catalog.snapshot_dataset(table, sid)  # type: ignore[no-any-return]
