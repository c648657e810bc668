"""The partitioned selection: the clip view's join split by a hash bucket of ``clip_id``.

A ``clip_id`` is a SHA-256-derived hex id, so its leading 32 bits are already a uniform
hash: bucket ``p`` of ``P`` holds the ids whose leading 32 bits ``v`` satisfy
``ceil(p * 2^32 / P) <= v < ceil((p + 1) * 2^32 / P)``, a key range. Each partition's
join of clips x latents x scores x captions is independent of the others (every row of
those tables belongs to one clip), and the range is a row filter that Iceberg's column
bounds prune to the data files holding it (files compacted sorted by key hold few
ranges each). The asset side (assets with their near-duplicate links, tombstones and
status events: the exclusions and the asset columns of the view) is the broadcast set,
read once by the driver and sent to every worker once; each partition joins only the
rows of it that its clips reach (their assets' rows and every eval asset).

The driver plans each table's scan at the pin once (:func:`catalog.scan_plan.plan_scan`)
and deals its files to the partitions by their ``clip_id`` bounds
(:func:`catalog.scan_plan.split_plan`); an executor (:mod:`materializer.executors`)
runs :func:`run_partition` on each: the clip view query (:mod:`materializer.clip_view`)
over that partition's rows, reduced to its kept samples, drop counts, per-stream match
counts and eval clip ids
(:class:`Candidates`). The driver merges them in partition order and sorts the kept
samples by ``(rung, clip_id)``: a total order, so the merged candidates, and every
artifact cut from them, are the same for every executor and every ``P``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from catalog.scan_plan import ScanPlan, plan_scan, read_plan, split_plan
from materializer.clip_view import EVAL_CLIPS_SQL, candidate_params, candidate_sql
from materializer.coverage import (
    BackfillCoverage,
    CoverageSpec,
    backfill_coverage,
    merge_coverage,
)
from materializer.executors import Executor
from materializer.recipe import Recipe

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin

__all__ = [
    "MAX_PARTITIONS",
    "Candidates",
    "ViewQuery",
    "bucket_bounds",
    "bucket_of",
    "candidates_of",
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

#: The tables split by ``clip_id``; the others are the broadcast set.
CLIP_TABLES = ("clips", "latents", "scores", "captions")
BROADCAST_TABLES = ("assets", "tombstones", "asset_events")


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
    """

    kept: pa.Table
    drops: dict[str, int] = field(default_factory=dict)
    match_counts: list[int] = field(default_factory=list)
    count: int = 0
    eval_ids: list[str] = field(default_factory=list)
    backfill: BackfillCoverage | None = None


