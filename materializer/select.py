"""Selection: a recipe at a pinned catalog state becomes the candidate samples of a cut.

The pinned Iceberg scans are registered in an in-memory DuckDB as Arrow tables (never
Python lists) and one query (:mod:`materializer.clip_view`) builds the clip view of
``docs/recipes.md`` (in this process, or per ``clip_id`` partition on an executor when
an ``execution`` is given: :mod:`materializer.partition`, the same result): clips x
assets x latents (the recipe's tokenizer, each phase's rung) x pivoted scores (the
named versions) x captions (the named version and kinds).
Every candidate sample (a clip at one rung) gets the *first* reason it is dropped, in
this order:

``eval``, ``tombstoned``, ``quarantined``, ``duplicate_asset`` (a near-duplicate of a
kept asset, linked at ingest), ``eval_duplicate_asset`` (near-duplicate of an eval
asset), ``no_latent``, ``missing_score:<name>@<version>`` (no score of the version:
a backfill not done, :mod:`materializer.coverage`), ``filter:<name>`` (outside the
filter's bounds), ``no_caption``,
``no_bucket``, ``no_stream``; then, over embeddings, ``eval_near_duplicate`` and
``semantic_dedup``; finally ``not_in_any_phase`` (no phase draws the sample: its tier
is gated out or its stream has no weight at its rung).

Counts are of candidate samples. Everything returned is sorted by ``(rung, clip_id)``
so that the result does not depend on scan or thread order.

The same query flags, per stream, the train candidates its predicate matches (before
any drop but ``eval``, regardless of earlier streams): a stream that matches nothing at
the pin is a recipe error (``InvalidRecipe`` at ``streams[i].where``), not a silently
empty stream. Embeddings are read at the pin's LanceDB versions, and decontamination
compares against the eval clips of the pinned catalog (see :mod:`materializer.dedup`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog.errors import InvalidInput, InvalidRecipe
from materializer.centroids import CentroidConfig, CentroidSet, CentroidStore
from materializer.coverage import BackfillCoverage
from materializer.dedup import Decontamination, decontaminate, semdedup
from materializer.executors import Executor, LocalExecutor
from materializer.partition import (
    SCAN_COLUMNS,
    Candidates,
    ViewQuery,
    partitioned_candidates,
    query_candidates,
)
from materializer.partition_merge import KeptParts
from materializer.recipe import Recipe

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin
    from catalog.reads import RowFilter

__all__ = [
    "Execution",
    "Selection",
    "candidate_coverage",
    "check_pools",
    "check_stream_matches",
    "phase_mask",
    "pinned_centroids",
    "select",
    "stream_match_counts",
]

Progress = Callable[[str, float], None]


@dataclass
class Selection:
    """The samples a cut keeps, and why the others were dropped.

    Attributes:
        samples: One row per kept sample, sorted by ``(rung, clip_id)``: the clip view
            columns plus latent location, captions, tier, stream and bucket ids.
        drops: Candidate samples dropped, by reason.
        candidates: Candidate samples before any drop.
        stream_names: Stream names by id (the recipe's order).
        decontamination: What eval decontamination checked (None without it).
        centroids: The semantic dedup's fitted centroids (None without it).
        backfill: Which candidate clips lack the recipe's score and caption versions.
        parts: A partitioned selection's kept-sample files: ``samples`` then holds
            only the columns a cut's driver reads (:mod:`materializer.partition_merge`)
            and the caller removes the files (:meth:`close`).
        rows: A narrow one-process selection's query rows (every candidate, unsorted):
            ``samples`` then holds only the columns selection reads and each row's
            position in ``rows`` (:mod:`materializer.kept_rows`).
    """

    samples: pa.Table
    drops: dict[str, int]
    candidates: int
    stream_names: list[str]
    decontamination: Decontamination | None = None
    centroids: CentroidSet | None = None
    backfill: BackfillCoverage | None = None
    parts: KeptParts | None = None
    rows: pa.Table | None = None

    def close(self) -> None:
        """Remove a partitioned selection's kept-sample files (else nothing)."""
        if self.parts is not None:
            self.parts.close()


def select(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    pin: Pin,
    *,
    progress: Progress | None = None,
    execution: Execution | None = None,
    coverage: bool = True,
    narrow: bool = False,
) -> Selection:
    """Evaluate ``recipe`` against the catalog at ``pin``.

    Args:
        catalog: The catalog to read (only at ``pin``).
        recipe: A validated recipe.
        pin: The catalog state to read.
        progress: Called with ``(stage, fraction)``.
        execution: Where the clip view's join runs, over how many ``clip_id``
            partitions (:mod:`materializer.partition`); None: one, in this process.
            The selection does not depend on it.
        coverage: Compute the backfill coverage (``Selection.backfill``; a cut needs
            it only for a ``min_coverage`` gate).
        narrow: In one process, return the sorted samples as only the columns
            selection reads, the rest in ``Selection.rows`` (a cut gathers them once,
            in manifest order: :mod:`materializer.kept_rows`).

    A partitioned selection's samples hold only the columns a cut's driver reads,
    the rest in files the caller removes (:meth:`Selection.close`).
    """
    report = progress or (lambda stage, fraction: None)
    found = _candidates(catalog, recipe, pin, report, execution, coverage=coverage, narrow=narrow)
    try:
        return _selected(catalog, recipe, pin, found, report)
    except BaseException:
        if found.parts is not None:
            found.parts.close()  # a failed selection leaves no kept-sample files
        raise


def _selected(
    catalog: VidlakeCatalog, recipe: Recipe, pin: Pin, found: Candidates, report: Progress
) -> Selection:
    """The candidates through every later drop (:func:`select`)."""
    report("join", 1.0)
    check_stream_matches(recipe, found.match_counts)
    candidates = found.count
    drops: dict[str, int] = dict(found.drops)
    table = found.kept
    # Taken: each drop's filtered copy then replaces the rows, instead of living
    # beside the merged candidates until selection returns (decision 059).
    found.kept = table.schema.empty_table()
    table = _drop_where(table, pc.is_null(table["latent_frames"]), "no_latent_frames", drops)
    if recipe.tensor_keys:
        table = _drop_where(
            table, _lacks_keys(table, recipe.tensor_keys), "missing_tensor_keys", drops
        )

    # Buckets (vectorised in numpy through the recipe's lattice).
    bucket = recipe.buckets.assign(
        table["latent_frames"].to_numpy(zero_copy_only=False),
        table["aspect"].to_numpy(zero_copy_only=False),
    )
    table = table.append_column("bucket", pa.array(bucket, pa.int32()))
    table = _drop_where(table, pc.equal(table["bucket"], -1), "no_bucket", drops)
    table = _drop_where(table, pc.is_null(table["stream"]), "no_stream", drops)

    report("embeddings", 0.0)
    table, decontamination, centroids = _embedding_drops(
        catalog, recipe, pin, table, found.eval_ids, drops
    )
    report("embeddings", 1.0)
    # Still in ``(rung, clip_id)`` order: the candidates come sorted and every step
    # since only filters rows or adds columns (sorting again gathered every row anew).
    table = _phase_gate(recipe, table, drops)
    return Selection(
        samples=table,
        drops={k: drops[k] for k in sorted(drops)},
        candidates=candidates,
        stream_names=[s.name for s in recipe.streams],
        decontamination=decontamination,
        centroids=centroids,
        backfill=found.backfill,
        parts=found.parts,
        rows=found.rows,
    )


def stream_match_counts(catalog: VidlakeCatalog, recipe: Recipe, pin: Pin) -> list[int]:
    """Per stream, the train candidate samples its predicate matches at ``pin``
    (before every drop but ``eval``, each stream on its own: no first-match rule)."""
    report = lambda stage, fraction: None  # noqa: E731
    return _candidates(catalog, recipe, pin, report, None, coverage=False).match_counts


@dataclass(frozen=True)
class Execution:
    """How a selection runs: an executor and a number of ``clip_id`` partitions.

    ``scratch``: where the partitioned cut's temp directory of asset shards goes (None:
    the system's temp directory); on a multi-host Ray cluster, a directory every node
    mounts at the same path (:mod:`materializer.asset_side`); the clip partitions'
    kept samples go there too. ``spill_kept=False`` returns every kept column to
    the driver instead (the earlier path, for benchmarks; the same artifacts)."""

    executor: Executor
    partitions: int = 1
    scratch: str | None = None
    spill_kept: bool = True


def candidate_coverage(catalog: VidlakeCatalog, recipe: Recipe, pin: Pin) -> BackfillCoverage:
    """Backfill coverage of the candidate query's rows at ``pin`` (what a cut computes
    on the way, :mod:`materializer.coverage`), without the rest of the selection."""
    found = _candidates(catalog, recipe, pin, lambda stage, fraction: None, None)
    assert found.backfill is not None
    return found.backfill


def _candidates(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    pin: Pin,
    report: Progress,
    execution: Execution | None,
    *,
    coverage: bool = True,
    narrow: bool = False,
) -> Candidates:
    """The clip view's rows reduced to the kept samples and the counts selection needs
    (with ``narrow``, in one process, the sorted samples' narrow columns: :func:`select`)."""
    filters = _row_filters(recipe)

    def scan(name: str) -> pa.Table:
        if name == "scores" and not recipe.score_versions():
            return _empty(name, SCAN_COLUMNS[name])
        return catalog.scan(
            name, pin=pin, columns=SCAN_COLUMNS[name], row_filter=filters.get(name),
            include_eval=True,
        )  # fmt: skip

    report("scan", 0.0)
    if execution is not None and (execution.partitions > 1 or _remote(execution.executor)):
        report("join", 0.0)
        return partitioned_candidates(
            catalog, recipe, pin, filters, executor=execution.executor,
            partitions=execution.partitions, scan=scan, coverage=coverage,
            scratch=execution.scratch, spill_kept=execution.spill_kept,
        )  # fmt: skip
    tables = {}
    for i, name in enumerate(SCAN_COLUMNS):
        tables[name] = scan(name)
        report("scan", (i + 1) / len(SCAN_COLUMNS))
    report("join", 0.0)
    columns = narrow_columns(recipe) if narrow else ()
    return query_candidates(ViewQuery.of(recipe, coverage=coverage), tables, narrow=columns)


def narrow_columns(recipe: Recipe) -> tuple[str, ...]:
    """What selection reads of its sorted samples (later drops, buckets, streams, the
    phase gate, pools, the clip count) and the plan reads of them."""
    names = ["rung", "clip_id", "tier", "stream", "tokens", "latent_frames", "aspect"]
    if recipe.tensor_keys:
        names.append("tensor_keys")
    if recipe.semantic_dedup is not None:
        names.append(f"score_{recipe.semantic_dedup.rank_by}")
    return tuple(names)


def _remote(executor: Executor) -> bool:
    """Whether ``executor`` runs tasks elsewhere (then even one partition goes there)."""
    return not isinstance(executor, LocalExecutor)


def check_stream_matches(recipe: Recipe, counts: list[int]) -> None:
    """Raise :class:`InvalidRecipe` (``streams[i].where``) for every stream whose
    predicate matched no train candidate (``counts`` from :func:`stream_match_counts`)."""
    empty = [i for i, n in enumerate(counts) if n == 0]
    errors = [
        {
            "path": f"streams[{i}].where",
            "message": f"stream {recipe.streams[i].name!r}: the predicate "
            f"{recipe.streams[i].where!r} matches no train clip at the catalog pin",
            "value": recipe.streams[i].where,
        }
        for i in empty
    ]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidRecipe(
            f"{errors[0]['path']}: {errors[0]['message']}{more}",
            path=errors[0]["path"],
            value=errors[0]["value"],
            known=None,
            errors=errors,
        )


# -- scans ----------------------------------------------------------------------------
def _row_filters(recipe: Recipe) -> dict[str, RowFilter]:
    """The row filters the recipe puts on its scans (rungs, caption version, filters)."""
    from catalog.reads import one_of

    rungs = sorted({p.rung for p in recipe.phases})
    wanted: dict[str, tuple[str, list[str]]] = {
        "latents": ("rung", rungs),
        "captions": ("caption_version", [recipe.captions.version]),
        "scores": ("filter_name", sorted(recipe.score_versions())),
    }
    return {name: one_of(col, values) for name, (col, values) in wanted.items() if values}


def _empty(name: str, columns: list[str]) -> pa.Table:
    from catalog.tables import TABLES, arrow_schema

    schema = arrow_schema(TABLES[name].schema)
    return schema.empty_table().select(columns)


def _lacks_keys(table: pa.Table, keys: tuple[str, ...]) -> pa.Array:
    """Per row: its latent holds not every one of ``keys``."""
    held = table["tensor_keys"].to_pylist()
    return pa.array([not set(keys) <= set(h or ()) for h in held], pa.bool_())


def _drop_where(
    table: pa.Table, mask: pa.ChunkedArray | pa.Array, reason: str, drops: dict[str, int]
) -> pa.Table:
    mask = pc.fill_null(mask, False)
    n = int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)
    if n:
        drops[reason] = drops.get(reason, 0) + n
        table = table.filter(pc.invert(mask))
    return table


