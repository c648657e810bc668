"""A cut's artifact stages, after selection: scatter, plan, index, manifest, quality
and lineage (:func:`write_artifacts`, called by :func:`materializer.cut.build_artifacts`).

The plan needs only the scattered ``row``, stream, bucket and tokens, so it starts as
soon as the scatter order is known: a side thread writes it, then the index (queued
once the calling thread has scattered every column), then lineage, while the calling
thread writes the manifest (neither it nor the index reads the plan) and then the
quality report (which does). That split gives the two threads about equal CPU (at 1M
clips / 10M plan rows: plan 1.5 + index 0.7 + lineage 1.0 s against scatter 0.6 +
manifest 1.1 + quality 1.5 s). Those are numpy and Arrow passes that release the GIL,
so on two cores they overlap. Progress is reported from the calling thread only.
With the cut's local process pool and a plan of at least :data:`PARALLEL_PLAN_ROWS`
rows, the plan is generated per step range on the pool
(:mod:`materializer.plan.parallel`). Every artifact's bytes are the same either way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from catalog.errors import InvalidRecipe
from manifests.format import INDEX_SCHEMA, LINEAGE_NAME, QUALITY_NAME
from manifests.ipc import write_table
from materializer.executors import Executor, LocalExecutor
from materializer.kept_rows import gather_scattered
from materializer.memory import release_unused
from materializer.partition_merge import (
    CHUNK_ROWS,
    PART,
    POS,
    KeptParts,
    compact_batches,
    distinct_clips,
    stream_artifacts,
)
from materializer.plan import PhaseSpec, PlanSummary, Pool, scatter_order, write_plan
from materializer.plan.lineage import write_lineage
from materializer.quality import cut_quality
from materializer.recipe import Recipe
from materializer.select import Execution, Selection, phase_mask

__all__ = [
    "PARALLEL_PLAN_ROWS",
    "SampleCounts",
    "Written",
    "phase_specs",
    "plan_workers",
    "sample_counts",
    "with_rows",
    "write_artifacts",
    "write_named_plan",
]

Progress = Callable[[str, float], None]

_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "row_group_size": 256 * 1024,
    "use_dictionary": True,
    "write_statistics": True,
}


@dataclass(frozen=True)
class Written:
    """What :func:`write_artifacts` leaves: the samples in manifest order (None for a
    partitioned selection, whose rows the driver never gathers), the artifacts' paths,
    the plan's summary, the quality report and the samples' counts."""

    samples: pa.Table | None
    paths: dict[str, Path]
    summary: PlanSummary
    quality: dict[str, Any]
    counts: SampleCounts


#: Plans below this many rows are generated in one process even when the cut has an
#: executor: each worker costs a process start (~0.6 s here) and rebuilds the phase
#: model (~0.6 s at 600k candidates), while one process writes 10M rows in 1.5-3 s.
PARALLEL_PLAN_ROWS = 64_000_000


def plan_workers(execution: Execution | None) -> tuple[Executor | None, int]:
    """The executor and worker count the plan may use: the cut's local process pool
    (range tasks spill to this machine's disk, which Ray workers elsewhere cannot
    write), else none."""
    if execution is None or not isinstance(execution.executor, LocalExecutor):
        return None, 1
    workers = execution.executor.processes or os.cpu_count() or 1
    return (execution.executor, workers) if workers > 1 else (None, 1)


def write_artifacts(
    recipe: Recipe,
    selection: Selection,
    out: Path,
    report: Progress,
    plan_on: tuple[Executor | None, int],
    *,
    clips: int | None = None,
) -> Written:
    """The ``scatter``, ``plan``, ``index``, ``manifest``, ``quality`` and ``lineage``
    stages; the samples in manifest order with the rest.

    The plan needs only the scattered ``row``, stream, bucket and tokens: a side thread
    writes it, then the index and lineage, while this one scatters every column, writes
    the manifest (neither reads the plan), then the quality report (which reads it):
    numpy and Arrow work that releases the GIL, so on two cores the stages overlap.
    Progress is reported from this thread only.

    With ``selection.parts`` (a partitioned selection's kept-sample files), its samples
    hold only the driver columns, and the index and manifest are streamed from the files
    on this thread (:func:`~materializer.partition_merge.stream_artifacts`): the same
    bytes. The driver then never gathers its rows in manifest order: the quality report
    reads what it needs of the written manifest (:mod:`materializer.quality_rows`), and
    the distinct clips and assets are counted in the streamed write
    (:mod:`materializer.distinct`). ``clips``, when given, is the distinct clips of a
    one-process selection, already counted.

    The selection's samples are taken (``selection.samples`` is left empty): once
    scattered, the sorted rows are dropped, but for what the streaming reads (the
    partition, position and bucket), so the driver does not hold every kept row twice.
    """
    selected, parts, query_rows = selection.samples, selection.parts, selection.rows
    selection.samples = selected.schema.empty_table()  # a slice would keep the buffers
    selection.rows = None  # the query's rows go once gathered into manifest order
    k = len(selection.stream_names)
    per_stream = [int(c) for c in np.bincount(selected["stream"].to_numpy(), minlength=k)]
    counts: SampleCounts | None = None
    if parts is not None:
        # The driver reads only these from here on (the counts were taken).
        keep = dict.fromkeys([*_PLAN_COLUMNS, *_STREAM_COLUMNS])  # bucket is in both
        selected = selected.select([c for c in keep if c in selected.column_names])
        release_unused()
    n = selected.num_rows
    order = pa.array(scatter_order(n, recipe.seed))
    report("plan", 0.0)
    plan_path, lineage_path = out / "plan.arrow", out / LINEAGE_NAME
    few = selected.select([c for c in _PLAN_COLUMNS if c in selected.column_names])
    # The plan takes the specs: their pools (~24 B a sample) go once it is written,
    # not at the end of the stream and the quality report.
    held = [phase_specs(recipe, with_rows(few.take(order)))]
    del few  # it shares the sorted rows' buffers
    executor, workers = plan_on
    if sum(_max_plan_rows(recipe)) < PARALLEL_PLAN_ROWS:
        executor, workers = None, 1

    def lineage() -> None:
        spill = out / "lineage-spill"
        rows = planned.result().plan_rows
        write_lineage(lineage_path, plan_path, n, rows, spill)
        spill.rmdir()
        release_unused()

    def plan() -> PlanSummary:
        specs = held.pop()
        summary = write_named_plan(plan_path, recipe, specs, executor, workers)
        del specs
        release_unused()  # the plan's step chunks and pools, freed on this thread
        return summary

    index_path, manifest_path = out / "index.arrow", out / "manifest.parquet"
    queued: list[Future[None]] = []
    with ThreadPoolExecutor(1, thread_name_prefix="vidlake-plan") as side:
        planned = side.submit(plan)
        try:
            report("scatter", 0.0)
            samples: pa.Table | None = None
            if query_rows is not None:
                # The wide columns, gathered once: straight into manifest order.
                samples = with_rows(gather_scattered(query_rows, selected, order))
                del query_rows
            elif parts is None:
                samples = with_rows(selected.take(order))
            # The quality report reads the rows the plan draws from the written manifest
            # where the driver holds no scattered copy of them.
            measured = manifest_path if samples is None else samples
            selected = selected.select(list(_STREAM_COLUMNS) if parts is not None else [])
            release_unused()  # the sorted rows, the merge's and the plan inputs' temporaries
            report("scatter", 1.0)
            if parts is None:
                assert samples is not None
                # Queued behind the plan, then lineage: the two threads' shares even out.
                report("index", 0.0)
                queued += [side.submit(_write_index, index_path, recipe, samples)]
                queued += [side.submit(lineage)]
                report("manifest", 0.0)
                _write_parquet(manifest_path, _manifest_table(recipe, samples))
            else:
                queued += [side.submit(lineage)]
                report("index", 0.0)
                # One permutation held through the stream, not it and its inverse.
                dest = _inverse(order.to_numpy())
                del order
                distinct = _stream_rows(recipe, parts, selected, dest, index_path, manifest_path)
                del dest  # its last reader: not held through the quality report
                counts = SampleCounts(n, *distinct, per_stream)
                report("manifest", 0.0)
            report("manifest", 1.0)
            summary = planned.result()
            report("plan", 1.0)
            report("lineage", 0.0)
            # The plan quality report (materializer/quality.py); a recipe threshold fails here.
            report("quality", 0.0)
            codes_distinct: dict[str, int] = {}
            quality_path, quality = cut_quality(
                recipe, plan_path, measured, out, distinct=codes_distinct
            )
            if parts is None:
                assert samples is not None
                # The asset count off the quality stage's codes, not a second hash.
                counts = sample_counts(samples, k, clips, assets=codes_distinct.get("asset_id"))
            report("quality", 1.0)
            if parts is None:
                queued[0].result()
            report("index", 1.0)
            queued[-1].result()
            report("lineage", 1.0)
        except BaseException:
            for task in queued:
                task.cancel()
            raise
    paths = {
        QUALITY_NAME: quality_path,
        "manifest.parquet": manifest_path,
        "plan.arrow": plan_path,
        "index.arrow": index_path,
        LINEAGE_NAME: lineage_path,
    }
    assert counts is not None  # both paths set them
    return Written(samples, paths, summary, quality, counts)


@dataclass(frozen=True)
class SampleCounts:
    """snapshot.json's counts of the selected samples: the same in any row order."""

    samples: int
    clips: int
    assets: int
    per_stream: list[int]


def sample_counts(
    samples: pa.Table, num_streams: int, clips: int | None = None, *, assets: int | None = None
) -> SampleCounts:
    """The counts of ``samples`` (``clips`` and ``assets``, when given, the distinct
    clips and assets already counted: :func:`~materializer.cut.sorted_distinct_clips`,
    the quality stage's codes)."""
    per_stream = np.bincount(samples["stream"].to_numpy(), minlength=num_streams)
    return SampleCounts(
        samples=samples.num_rows,
        clips=distinct_clips(samples) if clips is None else clips,
        assets=int(pc.count_distinct(samples["asset_id"]).as_py()) if assets is None else assets,
        per_stream=[int(c) for c in per_stream],
    )


#: What the streamed index and manifest read of the sorted samples, once scattered.
_STREAM_COLUMNS = ("bucket", PART, POS)
#: The sample view's columns that the plan's pools and phase masks read.
_PLAN_COLUMNS = ["rung", "tier", "stream", "bucket", "tokens"]


def _max_plan_rows(recipe: Recipe) -> list[int]:
    """Per ``steps`` phase, its most plan rows (token-budget phases count 0)."""
    return [
        p.steps * max([p.global_batch.default, *p.global_batch.overrides.values()])
        for p in recipe.phases
        if p.steps is not None
    ]


def with_rows(table: pa.Table) -> pa.Table:
    """``table`` (in manifest order) with its ``row`` number as the first column."""
    return table.add_column(0, "row", pa.array(np.arange(table.num_rows, dtype=np.int64)))


def phase_specs(recipe: Recipe, samples: pa.Table) -> list[PhaseSpec]:
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


def write_named_plan(
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


def _write_index(path: Path, recipe: Recipe, samples: pa.Table) -> None:
    write_table(path, compact_batches(_index_table(recipe, samples), CHUNK_ROWS), INDEX_SCHEMA)


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


def _stream_rows(
    recipe: Recipe,
    parts: KeptParts,
    selected: pa.Table,
    dest: NDArray[np.int64],
    index_path: Path,
    manifest_path: Path,
) -> tuple[int, int]:
    """The index and the manifest of a partitioned selection, streamed from its files
    (``dest``: each sorted sample's manifest row); its distinct clips and assets."""
    return stream_artifacts(
        parts,
        selected,
        dest,
        index=(index_path, lambda chunk: _index_table(recipe, chunk)),
        manifest=(manifest_path, lambda chunk: _manifest_table(recipe, chunk), _PARQUET_OPTIONS),
    )


def _inverse(order: NDArray[np.int64]) -> NDArray[np.int64]:
    """The inverse of the permutation ``order``."""
    dest = np.empty(order.size, dtype=np.int64)
    dest[order] = np.arange(order.size, dtype=np.int64)
    return dest


def _write_parquet(path: Path, table: pa.Table) -> None:
    pq.write_table(table, str(path), **_PARQUET_OPTIONS)
