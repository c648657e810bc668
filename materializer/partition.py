"""The partitioned selection: the clip view's join split by a hash bucket of ``clip_id``.

A ``clip_id`` is a SHA-256-derived hex id, so its leading 32 bits are already a uniform
hash: bucket ``p`` of ``P`` holds the ids whose leading 32 bits ``v`` satisfy
``ceil(p * 2^32 / P) <= v < ceil((p + 1) * 2^32 / P)``, a key range. Each partition's
join of clips x latents x scores x captions is independent of the others (every row of
those tables belongs to one clip), and the range is a row filter that Iceberg's column
bounds prune to the data files holding it (files compacted sorted by key hold few
ranges each). The asset side (assets with their near-duplicate links, tombstones and
status events: the exclusions and the asset columns of the view) is split the same
way by ``asset_id`` (:mod:`materializer.asset_side`): asset partitions first reduce
their range to one narrow row per asset, written as a shard in the cut's scratch
directory, and each clip partition looks up only the rows of the assets its clips
reference. The only broadcast set is the eval assets and what they are duplicates of.

The driver plans each table's scan at the pin once (:func:`catalog.scan_plan.plan_scan`)
and deals its files to the partitions by their ``clip_id`` (``asset_id``) bounds
(:func:`catalog.scan_plan.split_plan`); an executor (:mod:`materializer.executors`)
runs :func:`~materializer.asset_side.run_asset_partition` on each asset range, then
:func:`run_partition` on each clip range: the clip view query
(:mod:`materializer.clip_view`) over that partition's rows, reduced to its kept
samples, drop counts, per-stream match counts and eval clip ids (:class:`Candidates`).
Each partition writes its kept samples to a file in the cut's scratch and returns only
the columns the driver reads (:mod:`materializer.partition_merge`); the driver merges
them in partition order and sorts them by ``(rung, clip_id)``: a total order, so the
merged candidates, and every artifact cut from them (the manifest and index streamed
from the files), are the same for every executor and every ``P``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from catalog.scan_plan import ScanPlan, plan_scan, read_plan, split_plan
from materializer.asset_side import (
    ASSET_TABLES,
    AssetTask,
    EvalSets,
    Shard,
    asset_view,
    eval_sets,
    lookup,
    referenced,
    register_asset_view,
    run_asset_partition,
)
from materializer.clip_view import EVAL_CLIPS_SQL, candidate_params, candidate_sql
from materializer.coverage import (
    BackfillCoverage,
    CoverageSpec,
    backfill_coverage,
    merge_coverage,
)
from materializer.executors import Executor
from materializer.gather import take_wide
from materializer.kept_rows import sorted_narrow
from materializer.key_order import rung_clip_order
from materializer.memory import release_unused
from materializer.partition_merge import (
    KeptParts,
    driver_columns,
    merge_order,
    new_parts,
    spill_kept,
)
from materializer.recipe import Recipe

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin

__all__ = [
    "MAX_PARTITIONS",
    "Candidates",
    "ClipShared",
    "ViewQuery",
    "asset_partitions",
    "bucket_bounds",
    "bucket_of",
    "candidates_of",
    "partition_inputs",
    "partitioned_candidates",
    "run_partition",
]

#: The most partitions a cut may have (each is one task and one bound of the scans).
MAX_PARTITIONS = 65536
_SPACE = 1 << 32

#: Columns of the scans, by table (the clip view's inputs).
SCAN_COLUMNS: dict[str, list[str]] = {
    "assets": [
        "asset_id", "source", "source_tier", "license_id", "territory", "pii_class",
        "probe_codec", "probe_bitrate", "split", "duplicate_of", "near_duplicates",
    ],
    "clips": [
        "clip_id", "asset_id", "t_start_s", "t_end_s", "fps", "num_frames", "width",
        "height", "split", "job_id",
    ],
    "latents": [
        "clip_id", "rung", "tokenizer_version", "format", "object_sha256", "offset",
        "length", "member_sha256", "tensor_keys", "latent_frames", "tokens", "job_id",
        "ingested_at",
    ],
    "scores": ["clip_id", "filter_name", "filter_version", "score", "job_id", "computed_at"],
    "captions": [
        "clip_id", "caption_version", "kind", "text", "text_embedding_sha256",
        "model_version", "ingested_at",
    ],
    "tombstones": ["asset_id", "kind"],
    "asset_events": ["asset_id", "event", "at"],
}  # fmt: skip

#: The tables split by ``clip_id``; the others (:data:`ASSET_TABLES`) by ``asset_id``.
CLIP_TABLES = ("clips", "latents", "scores", "captions")


@dataclass
class Candidates:
    """The clip view reduced: what selection needs of it.

    Attributes:
        kept: The candidate samples without a drop reason, sorted by ``(rung, clip_id)``,
            without ``drop_reason`` and the ``_match_<i>`` flags.
        drops: Candidate samples dropped by the query, by reason.
        match_counts: Per stream, the train candidates its predicate matches.
        count: Candidate samples before any drop.
        eval_ids: The eval clip ids of the pinned catalog, sorted.
        backfill: Which candidate clips lack the recipe's score and caption versions
            (:mod:`materializer.coverage`).
        spill: A clip partition's: the file its kept samples were written to, when
            ``kept`` holds only the driver columns (:mod:`materializer.partition_merge`).
        parts: The merged candidates' partition files, when ``kept`` holds only the
            driver columns with ``_part`` and ``_pos``; the caller closes it.
        rows: The query's rows, every candidate (unsorted, without ``drop_reason``
            and the flags), when ``kept`` holds only the narrow columns asked for
            with each row's position in them (:mod:`materializer.kept_rows`).
    """

    kept: pa.Table
    drops: dict[str, int] = field(default_factory=dict)
    match_counts: list[int] = field(default_factory=list)
    count: int = 0
    eval_ids: list[str] = field(default_factory=list)
    backfill: BackfillCoverage | None = None
    spill: str | None = None
    parts: KeptParts | None = None
    rows: pa.Table | None = None


def bucket_bounds(p: int, partitions: int) -> tuple[str | None, str | None]:
    """The ``clip_id`` range ``[lo, hi)`` of bucket ``p`` of ``partitions`` (8-hex-digit
    prefixes; None for an open end)."""
    lo = -(-p * _SPACE // partitions)
    hi = -(-(p + 1) * _SPACE // partitions)
    return (f"{lo:08x}" if p > 0 else None, f"{hi:08x}" if p + 1 < partitions else None)


def bucket_of(clip_id: str, partitions: int) -> int:
    """The bucket of ``clip_id`` (the range of :func:`bucket_bounds` it falls in)."""
    return int(clip_id[:8], 16) * partitions // _SPACE


def candidates_of(
    table: pa.Table, num_streams: int, eval_ids: list[str], narrow: tuple[str, ...] = ()
) -> Candidates:
    """The clip view query's rows reduced to :class:`Candidates`; with ``narrow``, the
    kept rows sorted hold only those columns and their position in ``rows`` (the
    one-process cut gathers the wide columns once, in manifest order: decision 063)."""
    drops: dict[str, int] = {}
    reasons = table["drop_reason"]
    for item in pc.value_counts(reasons.drop_null()).to_pylist():
        drops[item["values"]] = int(item["counts"])
    train = pc.fill_null(pc.not_equal(reasons, "eval"), True)
    counts = [
        int(pc.sum(pc.cast(pc.and_(table[f"_match_{i}"], train), pa.int64())).as_py() or 0)
        for i in range(num_streams)
    ]
    flags = [f"_match_{i}" for i in range(num_streams)]
    rows, keep = table.drop_columns(["drop_reason", *flags]), pc.is_null(reasons)
    if narrow:
        kept = sorted_narrow(rows, keep, narrow)
        return Candidates(kept, drops, counts, table.num_rows, eval_ids, rows=rows)
    return Candidates(_kept_sorted(rows, keep), drops, counts, table.num_rows, eval_ids)


def _kept_sorted(table: pa.Table, keep: pa.ChunkedArray) -> pa.Table:
    """The rows of ``table`` where ``keep``, sorted by ``(rung, clip_id)`` (stable):
    the key columns are sorted alone and every column is gathered once (a filter and
    then a sort copied the wide rows twice)."""
    at = pc.indices_nonzero(keep)
    keys = table.select(["rung", "clip_id"]).take(at)
    fast = rung_clip_order(keys["rung"], keys["clip_id"])  # integer keys (decision 057)
    if fast is not None:
        return take_wide(table, pc.take(at, pa.array(fast)))
    order = pc.sort_indices(keys, sort_keys=[("rung", "ascending"), ("clip_id", "ascending")])
    return take_wide(table, pc.take(at, order))


@dataclass(frozen=True)
class ViewQuery:
    """The clip view query of one recipe, as plain values that pickle: its text, its
    parameters and the number of streams (:mod:`materializer.clip_view`)."""

    sql: str
    params: dict[str, Any]
    num_streams: int
    #: The backfill coverage query of the partition's rows (the recipe does not
    #: pickle), or None when the caller does not need coverage.
    coverage: CoverageSpec | None

    @classmethod
    def of(cls, recipe: Recipe, *, coverage: bool = True) -> ViewQuery:
        return cls(
            candidate_sql(recipe),
            candidate_params(recipe),
            len(recipe.streams),
            CoverageSpec.of(recipe) if coverage else None,
        )


def query_candidates(
    query: ViewQuery,
    tables: dict[str, pa.Table],
    evals: EvalSets | None = None,
    narrow: tuple[str, ...] = (),
) -> Candidates:
    """The clip view over ``tables``, reduced. ``tables`` are the clip tables of
    :data:`SCAN_COLUMNS` and either ``asset_rows`` (the asset view rows of the clips'
    assets, :mod:`materializer.asset_side`) with the catalog's ``evals``, or, for the
    plain cut, the raw asset tables (the asset view is computed here from all of them).
    ``narrow``: see :func:`candidates_of`."""
    con = duckdb.connect(":memory:", config={"threads": 2})
    try:
        # The plain cut only joins the asset view: no sort (a shard's must be sorted).
        ordered = evals is not None
        if evals is None:
            view = asset_view(con, tables, ordered=False)
            evals = eval_sets(con, view)
        else:
            view = tables["asset_rows"]
        register_asset_view(con, view, evals, ordered=ordered)
        for name in CLIP_TABLES:
            con.register(f"raw_{name}", tables[name])
        table = con.sql(query.sql, params=query.params).to_arrow_table()
        eval_ids = [r[0] for r in con.sql(EVAL_CLIPS_SQL).fetchall()]
    finally:
        con.close()
    found = candidates_of(table, query.num_streams, eval_ids, narrow)
    if query.coverage is not None:
        found.backfill = backfill_coverage(query.coverage, table)
    return found


@dataclass(frozen=True)
class ClipShared:
    """What every clip partition receives once: the query, the broadcast eval sets,
    the asset shards to look its assets up in, and the empty tables of a recipe that
    reads none of them (scores without score versions); ``spill``, the directory the
    partitions write their kept samples to, returning only the driver ``columns``
    (None: every column is returned)."""

    query: ViewQuery
    evals: EvalSets
    shards: tuple[Shard, ...]
    empty: dict[str, pa.Table]
    spill: str | None = None
    columns: tuple[str, ...] = ()


def partition_inputs(shared: ClipShared, scans: dict[str, ScanPlan]) -> dict[str, pa.Table]:
    """A clip partition's inputs: its planned scans, read here, and ``asset_rows``, the
    asset view rows of the assets its clips reference: nothing else of the asset side."""
    tables = {name: read_plan(plan) for name, plan in scans.items()}
    tables.update(shared.empty)
    tables["asset_rows"] = lookup(shared.shards, referenced(tables["clips"]))
    return tables


def run_partition(shared: ClipShared, scans: dict[str, ScanPlan]) -> Candidates:
    """One clip partition's candidates (:func:`partition_inputs`, then the clip view);
    with ``shared.spill``, its kept samples written there and only the driver columns
    returned. A top-level function, so that a process pool or Ray can run it."""
    found = query_candidates(shared.query, partition_inputs(shared, scans), shared.evals)
    if shared.spill is not None:
        found.kept, found.spill = spill_kept(found.kept, shared.spill, shared.columns)
    return found


def merge(parts: list[Candidates], recipe: Recipe, kept_parts: KeptParts | None) -> Candidates:
    """The candidates of every partition as one (kept samples in the total order;
    with ``kept_parts``, the driver columns and the partitions' files there)."""
    drops: dict[str, int] = {}
    for part in parts:
        for reason, n in part.drops.items():
            drops[reason] = drops.get(reason, 0) + n
    if kept_parts is not None:
        kept_parts.files = [str(p.spill) for p in parts]
        kept = merge_order([p.kept for p in parts])
    else:
        kept = pa.concat_tables([p.kept for p in parts], promote_options="permissive")
        kept = kept.sort_by([("rung", "ascending"), ("clip_id", "ascending")])
    for part in parts:
        part.kept = kept.schema.empty_table()  # the partitions' copies, merged now
    release_unused()  # the concatenation before the sort, freed
    return Candidates(
        kept=kept,
        drops=drops,
        match_counts=[sum(c) for c in zip(*(p.match_counts for p in parts), strict=True)],
        count=sum(p.count for p in parts),
        eval_ids=sorted(i for p in parts for i in p.eval_ids),
        backfill=merge_coverage(recipe, backfills) if (backfills := _backfills(parts)) else None,
        parts=kept_parts,
    )


def _backfills(parts: list[Candidates]) -> list[BackfillCoverage]:
    return [p.backfill for p in parts if p.backfill is not None]


def partitioned_candidates(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    pin: Pin,
    filters: dict[str, Any],
    *,
    executor: Executor,
    partitions: int,
    scan: Callable[[str], pa.Table],
    coverage: bool = True,
    scratch: str | None = None,
    spill_kept: bool = True,
) -> Candidates:
    """The candidates of ``recipe`` at ``pin`` over ``partitions`` ``clip_id`` buckets
    run on ``executor``, after the asset partitions (:func:`asset_partitions` of them,
    by ``asset_id``) have written their shards to a temp directory under ``scratch``
    (None: the system's), removed whatever happens. ``filters`` are the per-table row
    filters of the recipe, ``scan(name)`` reads a table the recipe reads none of,
    ``coverage``: compute backfill coverage too.

    The clip partitions write their kept samples to a new directory under ``scratch``
    (:mod:`materializer.partition_merge`) and return the driver columns only: the
    result's ``parts`` names the files, and the caller closes it (removed here if the
    map fails). ``spill_kept=False``: the partitions return every column and the
    driver holds them all (the path before; benchmarks compare the two)."""
    # A recipe without scores reads none: that table is sent empty.
    names = [n for n in CLIP_TABLES if n != "scores" or recipe.score_versions()]
    empty = {name: scan(name) for name in CLIP_TABLES if name not in names}
    # Each table is planned once and its files dealt to the ranges by their bounds.
    plans = {
        name: plan_scan(catalog, name, pin, SCAN_COLUMNS[name], filters.get(name))
        for name in (*names, *ASSET_TABLES)
    }
    clip_ranges = [bucket_bounds(p, partitions) for p in range(partitions)]
    count = asset_partitions(plans["assets"].rows, plans["clips"].rows, partitions)
    asset_ranges = [bucket_bounds(p, count) for p in range(count)]
    with (
        tempfile.TemporaryDirectory(prefix="vidlake-cut-", dir=scratch) as tmp,
        _pool_session(executor),
    ):
        shards = tuple(
            Shard(str(Path(tmp) / f"assets-{p:05d}"), *r) for p, r in enumerate(asset_ranges)
        )
        split = {name: split_plan(plans[name], "asset_id", asset_ranges) for name in ASSET_TABLES}
        asset_tasks = [
            AssetTask({name: split[name][p] for name in ASSET_TABLES}, shard)
            for p, shard in enumerate(shards)
        ]
        parts = executor.map(run_asset_partition, None, asset_tasks, label="asset partition")
        split = {name: split_plan(plans[name], "clip_id", clip_ranges) for name in names}
        tasks = [{name: split[name][p] for name in names} for p in range(partitions)]
        query = ViewQuery.of(recipe, coverage=coverage)
        if not spill_kept:
            shared = ClipShared(query, EvalSets.of(parts), shards, empty)
            return merge(executor.map(run_partition, shared, tasks), recipe, None)
        kept = new_parts(scratch)
        try:
            shared = ClipShared(
                query, EvalSets.of(parts), shards, empty, kept.directory, driver_columns(recipe)
            )
            return merge(executor.map(run_partition, shared, tasks), recipe, kept)
        except BaseException:
            kept.close()
            raise


def _pool_session(executor: Executor) -> AbstractContextManager[Any]:
    """``executor`` itself where it keeps a pool for the maps inside it (the local
    pool), so that both stages share its workers; else nothing."""
    return executor if isinstance(executor, AbstractContextManager) else nullcontext()


def asset_partitions(asset_rows: int, clip_rows: int, partitions: int) -> int:
    """How many ``asset_id`` ranges the asset side is cut into: enough that each holds
    about as many asset rows as a clip partition holds clip rows (the rows the
    planned scans read), at most ``partitions``, at least one."""
    per = max(1, -(-clip_rows // partitions))
    return max(1, min(partitions, -(-asset_rows // per)))
