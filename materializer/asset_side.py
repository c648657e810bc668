"""The asset side of a partitioned cut, split by ``asset_id`` as the clips are by ``clip_id``.

No worker receives the whole asset side. It runs in two steps:

1. **Asset partitions.** One task per ``asset_id`` key range (the same ranges as the
   clips': an ``asset_id`` is SHA-256 hex too) reads that range's assets, tombstones and
   asset events (every row keyed by ``asset_id``) and reduces them with
   :data:`~materializer.clip_view.ASSET_VIEW_SQL` to one narrow row per asset: the
   view's asset columns, the near-duplicate links and the ``tombstoned`` and
   ``quarantined`` verdicts. It writes them as a *shard* in the cut's scratch directory
   (an Arrow IPC file sorted by ``asset_id`` and the sorted keys as a ``.npy``) and
   returns only its eval assets and what they are duplicates of (:class:`AssetPart`).
2. **The broadcast set** is those eval sets alone (:class:`EvalSets`, about 2% of the
   assets), sent to every clip partition. Each clip partition looks up the asset rows
   its own clips reference (:func:`lookup`): a binary search of its sorted asset ids
   in each shard's memory-mapped keys, then a ``take`` of those rows, one shard at a
   time, so it touches the pages of its rows, not the catalog's. It adds
   ``eval_duplicate`` with :data:`~materializer.clip_view.ASSET_VERDICT_SQL`.

The one-process cut runs the same statements over all assets at once
(:func:`asset_view`, :func:`eval_sets`, :func:`register_asset_view`;
:func:`asset_view_of` returns the result as a table), so both give the same rows. The scratch files
live only while the cut runs (temp + rename, no fsync: a crashed cut restarts from its
scans and never reads them again), and must be visible to every worker: the cut's
temp directory on this machine, or a directory every node mounts at the same path
(``Execution.scratch``, the ``cut_scratch`` setting) on a multi-host Ray cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog.errors import StorageError
from catalog.scan_plan import ScanPlan, read_plan
from materializer.clip_view import (
    ASSET_VERDICT_SQL,
    ASSET_VERDICT_UNORDERED_SQL,
    ASSET_VIEW_PARAMS,
    ASSET_VIEW_SQL,
    ASSET_VIEW_UNORDERED_SQL,
    EVAL_SETS_SQL,
)

__all__ = [
    "ASSET_TABLES",
    "AssetPart",
    "AssetTask",
    "EvalSets",
    "Shard",
    "asset_partition",
    "asset_view",
    "asset_view_of",
    "eval_sets",
    "lookup",
    "referenced",
    "register_asset_view",
    "run_asset_partition",
    "with_verdicts",
]

#: The tables of the asset side, every row keyed by ``asset_id``.
ASSET_TABLES = ("assets", "tombstones", "asset_events")


@dataclass(frozen=True)
class Shard:
    """One asset partition's rows in the scratch directory: ``<path>.arrow`` (the asset
    view rows, sorted by ``asset_id``) and ``<path>.keys.npy`` (their sorted ids), for
    the ``asset_id`` range ``[lo, hi)`` (None: an open end)."""

    path: str
    lo: str | None
    hi: str | None


@dataclass(frozen=True)
class AssetTask:
    """One asset partition: its planned scans of :data:`ASSET_TABLES` and its shard."""

    scans: dict[str, ScanPlan]
    shard: Shard


@dataclass
class AssetPart:
    """What an asset partition returns to the driver: its share of the eval sets."""

    eval_ids: pa.Array
    eval_targets: pa.Array
    rows: int = 0


@dataclass(frozen=True)
class EvalSets:
    """The broadcast set: every eval asset, and every asset an eval asset is a
    duplicate of (each a sorted, distinct ``large_string`` array: about 70 bytes per
    id, however it travels)."""

    eval_ids: pa.Array
    eval_targets: pa.Array

    @classmethod
    def of(cls, parts: list[AssetPart]) -> EvalSets:
        return cls(
            _sorted_distinct([p.eval_ids for p in parts]),
            _sorted_distinct([p.eval_targets for p in parts]),
        )

    def tables(self) -> dict[str, pa.Table]:
        return {
            "eval_ids": pa.table({"asset_id": self.eval_ids}),
            "eval_targets": pa.table({"asset_id": self.eval_targets}),
        }


def _sorted_distinct(arrays: list[pa.Array]) -> pa.Array:
    ids = pa.concat_arrays([a.cast(pa.large_string()) for a in arrays] or [_NO_IDS])
    ids = pc.unique(ids).drop_null()
    return pc.take(ids, pc.sort_indices(ids))


_NO_IDS = pa.array([], pa.large_string())


def run_asset_partition(_: None, task: AssetTask) -> AssetPart:
    """Asset partition ``task``: its scans read here, then :func:`asset_partition`.
    A top-level function, so that a process pool or Ray can run it."""
    return asset_partition({name: read_plan(plan) for name, plan in task.scans.items()}, task.shard)


def asset_partition(tables: dict[str, pa.Table], shard: Shard) -> AssetPart:
    """The rows of :data:`ASSET_TABLES` in ``shard``'s range reduced to the asset view,
    written as ``shard``; returns the range's eval sets."""
    con = duckdb.connect(":memory:", config={"threads": 2})
    try:
        view = asset_view(con, tables)
        evals = eval_sets(con, view)
    finally:
        con.close()
    _write_shard(shard, view)
    return AssetPart(evals.eval_ids, evals.eval_targets, view.num_rows)


