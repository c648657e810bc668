"""Cutting a snapshot: recipe + pinned catalog state + seed → registered version N.

Stages (each reported through ``progress(stage, fraction)``, always from the calling
thread): ``pin``, ``scan``, ``join``, ``embeddings`` (in
:func:`materializer.select.select`), ``scatter``, ``plan``, ``index``, ``manifest``,
``lineage``, ``quality``, ``publish``. The plan and then its lineage are written on a
side thread while the index, the manifest and the quality report are written here, so
``plan`` and ``lineage`` overlap the others; with a local process pool and a plan of
at least :data:`PARALLEL_PLAN_ROWS` rows the plan is generated per step range on the
pool (:mod:`materializer.plan.parallel`). The bytes are the same either way.

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

Why this module is a little over 500 lines: the cut's stages (pin, selection, plan,
artifacts, publication) are public so the dry run (:mod:`materializer.dry_run`) reuses
them; each is short, and splitting them would scatter one pipeline.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from catalog.errors import InvalidInput, InvalidRecipe
from manifests.format import FORMAT_VERSION, INDEX_SCHEMA, LINEAGE_NAME, QUALITY_NAME
from manifests.inputs import INPUTS_KEY, cut_inputs_sha256
from manifests.ipc import write_table
from manifests.tags import tag_published
from materializer.coverage import check_min_coverage
from materializer.executors import Executor, LocalExecutor
from materializer.plan import PhaseSpec, PlanSummary, Pool, scatter_order, write_plan
from materializer.plan.lineage import write_lineage
from materializer.quality import cut_quality, quality_summary
from materializer.recipe import Recipe, recipe_notes
from materializer.select import Execution, Selection, check_pools, phase_mask, select
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
]

Progress = Callable[[str, float], None]

_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "row_group_size": 256 * 1024,
    "use_dictionary": True,
    "write_statistics": True,
}


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
        coverage=recipe.min_coverage is not None,
    )  # fmt: skip
    check_min_coverage(recipe, selection.backfill)
    if selection.samples.num_rows == 0:
        raise nothing_selected(recipe, selection)
    check_pools(recipe, selection.samples)
    written = _write_artifacts(recipe, selection.samples, out, report, _plan_workers(execution))
    samples, summary, quality = written.samples, written.summary, written.quality
    snapshot = snapshot_doc(recipe, pin, selection, samples, summary)
    snapshot.update(embedding_facts(recipe, pin, selection))
    record_repeats(snapshot, summary)
    snapshot["quality"] = quality_summary(quality)
    return written.paths, snapshot


@dataclass(frozen=True)
class _Written:
    samples: pa.Table
    paths: dict[str, Path]
    summary: PlanSummary
    quality: dict[str, Any]


#: Plans below this many rows are generated in one process even when the cut has an
#: executor: each worker costs a process start (~0.6 s here) and rebuilds the phase
#: model (~0.6 s at 600k candidates), while one process writes 10M rows in 1.5-3 s.
PARALLEL_PLAN_ROWS = 64_000_000


def _plan_workers(execution: Execution | None) -> tuple[Executor | None, int]:
    """The executor and worker count the plan may use: the cut's local process pool
    (range tasks spill to this machine's disk, which Ray workers elsewhere cannot
    write), else none."""
    if execution is None or not isinstance(execution.executor, LocalExecutor):
        return None, 1
    workers = execution.executor.processes or os.cpu_count() or 1
    return (execution.executor, workers) if workers > 1 else (None, 1)


def _write_artifacts(
    recipe: Recipe,
    selected: pa.Table,
    out: Path,
    report: Progress,
    plan_on: tuple[Executor | None, int],
) -> _Written:
    """The ``scatter``, ``plan``, ``index``, ``manifest``, ``quality`` and ``lineage``
    stages; the samples in manifest order with the rest.

    The plan needs only the scattered ``row``, stream, bucket and tokens: it and then
    its lineage are written on a side thread while this one scatters every column and
    writes the index and the manifest (none reads the plan), then the quality report
    (which reads it) while lineage runs: numpy and Arrow work that releases the GIL, so
    on two cores the stages overlap. Progress is reported from this thread only.
    """
    order = pa.array(scatter_order(selected.num_rows, recipe.seed))
    report("plan", 0.0)
    plan_path, lineage_path = out / "plan.arrow", out / LINEAGE_NAME
    few = selected.select([c for c in _PLAN_COLUMNS if c in selected.column_names])
    specs = _phase_specs(recipe, _with_rows(few.take(order)))
    executor, workers = plan_on
    if sum(_max_plan_rows(recipe)) < PARALLEL_PLAN_ROWS:
        executor, workers = None, 1

    def lineage() -> None:
        spill = out / "lineage-spill"
        rows = planned.result().plan_rows
        write_lineage(lineage_path, plan_path, samples.num_rows, rows, spill)
        spill.rmdir()

    with ThreadPoolExecutor(1, thread_name_prefix="vidlake-plan") as side:
        planned = side.submit(_write_plan, plan_path, recipe, specs, executor, workers)
        lined = side.submit(lineage)
        try:
            report("scatter", 0.0)
            samples = _with_rows(selected.take(order))
            report("scatter", 1.0)
            report("index", 0.0)
            index_path = out / "index.arrow"
            write_table(index_path, _index_table(recipe, samples))
            report("index", 1.0)
            report("manifest", 0.0)
            manifest_path = out / "manifest.parquet"
            _write_parquet(manifest_path, _manifest_table(recipe, samples))
            report("manifest", 1.0)
            summary = planned.result()
            report("plan", 1.0)
            report("lineage", 0.0)
            # The plan quality report (materializer/quality.py); a recipe threshold fails here.
            report("quality", 0.0)
            quality_path, quality = cut_quality(recipe, plan_path, samples, out)
            report("quality", 1.0)
            lined.result()
            report("lineage", 1.0)
        except BaseException:
            lined.cancel()
            raise
    paths = {
        QUALITY_NAME: quality_path,
        "manifest.parquet": manifest_path,
        "plan.arrow": plan_path,
        "index.arrow": index_path,
        LINEAGE_NAME: lineage_path,
    }
    return _Written(samples, paths, summary, quality)


#: The sample view's columns that the plan's pools and phase masks read.
_PLAN_COLUMNS = ["rung", "tier", "stream", "bucket", "tokens"]


def _max_plan_rows(recipe: Recipe) -> list[int]:
    """Per ``steps`` phase, its most plan rows (token-budget phases count 0)."""
    return [
        p.steps * max([p.global_batch.default, *p.global_batch.overrides.values()])
        for p in recipe.phases
        if p.steps is not None
    ]


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
    summary = _write_plan(plan_path, recipe, _phase_specs(recipe, samples))
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
    return _with_rows(samples.take(pa.array(scatter_order(samples.num_rows, seed))))


def _with_rows(table: pa.Table) -> pa.Table:
    """``table`` (in manifest order) with its ``row`` number as the first column."""
    return table.add_column(0, "row", pa.array(np.arange(table.num_rows, dtype=np.int64)))


def _phase_specs(recipe: Recipe, samples: pa.Table) -> list[PhaseSpec]:
    names = [s.name for s in recipe.streams]
    keys = recipe.buckets.bucket_keys()
    specs = []
    columns = samples.select(["row", "stream", "bucket", "tokens"])  # not the whole view
    for i, phase in enumerate(recipe.phases):
        part = columns.filter(phase_mask(recipe, i, samples))
        pool = Pool(
            row=part["row"].to_numpy(),
            stream=part["stream"].to_numpy(),
            bucket=part["bucket"].to_numpy(),
            tokens=part["tokens"].to_numpy(),
        )
        specs.append(
            PhaseSpec(
                index=i,
                pool=pool,
                global_batch={b: phase.global_batch.for_bucket(k) for b, k in enumerate(keys)},
                stream_weights={names.index(n): w for n, w in phase.weights.items()},
                num_steps=phase.steps,
                token_budget=phase.token_budget,
                rank_multiple=phase.rank_multiple,
                allow_repeats_in_step=phase.allow_repeats_in_step,
            )
        )
    return specs


def _write_plan(
    path: Path,
    recipe: Recipe,
    phases: list[PhaseSpec],
    executor: Executor | None = None,
    workers: int = 1,
) -> PlanSummary:
    """``plan.arrow`` (on ``executor`` in ``workers`` step ranges when given: the same
    bytes); a pool too small for its per-step quota is named as the recipe names it
    (the plan knows streams and buckets by number)."""
    try:
        return write_plan(
            path,
            phases,
            recipe.seed,
            num_streams=len(recipe.streams),
            executor=executor,
            workers=workers,
        )
    except InvalidRecipe as exc:
        if "pools" not in exc.details:
            raise
        i = exc.details["phase"]
        phase, keys = recipe.phases[i], recipe.buckets.bucket_keys()
        names = [s.name for s in recipe.streams]
        pools = [
            {**p, "stream": names[p["stream"]], "bucket": keys[p["bucket"]]}
            for p in exc.details["pools"]
        ]
        first = pools[0]
        more = f" (and {len(pools) - 1} more pools)" if len(pools) > 1 else ""
        raise InvalidRecipe(
            f"phases[{i}] ({phase.name}): stream {first['stream']!r} has {first['pool_size']} "
            f"samples in bucket {first['bucket']} at rung {phase.rung} but a step of that "
            f"bucket draws up to {first['quota']} of them{more}, so a step would hold a "
            "sample twice; add samples, lower the stream's weight or the bucket's global "
            "batch, or set allow_repeats_in_step: true on the phase",
            path=f"phases[{i}].allow_repeats_in_step",
            phase=phase.name,
            stream=first["stream"],
            bucket=first["bucket"],
            pool_size=first["pool_size"],
            quota=first["quota"],
            pools=pools,
        ) from exc


def record_repeats(snapshot: dict[str, Any], summary: PlanSummary) -> None:
    """Samples that repeat a row already in their step (only where a phase allows it)."""
    snapshot["repeats_in_step"] = summary.repeats_in_step
    for doc, detail in zip(snapshot["phases"], summary.phases, strict=True):
        doc["repeats_in_step"] = detail.repeats_in_step


def _index_table(recipe: Recipe, samples: pa.Table) -> pa.Table:
    """The loader's columns. ``num_frames`` is the bucket's latent frame count: the
    loader keeps that many leading frames (axis 1 of a ``(C, T, H, W)`` latent), so
    every sample of a step has one shape."""
    frames = np.repeat(
        np.asarray(recipe.buckets.latent_frames, dtype=np.int32),
        len(recipe.buckets.aspect_ratios),
    )
    no_strings = pa.scalar([], pa.list_(pa.string()))
    captions = pc.fill_null(samples["captions"], no_strings)
    embeddings = pc.fill_null(samples["text_embedding_sha256"], no_strings)
    columns: dict[str, Any] = {
        "row": samples["row"],
        "clip_id": samples["clip_id"],
        "asset_id": samples["asset_id"],
        "stream": samples["stream"],
        "bucket": samples["bucket"],
        "num_frames": pa.array(frames[samples["bucket"].to_numpy()], pa.int32()),
        "tokens": samples["tokens"],
        "object_sha256": samples["object_sha256"],
        "offset": samples["offset"],
        "length": samples["length"],
        "member_sha256": samples["member_sha256"],
        "format": samples["format"],
        "tensor_keys": _tensor_keys(recipe, samples),
        "captions": captions,
        "text_embedding_sha256": embeddings,
    }
    table = pa.table({k: columns[k] for k in INDEX_SCHEMA.names})
    return table.cast(INDEX_SCHEMA).combine_chunks()


def _tensor_keys(recipe: Recipe, samples: pa.Table) -> Any:
    """The tensors the loader delivers per row: the recipe's ``tensor_keys`` (every row
    holds them: select dropped the rest), else every tensor the latent holds."""
    if recipe.tensor_keys is None:
        return samples["tensor_keys"]
    keys = list(recipe.tensor_keys)
    return pa.array([keys] * samples.num_rows, pa.list_(pa.string()))


def _manifest_table(recipe: Recipe, samples: pa.Table) -> pa.Table:
    """Every column of the sample view, plus lineage refs: the score versions used."""
    versions = json.dumps(recipe.score_versions(), sort_keys=True)
    names = [s.name for s in recipe.streams]
    stream_names = pc.take(pa.array(names, pa.string()), samples["stream"])
    keys = recipe.buckets.bucket_keys()
    bucket_keys = pc.take(pa.array(list(keys), pa.string()), samples["bucket"])
    table = samples.append_column("stream_name", stream_names)
    table = table.append_column("bucket_key", bucket_keys)
    n = samples.num_rows
    table = table.append_column("score_versions", pa.repeat(pa.scalar(versions), n))
    table = table.append_column("caption_version", pa.repeat(pa.scalar(recipe.captions.version), n))
    return table.combine_chunks()


def snapshot_doc(
    recipe: Recipe,
    pin: Pin,
    selection: Selection,
    samples: pa.Table,
    summary: PlanSummary,
) -> dict[str, Any]:
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
    stream_counts = np.bincount(samples["stream"].to_numpy(), minlength=len(stream_names))
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
            "samples": samples.num_rows,
            "clips": int(pc.count_distinct(samples["clip_id"]).as_py()),
            "assets": int(pc.count_distinct(samples["asset_id"]).as_py()),
            "samples_per_stream": {
                n: int(c) for n, c in zip(stream_names, stream_counts, strict=True)
            },
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


def _shares(samples: Any, tokens: Any, unit: str) -> list[tuple[Any, float]]:
    values = dict(tokens if unit == "tokens" else samples)
    total = sum(values.values()) or 1
    return [(k, v / total) for k, v in sorted(values.items())]


def _write_parquet(path: Path, table: pa.Table) -> None:
    pq.write_table(table, str(path), **_PARQUET_OPTIONS)
