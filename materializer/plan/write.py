"""Writing ``plan.arrow``: the chunks of :func:`~materializer.plan.steps.generate_steps`
streamed into one Arrow IPC file, hashed on the way, published atomically."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from catalog.atomic import atomic_path
from manifests.format import PLAN_SCHEMA
from materializer.plan.rng import check_seed
from materializer.plan.spec import PhaseSpec
from materializer.plan.steps import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_BATCH_STEPS,
    check_batching,
    iter_chunks,
    phase_models,
)
from materializer.plan.summary import PhaseStats, PlanSummary, summarise

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
) -> PlanSummary:
    """Write ``plan.arrow`` (an uncompressed Arrow IPC file, :data:`PLAN_SCHEMA`).

    Streams one record batch per chunk of :func:`generate_steps`, so memory is bounded
    by a chunk (``batch_rows``) plus the pools, never the plan. The file appears
    atomically (:func:`catalog.atomic.atomic_path`) and is byte-identical for the same phases,
    seed, ``num_streams``, ``batch_rows`` and ``batch_steps``.

    Raises:
        InvalidRecipe: A phase is invalid (nothing is written).
    """
    seed = check_seed(seed)
    check_batching(batch_rows, batch_steps)
    models, k = phase_models(phases, num_streams)
    chunks = iter_chunks(models, seed, k, batch_rows, batch_steps)
    stats: list[PhaseStats] = []
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as raw:
        sink = _HashingSink(raw)
        with (
            pa.PythonFile(sink, mode="w") as stream,
            pa.ipc.new_file(
                stream, PLAN_SCHEMA, options=pa.ipc.IpcWriteOptions(compression=None)
            ) as writer,
        ):
            for chunk in chunks:
                if not stats or stats[-1].model.spec.index != chunk.phase:
                    stats.append(PhaseStats(models[chunk.phase], chunk.first_step, k))
                stats[-1].add(chunk)
                writer.write_batch(chunk.to_record_batch())
    return summarise(stats, sink.hash.hexdigest(), sink.size)
