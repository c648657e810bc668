"""Cutting a snapshot: recipe + pinned catalog state + seed → registered version N.

Stages (each reported through ``progress(stage, fraction)``, always from the calling
thread): ``pin``, ``scan``, ``join``, ``embeddings`` (in
:func:`materializer.select.select`), ``scatter``, ``plan``, ``index``, ``manifest``,
``lineage``, ``quality``, ``publish``. ``plan``, ``index`` and ``lineage`` run on a
side thread beside the others (:mod:`materializer.cut_artifacts`); the bytes are the
same.

The ``pin`` stage resolves the pin (Iceberg snapshot ids and the LanceDB version of
every embedding model the recipe reads) and checks the recipe against the catalog
there (:func:`materializer.validate.check_recipe`): a typo'd model, filter, caption
version, rung or tokenizer, or too little eval embedding coverage, stops the cut
before any work.

The data artifacts (``manifest.parquet``, ``plan.arrow``, ``index.arrow``,
``lineage.arrow``, ``quality.json``) are pure functions of (recipe, pin, seed, code
version): cutting the same recipe at the same pin twice gives byte-identical files.
``snapshot.json`` differs only in ``version`` and ``parent``; it records the full pin
(``catalog_snapshot_ids``, embedding versions under ``embeddings/<model>``, the semantic
dedup's centroid version under ``centroids/<model>``), ``decontamination`` (model,
version, eval clips, those with vectors, coverage, train clips checked),
``semantic_dedup`` (the centroid record: version, config and matrix SHA-256, k, what it
was fitted on) and the cut's inputs key as ``inputs_sha256`` (:mod:`manifests.inputs`),
by which the service answers a repeated cut with the version it already made. After
publishing, the snapshots the pin names are tagged ``vidlake-v{N}`` in each table
(:mod:`manifests.tags`).

:mod:`materializer.dry_run` runs the same stages up to the plan (:func:`checked_pin`,
selection, :func:`plan_samples`, :func:`snapshot_doc`) and publishes nothing; a cut
that selects nothing fails with :func:`nothing_selected`'s breakdown.

``lineage.arrow`` answers "which steps served this row" in O(1): one record per
manifest row (``row``, ``steps: large_list<int64>``), built by an external sort of the
plan's (row, step) pairs in bounded memory (:mod:`materializer.plan.lineage`). It is
uncompressed Arrow IPC, so the service memory-maps it.

The selection's join may run partitioned by ``clip_id`` on an executor (a local process
pool or Ray: ``execution``, :mod:`materializer.partition`); the artifacts are the same
for every executor and partition count, so neither is part of a cut's inputs key.

The artifact stages after selection (scatter, plan, index, manifest, quality,
lineage) live in :mod:`materializer.cut_artifacts`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from catalog.errors import InvalidInput, InvalidRecipe
from manifests.format import FORMAT_VERSION
from manifests.inputs import INPUTS_KEY, cut_inputs_sha256
from manifests.tags import tag_published
from materializer.coverage import check_min_coverage
from materializer.cut_artifacts import (
    SampleCounts,
    phase_specs,
    plan_workers,
    with_rows,
    write_artifacts,
    write_named_plan,
)
from materializer.plan import PlanSummary, scatter_order
from materializer.quality import quality_summary
from materializer.recipe import Recipe, recipe_notes
from materializer.select import Execution, Selection, check_pools, select
from materializer.validate import check_recipe, pin_centroids, resolve_pin

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin
    from manifests.registry import Registry, SnapshotRecord

__all__ = [
    "build_artifacts",
    "checked_pin",
    "code_version",
    "cut_snapshot",
    "embedding_facts",
    "nothing_selected",
    "plan_samples",
    "record_repeats",
    "resolve_pin",
    "snapshot_doc",
    "sorted_distinct_clips",
]

Progress = Callable[[str, float], None]


def code_version() -> str:
    """The installed vidlake version (part of a snapshot's identity)."""
    try:
        return metadata.version("vidlake")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare tree
        return "0+unknown"


def cut_snapshot(
    catalog: VidlakeCatalog,
    registry: Registry,
    recipe: Recipe,
    *,
    progress: Progress | None = None,
    workdir: str | os.PathLike[str] | None = None,
    pin: Pin | None = None,
    execution: Execution | None = None,
) -> SnapshotRecord:
    """Cut ``recipe`` at its catalog pin and register it as the next version.

    ``pin``, when given, is the recipe's pin already resolved (the service resolves it
    when the request arrives, so that the cut and its idempotency key see one state).
    ``execution`` names the executor and the ``clip_id`` partitions of the selection
    (:mod:`materializer.partition`); the artifacts do not depend on it.

    Raises:
        InvalidRecipe: The recipe names a value the catalog does not hold at the pin
            (:func:`materializer.validate.check_recipe`), or a stream matches nothing.
        InvalidInput: The recipe does not fit the catalog (e.g. a phase has no samples).
        Conflict: Another cutter claimed the version first; nothing was registered.
    """
    report = progress or (lambda stage, fraction: None)
    check_plan_fits(recipe, workdir or tempfile.gettempdir())
    # The pid in the name lets ``vidlake gc`` find the folders of killed cutters.
    prefix = f"vidlake-cut-{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=workdir) as tmp:
        artifacts, snapshot = build_artifacts(
            catalog, recipe, Path(tmp), progress=report, pin=pin, execution=execution
        )
        report("publish", 0.0)
        record = registry.publish(artifacts, snapshot, parent=registry.next_parent())
        report("publish", 1.0)
    tag_published(catalog, registry, record.version)
    return record


#: Bytes a cut writes per plan row (the row in ``plan.arrow`` and its step in
#: ``lineage.arrow``, int64 each) and per step (step, phase, bucket, offsets, epochs).
PLAN_ROW_BYTES, PLAN_STEP_BYTES = 16, 64


def check_plan_fits(recipe: Recipe, directory: str | os.PathLike[str]) -> None:
    """Refuse, before any work, a recipe whose step plan cannot fit on the disk.

    A phase's plan has at most ``steps`` x its largest global batch rows; the cut
    writes them (plan and lineage) into ``directory`` before publishing. A recipe
    of a trillion steps is well formed, and would otherwise write until the disk is
    full. Phases ended by ``token_budget`` are bounded by the corpus's tokens instead.

    Raises:
        InvalidRecipe: ``path`` names the phase with the most rows.
    """
    need, largest, at = 0, 0, "phases"
    for i, phase in enumerate(recipe.phases):
        if phase.steps is None:
            continue
        batch = max([phase.global_batch.default, *phase.global_batch.overrides.values()])
        rows = phase.steps * batch
        need += rows * PLAN_ROW_BYTES + phase.steps * PLAN_STEP_BYTES
        if rows > largest:
            largest, at = rows, f"phases[{i}].steps"
    free = shutil.disk_usage(directory).free
    if need > free:
        raise InvalidRecipe(
            f"the step plan would take up to {need / 2**30:,.1f} GiB (phase "
            f"{at}: up to {largest:,} rows) and the cut's work directory has "
            f"{free / 2**30:,.1f} GiB free",
            path=at,
            need_bytes=need,
            free_bytes=free,
        )


def build_artifacts(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    out: Path,
    *,
    progress: Progress | None = None,
    pin: Pin | None = None,
    execution: Execution | None = None,
) -> tuple[dict[str, Path], dict[str, Any]]:
    """Write every artifact of a cut into ``out``; return their paths and snapshot.json.

    ``snapshot.json`` lacks ``version``, ``parent`` and ``artifacts``, which the
    registry fills when it publishes. ``execution`` (executor and partitions) changes
    where the selection runs, never the artifacts.
    """
    report = progress or (lambda stage, fraction: None)
    report("pin", 0.0)
    pin = checked_pin(catalog, recipe, pin)
    report("pin", 1.0)
    selection = select(
        catalog, recipe, pin, progress=report, execution=execution,
        coverage=recipe.min_coverage is not None, narrow=True,
    )  # fmt: skip
    try:
        check_min_coverage(recipe, selection.backfill)
        if selection.samples.num_rows == 0:
            raise nothing_selected(recipe, selection)
        check_pools(recipe, selection.samples)
        clips = sorted_distinct_clips(selection.samples)  # before write_artifacts takes them
        # It takes the selection's samples: the sorted rows go once they are scattered.
        written = write_artifacts(
            recipe, selection, out, report, plan_workers(execution), clips=clips
        )
    finally:
        selection.close()  # a partitioned selection's kept-sample files
    summary, quality = written.summary, written.quality
    snapshot = snapshot_doc(recipe, pin, selection, written.counts, summary)
    snapshot.update(embedding_facts(recipe, pin, selection))
    record_repeats(snapshot, summary)
    snapshot["quality"] = quality_summary(quality)
    return written.paths, snapshot


def plan_samples(
    recipe: Recipe, selected: pa.Table, out: Path, *, progress: Progress | None = None
) -> tuple[pa.Table, PlanSummary, Path]:
    """The ``scatter`` and ``plan`` stages: the samples in manifest order (with ``row``),
    the plan's summary, and ``out/plan.arrow``."""
    report = progress or (lambda stage, fraction: None)
    report("scatter", 0.0)
    samples = _scatter(selected, recipe.seed)
    report("scatter", 1.0)
    report("plan", 0.0)
    plan_path = out / "plan.arrow"
    summary = write_named_plan(plan_path, recipe, phase_specs(recipe, samples))
    report("plan", 1.0)
    return samples, summary, plan_path


def nothing_selected(recipe: Recipe, selection: Selection) -> InvalidInput:
    """The error of a cut that selects nothing: the candidates and every drop reason
    in the message, the breakdown (:func:`materializer.dry_run.selection_counts`) in
    ``details``."""
    from materializer.dry_run import describe_drops, selection_counts

    counts = selection_counts(recipe, selection)
    return InvalidInput(
        "the recipe selects no samples at this catalog state: "
        + describe_drops(selection.candidates, selection.drops),
        drops=selection.drops,
        candidates=selection.candidates,
        breakdown=counts,
    )


# -- stages ---------------------------------------------------------------------------
def checked_pin(catalog: VidlakeCatalog, recipe: Recipe, pin: Pin | None) -> Pin:
    """The pin (Iceberg snapshots, embedding and centroid versions; the recipe's own
    when ``pin`` is None), after checking every value the recipe names against the
    catalog there (streams are checked in selection)."""
    if pin is None:
        pin = resolve_pin(catalog, recipe, fit=False)
    pin = check_recipe(catalog, recipe, pin, streams=False).pin
    return pin_centroids(catalog, recipe, pin)  # the first cut that needs them fits them


def embedding_facts(recipe: Recipe, pin: Pin, selection: Selection) -> dict[str, Any]:
    """snapshot.json's ``decontamination`` and ``semantic_dedup`` (the centroid
    version and record; each None without it) and ``embedding_versions``."""
    excl = recipe.exclusions.eval_near_duplicates
    found = selection.decontamination
    decontamination = None
    if excl is not None and found is not None:
        decontamination = {
            "model": excl.embedding_model,
            "version": pin.embeddings.get(excl.embedding_model),
            "max_distance": excl.max_distance,
            "min_eval_coverage": excl.min_eval_coverage,
            "eval_clips": found.eval_clips,
            "eval_clips_with_vectors": found.eval_clips_with_vectors,
            "coverage": found.coverage,
            "train_clips": found.train_clips,
            "train_clips_checked": found.train_clips_checked,
            "train_clips_dropped": len(found.dropped),
        }
    centroids = selection.centroids
    return {
        "decontamination": decontamination,
        "embedding_versions": dict(pin.embeddings),
        "semantic_dedup": None if centroids is None else centroids.facts(),
    }


def _scatter(samples: pa.Table, seed: int) -> pa.Table:
    """Manifest order: a seeded permutation of the canonical ``(rung, clip_id)`` order
    that selection returns, so it depends only on the selected set and the seed."""
    return with_rows(samples.take(pa.array(scatter_order(samples.num_rows, seed))))


def record_repeats(snapshot: dict[str, Any], summary: PlanSummary) -> None:
    """Samples that repeat a row already in their step (only where a phase allows it)."""
    snapshot["repeats_in_step"] = summary.repeats_in_step
    for doc, detail in zip(snapshot["phases"], summary.phases, strict=True):
        doc["repeats_in_step"] = detail.repeats_in_step


def snapshot_doc(
    recipe: Recipe,
    pin: Pin,
    selection: Selection,
    counts: SampleCounts,
    summary: PlanSummary,
) -> dict[str, Any]:
    """snapshot.json of a cut, less what the registry and the later stages fill;
    ``counts`` are the selected samples' (:func:`~materializer.cut_artifacts.sample_counts`)."""
    keys = recipe.buckets.bucket_keys()
    plan = summary.to_dict()
    stream_names = selection.stream_names
    shares = {stream_names[int(k)]: v for k, v in plan["stream_shares"].items()}
    first = 0
    phases = []
    for phase, detail in zip(recipe.phases, summary.phases, strict=True):
        phases.append(
            {
                "name": phase.name,
                "rung": phase.rung,
                "first_step": first,
                "num_steps": detail.num_steps,
                "rank_multiple": phase.rank_multiple,
                "plan_rows": detail.plan_rows,
                "tokens": detail.tokens,
                "unit": detail.unit,
                "targets": {n: w for n, w in phase.weights.items()},
                "realized": {
                    stream_names[int(k)]: v
                    for k, v in _shares(detail.stream_samples, detail.stream_tokens, detail.unit)
                },
                "share_bound": {stream_names[int(k)]: v for k, v in detail.share_bound.items()},
                "max_deviation": {stream_names[int(k)]: v for k, v in detail.max_deviation.items()},
            }
        )
        first += detail.num_steps
    buckets = []
    for b, key in enumerate(keys):
        frames, aspect = key.split("x", 1)
        buckets.append({"id": b, "key": key, "num_frames": int(frames), "aspect": aspect})
    return {
        "format": FORMAT_VERSION,
        "recipe": json.loads(recipe.to_canonical_json()),
        "recipe_sha256": recipe.sha256(),
        "catalog_snapshot_ids": pin.to_dict(),
        "seed": recipe.seed,
        "code_version": code_version(),
        INPUTS_KEY: cut_inputs_sha256(recipe.sha256(), pin.to_dict(), code_version()),
        "counts": {
            "candidates": selection.candidates,
            "samples": counts.samples,
            "clips": counts.clips,
            "assets": counts.assets,
            "samples_per_stream": dict(zip(stream_names, counts.per_stream, strict=True)),
        },
        "drops": selection.drops,
        "stream_shares": shares,
        "bucket_histogram": {keys[int(b)]: dict(v) for b, v in plan["bucket_histogram"].items()},
        "stream_epochs": {stream_names[int(k)]: v for k, v in plan["stream_epochs"].items()},
        "streams": stream_names,
        "buckets": buckets,
        "phases": phases,
        "num_steps": summary.num_steps,
        "plan_rows": summary.plan_rows,
        "tokens": summary.tokens,
        # What loading the recipe changed (normalised weights), only when anything did.
        **({"notes": notes} if (notes := recipe_notes(recipe)) else {}),
    }


def sorted_distinct_clips(selected: pa.Table) -> int | None:
    """The distinct clips of selection's samples, which come sorted by ``(rung,
    clip_id)``: where the ``clip_id`` column never decreases (one rung, as most cuts),
    equal ids are adjacent and a comparison of neighbours counts them (a hash of 600k
    ids cost ~0.25 s of the 1M-clip cut); else None (the caller hashes the ids)."""
    if "clip_id" not in selected.column_names or selected.num_rows < 2:
        return None
    ids = selected["clip_id"]
    if ids.null_count:
        return None
    head, tail = ids.slice(0, len(ids) - 1), ids.slice(1)
    if pc.any(pc.less(tail, head)).as_py():
        return None
    return 1 + int(pc.sum(pc.cast(pc.not_equal(tail, head), pa.int64())).as_py())


def _shares(samples: Any, tokens: Any, unit: str) -> list[tuple[Any, float]]:
    values = dict(tokens if unit == "tokens" else samples)
    total = sum(values.values()) or 1
    return [(k, v / total) for k, v in sorted(values.items())]