# -- embeddings: eval decontamination and semantic dedup ---------------------------------------
def _embedding_drops(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    pin: Pin,
    table: pa.Table,
    eval_ids: list[str],
    drops: dict[str, int],
) -> tuple[pa.Table, Decontamination | None, CentroidSet | None]:
    excl = recipe.exclusions.eval_near_duplicates
    found = None
    if excl is not None:
        clip_ids = pc.unique(table["clip_id"])
        index = catalog.embeddings(
            excl.embedding_model, version=pin.embeddings.get(excl.embedding_model)
        )
        found = decontaminate(index, clip_ids.to_pylist(), eval_ids, excl.max_distance)
        table = _drop_where(
            table,
            pc.is_in(table["clip_id"], pa.array(sorted(found.dropped), pa.string())),
            "eval_near_duplicate",
            drops,
        )
    dd = recipe.semantic_dedup
    centroids = None
    if dd is not None and table.num_rows:
        centroids = pinned_centroids(catalog, recipe, pin)
        clips = _one_row_per_clip(table, f"score_{dd.rank_by}")
        index = catalog.embeddings(
            dd.embedding_model, version=pin.embeddings.get(dd.embedding_model)
        )
        dropped = semdedup(
            index,
            clips["clip_id"].to_pylist(),
            _scores(clips, f"score_{dd.rank_by}", dd.higher_is_better),
            eps=dd.eps,
            centroids=centroids.centroids,
            keep_per_cluster=dd.keep_per_cluster,
        )
        table = _drop_where(
            table,
            pc.is_in(table["clip_id"], pa.array(sorted(dropped), pa.string())),
            "semantic_dedup",
            drops,
        )
    return table, found, centroids