def asset_view(
    con: duckdb.DuckDBPyConnection, tables: dict[str, pa.Table], *, ordered: bool = True
) -> pa.Table:
    """The asset view rows of ``tables`` (every one of :data:`ASSET_TABLES`), on ``con``;
    sorted by ``asset_id`` unless not ``ordered`` (the one-process cut only joins them)."""
    for name in ASSET_TABLES:
        con.register(f"raw_{name}", tables[name])
    sql = ASSET_VIEW_SQL if ordered else ASSET_VIEW_UNORDERED_SQL
    view = con.sql(sql, params=ASSET_VIEW_PARAMS).to_arrow_table()
    for name in ASSET_TABLES:
        con.unregister(f"raw_{name}")
    return view


def eval_sets(con: duckdb.DuckDBPyConnection, view: pa.Table) -> EvalSets:
    """The eval sets of the asset view rows ``view``."""
    con.register("av", view)
    sets = con.sql(EVAL_SETS_SQL).to_arrow_table()
    con.unregister("av")
    kind = sets["kind"]
    return EvalSets(
        _sorted_distinct([pc.filter(sets["asset_id"], pc.equal(kind, "eval")).combine_chunks()]),
        _sorted_distinct([pc.filter(sets["asset_id"], pc.equal(kind, "target")).combine_chunks()]),
    )


def register_asset_view(
    con: duckdb.DuckDBPyConnection, view: pa.Table, evals: EvalSets, *, ordered: bool = True
) -> None:
    """``raw_asset_view`` on ``con``: the asset view rows ``view`` with
    ``eval_duplicate`` (by the catalog's ``evals``) and without the links; sorted by
    ``asset_id`` unless not ``ordered``."""
    con.register("av", view)
    for name, table in evals.tables().items():
        con.register(name, table)
    sql = ASSET_VERDICT_SQL if ordered else ASSET_VERDICT_UNORDERED_SQL
    con.execute(f"CREATE TEMP TABLE raw_asset_view AS {sql}")
    for name in ("av", *evals.tables()):
        con.unregister(name)


def with_verdicts(view: pa.Table, evals: EvalSets) -> pa.Table:
    """``raw_asset_view`` of ``view`` as a table (:func:`register_asset_view`)."""
    con = duckdb.connect(":memory:", config={"threads": 1})
    try:
        register_asset_view(con, view, evals)
        return con.sql("SELECT * FROM raw_asset_view").to_arrow_table()
    finally:
        con.close()