def bucket_bounds(p: int, partitions: int) -> tuple[str | None, str | None]:
    """The ``clip_id`` range ``[lo, hi)`` of bucket ``p`` of ``partitions`` (8-hex-digit
    prefixes; None for an open end)."""
    lo = -(-p * _SPACE // partitions)
    hi = -(-(p + 1) * _SPACE // partitions)
    return (f"{lo:08x}" if p > 0 else None, f"{hi:08x}" if p + 1 < partitions else None)


def bucket_of(clip_id: str, partitions: int) -> int:
    """The bucket of ``clip_id`` (the range of :func:`bucket_bounds` it falls in)."""
    return int(clip_id[:8], 16) * partitions // _SPACE


def candidates_of(table: pa.Table, num_streams: int, eval_ids: list[str]) -> Candidates:
    """The clip view query's rows reduced to :class:`Candidates`."""
    drops: dict[str, int] = {}
    reasons = table["drop_reason"]
    dropped = table.filter(pc.is_valid(reasons))
    for item in pc.value_counts(dropped["drop_reason"]).to_pylist():
        drops[item["values"]] = int(item["counts"])
    train = pc.fill_null(pc.not_equal(reasons, "eval"), True)
    counts = [
        int(pc.sum(pc.cast(pc.and_(table[f"_match_{i}"], train), pa.int64())).as_py() or 0)
        for i in range(num_streams)
    ]
    flags = [f"_match_{i}" for i in range(num_streams)]
    kept = table.filter(pc.is_null(reasons)).drop_columns(["drop_reason", *flags])
    kept = kept.sort_by([("rung", "ascending"), ("clip_id", "ascending")])
    return Candidates(kept, drops, counts, table.num_rows, eval_ids)


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


def query_candidates(query: ViewQuery, tables: dict[str, pa.Table]) -> Candidates:
    """The clip view over ``tables`` (every table of :data:`SCAN_COLUMNS`), reduced."""
    con = duckdb.connect(":memory:", config={"threads": 2})
    try:
        for name, table in tables.items():
            con.register(f"raw_{name}", table)
        table = con.sql(query.sql, params=query.params).to_arrow_table()
        eval_ids = [r[0] for r in con.sql(EVAL_CLIPS_SQL).fetchall()]
    finally:
        con.close()
    found = candidates_of(table, query.num_streams, eval_ids)
    if query.coverage is not None:
        found.backfill = backfill_coverage(query.coverage, table)
    return found


def run_partition(
    shared: tuple[ViewQuery, dict[str, pa.Table]], scans: dict[str, ScanPlan]
) -> Candidates:
    """One partition's candidates: its planned scans read here, joined with the
    broadcast set. A top-level function, so that a process pool or Ray can run it."""
    query, broadcast = shared
    tables = {name: read_plan(plan) for name, plan in scans.items()}
    tables.update(_asset_side(broadcast, tables["clips"]))
    return query_candidates(query, tables)


def _asset_side(broadcast: dict[str, pa.Table], clips: pa.Table) -> dict[str, pa.Table]:
    """The broadcast rows the partition's clips can reach: their assets' rows, and every
    eval asset (whose links say which assets are near-duplicates of eval). The clip
    view's answer for these clips is the same as over the whole asset side, and its
    join costs the partition, not the catalog."""
    mine = pc.unique(clips["asset_id"])
    out = dict(broadcast)
    for name in ("assets", "tombstones", "asset_events"):
        table = broadcast[name]
        keep = pc.is_in(table["asset_id"], value_set=mine)
        if name == "assets":
            keep = pc.or_(keep, pc.fill_null(pc.equal(table["split"], "eval"), False))
        out[name] = table.filter(keep)
    return out


def merge(parts: list[Candidates], recipe: Recipe) -> Candidates:
    """The candidates of every partition as one (kept samples in the total order)."""
    drops: dict[str, int] = {}
    for part in parts:
        for reason, n in part.drops.items():
            drops[reason] = drops.get(reason, 0) + n
    kept = pa.concat_tables([p.kept for p in parts], promote_options="permissive")
    return Candidates(
        kept=kept.sort_by([("rung", "ascending"), ("clip_id", "ascending")]),
        drops=drops,
        match_counts=[sum(c) for c in zip(*(p.match_counts for p in parts), strict=True)],
        count=sum(p.count for p in parts),
        eval_ids=sorted(i for p in parts for i in p.eval_ids),
        backfill=merge_coverage(recipe, backfills) if (backfills := _backfills(parts)) else None,
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
) -> Candidates:
    """The candidates of ``recipe`` at ``pin`` over ``partitions`` clip_id buckets run
    on ``executor``; ``filters`` are the per-table row filters of the recipe and
    ``scan(name)`` reads a broadcast table in full; ``coverage``: compute backfill
    coverage too."""
    # A recipe without scores reads none: that table is broadcast empty.
    names = [n for n in CLIP_TABLES if n != "scores" or recipe.score_versions()]
    broadcast = {name: scan(name) for name in SCAN_COLUMNS if name not in names}
    ranges = [bucket_bounds(p, partitions) for p in range(partitions)]
    # Each table is planned once and its files dealt to the ranges by their bounds.
    split = {
        name: split_plan(
            plan_scan(catalog, name, pin, SCAN_COLUMNS[name], filters.get(name)),
            "clip_id",
            ranges,
        )
        for name in names
    }
    tasks = [{name: plans[p] for name, plans in split.items()} for p in range(partitions)]
    query = ViewQuery.of(recipe, coverage=coverage)
    return merge(executor.map(run_partition, (query, broadcast), tasks), recipe)
