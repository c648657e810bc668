"""Writing ``plan.arrow``: the chunks of :func:`~materializer.plan.steps.generate_steps`
streamed into one Arrow IPC file, hashed on the way, published atomically; generated
in this process, or per step range on an executor (:mod:`materializer.plan.parallel`),
with the same bytes."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from catalog.atomic import atomic_path
from catalog.errors import InvalidInput
from manifests.format import PLAN_SCHEMA
from materializer.plan.parallel import PlanInputs, parallel_chunks
from materializer.plan.rng import check_seed
from materializer.plan.spec import PhaseSpec
from materializer.plan.steps import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_BATCH_STEPS,
    StepChunk,
    check_batching,
    iter_chunks,
    phase_models,
)
from materializer.plan.summary import PhaseStats, PlanSummary, summarise

if TYPE_CHECKING:
    from materializer.executors import Executor

__all__ = ["write_plan"]


class _HashingSink:
    """A write-only file object that hashes what passes through it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.hash.update(view)
        self.raw.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


def write_plan(
    path: str | os.PathLike[str],
    phases: Sequence[PhaseSpec],
    seed: int,
    *,
    num_streams: int | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_steps: int = DEFAULT_BATCH_STEPS,
    executor: Executor | None = None,
    workers: int = 1,
) -> PlanSummary:
    """Write ``plan.arrow`` (an uncompressed Arrow IPC file, :data:`PLAN_SCHEMA`).

    Streams one record batch per chunk of :func:`generate_steps`, so memory is bounded
    by a chunk (``batch_rows``) plus the pools, never the plan. The file appears
    atomically (:func:`catalog.atomic.atomic_path`) and is byte-identical for the same phases,
    seed, ``num_streams``, ``batch_rows`` and ``batch_steps``, whatever ``executor``
    and ``workers``: with an executor and ``workers > 1`` each ``num_steps`` phase is
    generated as ``workers`` step ranges in parallel (:mod:`materializer.plan.parallel`;
    they spill next to ``path``).

    Raises:
        InvalidRecipe: A phase is invalid (nothing is written).
    """
    seed = check_seed(seed)
    check_batching(batch_rows, batch_steps)
    if workers < 1:
        raise InvalidInput(f"workers must be >= 1, got {workers}", field="workers")
    models, k = phase_models(phases, num_streams)
    stats: list[PhaseStats] = []
    spill = None
    if executor is not None and workers > 1:
        spill = Path(tempfile.mkdtemp(prefix=".plan-ranges-", dir=Path(path).parent))
    try:
        if spill is None:
            chunks: Iterator[tuple[StepChunk, pa.RecordBatch]] = (
                (c, c.to_record_batch())
                for c in iter_chunks(models, seed, k, batch_rows, batch_steps)
            )
        else:
            assert executor is not None
            inputs = PlanInputs(tuple(phases), seed, k, batch_rows, batch_steps)
            chunks = parallel_chunks(inputs, models, executor, workers, spill)
        with atomic_path(Path(path)) as tmp, open(tmp, "wb") as raw:
            sink = _HashingSink(raw)
            with (
                pa.PythonFile(sink, mode="w") as stream,
                pa.ipc.new_file(
                    stream, PLAN_SCHEMA, options=pa.ipc.IpcWriteOptions(compression=None)
                ) as writer,
            ):
                for chunk, batch in chunks:
                    if not stats or stats[-1].model.spec.index != chunk.phase:
                        stats.append(PhaseStats(models[chunk.phase], chunk.first_step, k))
                    stats[-1].add(chunk)
                    writer.write_batch(batch)
    finally:
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)
    return summarise(stats, sink.hash.hexdigest(), sink.size)