def pinned_centroids(catalog: VidlakeCatalog, recipe: Recipe, pin: Pin) -> CentroidSet:
    """The centroid version ``pin`` names for the recipe's semantic dedup (a pin that
    names none, as :func:`~materializer.validate.resolve_pin` with ``fit=False``
    leaves it before the first fit, gets version 1, fitted now)."""
    from materializer.validate import pin_centroids

    dd = recipe.semantic_dedup
    if dd is None:
        raise InvalidInput("the recipe has no semantic_dedup", field="semantic_dedup")
    version = pin_centroids(catalog, recipe, pin).centroids.get(dd.embedding_model)
    if version is None:
        raise InvalidInput(
            f"no vectors of {dd.embedding_model!r} at the pin to fit centroids to",
            field="semantic_dedup.embedding_model",
        )
    return CentroidStore(catalog.objects).get(CentroidConfig.of(dd), version)


def _one_row_per_clip(table: pa.Table, score_col: str) -> pa.Table:
    clips = table.select(["clip_id", score_col]).group_by("clip_id").aggregate([(score_col, "max")])
    return clips.rename_columns(["clip_id", score_col]).sort_by("clip_id")


def _scores(clips: pa.Table, col: str, higher_is_better: bool) -> NDArray[np.float64]:
    values: NDArray[np.float64] = np.nan_to_num(
        clips[col].to_numpy(zero_copy_only=False).astype(np.float64), nan=-np.inf
    )
    return values if higher_is_better else -values