def asset_view_of(tables: dict[str, pa.Table]) -> pa.Table:
    """``raw_asset_view`` over ``tables`` in one process: what a partitioned cut's
    shards and lookups give, computed from all of it at once."""
    con = duckdb.connect(":memory:", config={"threads": 1})
    try:
        view = asset_view(con, tables)
        return with_verdicts(view, eval_sets(con, view))
    finally:
        con.close()


# -- shards ---------------------------------------------------------------------------
def _write_shard(shard: Shard, view: pa.Table) -> None:
    """The asset view rows (sorted by ``asset_id``) and their keys, each written to a
    temp name and renamed, so a reader sees a whole file or none."""
    keys = _keys(view["asset_id"])
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        raise StorageError(f"asset shard {shard.path}: ids not sorted and distinct")
    arrow, npy = Path(f"{shard.path}.arrow"), Path(f"{shard.path}.keys.npy")
    tmp = arrow.with_name(arrow.name + ".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, view.schema) as writer:
        writer.write_table(view)
    os.replace(tmp, arrow)
    tmp = npy.with_name(npy.name + ".tmp")
    with open(tmp, "wb") as out:
        np.save(out, keys, allow_pickle=False)
    os.replace(tmp, npy)


def _keys(ids: pa.ChunkedArray | pa.Array) -> NDArray[np.bytes_]:
    """``ids`` as a fixed-width byte-string array (NUL-padded; order kept: ids are
    text without NUL)."""
    values = [s.encode() for s in ids.to_pylist()]
    width = max((len(v) for v in values), default=1)
    return np.array(values, dtype=f"S{width}")


def lookup(shards: tuple[Shard, ...], asset_ids: pa.Array) -> pa.Table:
    """The shard rows of ``asset_ids`` (sorted, distinct), in ``asset_id`` order: each
    shard is searched for the ids in its range only, and unmapped before the next.

    Raises:
        StorageError: A shard is missing (the scratch directory is not shared with
            this worker).
    """
    ids = np.array([s.encode() for s in asset_ids.to_pylist()], dtype=object)
    parts: list[pa.Table] = []
    for shard in shards:
        lo = 0 if shard.lo is None else int(np.searchsorted(ids, shard.lo.encode()))
        hi = ids.size if shard.hi is None else int(np.searchsorted(ids, shard.hi.encode()))
        if hi > lo:
            parts.append(_take(shard, ids[lo:hi]))
    if not parts:
        return _schema_of(shards[0]).empty_table() if shards else pa.table({})
    return pa.concat_tables(parts)


def _take(shard: Shard, wanted: NDArray[np.object_]) -> pa.Table:
    """The rows of ``wanted`` ids found in ``shard``."""
    try:
        keys = np.load(f"{shard.path}.keys.npy", mmap_mode="r", allow_pickle=False)
        source = pa.memory_map(f"{shard.path}.arrow")
    except FileNotFoundError as exc:
        raise StorageError(
            f"asset shard {shard.path} is not visible here: a cut's scratch directory must "
            "be shared by every worker (the cut_scratch setting on a multi-host cluster)",
            path=shard.path,
        ) from exc
    try:
        width = keys.dtype.itemsize
        fits = np.array([len(w) <= width for w in wanted], dtype=bool)
        want = np.array(list(wanted[fits]), dtype=f"S{width}") if fits.any() else keys[:0]
        at = np.searchsorted(keys, want) if keys.size else np.zeros(0, np.int64)
        inside = at < keys.size
        found = at[inside][keys[at[inside]] == want[inside]]
        table = pa.ipc.open_file(source).read_all()
        return table.take(pa.array(found, pa.int64())).combine_chunks()
    finally:
        source.close()
        del keys


def _schema_of(shard: Shard) -> pa.Schema:
    with pa.memory_map(f"{shard.path}.arrow") as source:
        return pa.ipc.open_file(source).schema


def referenced(clips: pa.Table) -> pa.Array:
    """The distinct asset ids ``clips`` reference, sorted."""
    ids = pc.unique(clips["asset_id"].combine_chunks()).drop_null()
    return pc.take(ids, pc.sort_indices(ids))