def phase_mask(
    recipe: Recipe, phase_index: int, samples: pa.Table, *, weighted_only: bool = True
) -> pa.ChunkedArray:
    """Samples phase ``phase_index`` may draw: its rung, its tier gate and (unless
    ``weighted_only`` is false) a stream it gives weight to."""
    phase = recipe.phases[phase_index]
    mask = pc.equal(samples["rung"], phase.rung)
    if phase.tiers is not None:
        mask = pc.and_(mask, pc.is_in(samples["tier"], pa.array(list(phase.tiers))))
    if weighted_only:
        names = [s.name for s in recipe.streams]
        streams = pa.array([names.index(n) for n in phase.weights], pa.int32())
        mask = pc.and_(mask, pc.is_in(samples["stream"], streams))
    return mask


def _phase_gate(recipe: Recipe, table: pa.Table, drops: dict[str, int]) -> pa.Table:
    """Drop samples no phase can draw: tier gated out, or stream without weight."""
    keep = pa.array(np.zeros(table.num_rows, dtype=bool))
    for i in range(len(recipe.phases)):
        keep = pc.or_(keep, phase_mask(recipe, i, table))
    return _drop_where(table, pc.invert(keep), "not_in_any_phase", drops)


def check_pools(recipe: Recipe, samples: pa.Table) -> None:
    """Every weighted stream of every phase must have samples, else the plan is undefined."""
    names = [s.name for s in recipe.streams]
    for i, phase in enumerate(recipe.phases):
        mask = phase_mask(recipe, i, samples, weighted_only=False)
        present = set(pc.unique(pc.filter(samples["stream"], mask)).to_pylist())
        missing = [n for n in phase.weights if names.index(n) not in present]
        if missing:
            raise InvalidInput(
                f"phases[{i}] ({phase.name}): no samples for stream(s) {missing} at rung "
                f"{phase.rung} after selection; lower their weight to zero or relax the recipe",
                phase=phase.name,
                streams=missing,
            )
