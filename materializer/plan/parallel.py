"""Generating a plan per step range on an executor, concatenated in step order.

Randomness is counter based and every state a step needs is a closed form of how many
steps came before it (the bucket schedule's counts, each pool walk's position: see
:meth:`~materializer.plan.steps._PhaseRun.seek`), so the steps ``[a, b)`` of a
``num_steps`` phase can be generated without generating ``[0, a)``. A phase is cut
into one range per worker, each a whole number of the chunks a one-process run makes
(:func:`~materializer.plan.steps.chunk_steps`); each task writes its chunks as an
Arrow IPC stream into a spill directory and returns them without their rows (what
:class:`~materializer.plan.summary.PhaseStats` needs); :func:`parallel_chunks` yields
the chunks and their record batches in step order, one batch in memory at a time. The
record batches are those of a one-process run, so ``plan.arrow`` is byte-identical for
every worker count.

A ``token_budget`` phase ends at a step known only once its tokens are drawn: it runs
in this process, after the ranges of the phases before it.

The spill directory must be one the workers can write and this process read: the
local executor's processes share this machine's disk.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from manifests.format import PLAN_SCHEMA
from materializer.plan.layout import PhaseModel
from materializer.plan.spec import PhaseSpec
from materializer.plan.steps import StepChunk, chunk_steps, phase_chunks

if TYPE_CHECKING:
    from materializer.executors import Executor

__all__ = ["PlanInputs", "RangeTask", "generate_range", "parallel_chunks", "range_tasks"]

_IPC = pa.ipc.IpcWriteOptions(compression=None)


@dataclass(frozen=True)
class PlanInputs:
    """What every range task shares (sent to each worker once)."""

    phases: tuple[PhaseSpec, ...]
    seed: int
    num_streams: int
    batch_rows: int
    batch_steps: int


@dataclass(frozen=True)
class RangeTask:
    """Steps ``[skip, skip + count)`` of phase ``phase`` (which starts at global step
    ``first_step``), written to the IPC stream at ``path``."""

    phase: int
    first_step: int
    skip: int
    count: int
    path: str


def generate_range(inputs: PlanInputs, task: RangeTask) -> list[StepChunk]:
    """Write the task's chunks to ``task.path``; return them without their rows."""
    model = PhaseModel(inputs.phases[task.phase])
    chunks = phase_chunks(
        model,
        inputs.seed,
        inputs.num_streams,
        task.first_step,
        inputs.batch_rows,
        inputs.batch_steps,
        skip=task.skip,
        count=task.count,
    )
    out: list[StepChunk] = []
    no_rows = np.zeros(0, dtype=np.int64)
    with (
        pa.OSFile(task.path, "wb") as sink,
        pa.ipc.new_stream(sink, PLAN_SCHEMA, options=_IPC) as w,
    ):
        for chunk in chunks:
            w.write_batch(chunk.to_record_batch())
            out.append(dataclasses.replace(chunk, rows=no_rows))
    return out


def range_tasks(
    model: PhaseModel, first_step: int, inputs: PlanInputs, workers: int, directory: Path
) -> list[RangeTask]:
    """A ``num_steps`` phase as up to ``workers`` ranges of whole chunks."""
    steps = model.spec.num_steps
    assert steps is not None
    per = chunk_steps(model, inputs.batch_rows, inputs.batch_steps)
    chunks = -(-steps // per)
    edges = [min(steps, per * (chunks * i // workers)) for i in range(workers + 1)]
    index = model.spec.index
    return [
        RangeTask(index, first_step, lo, hi - lo, str(directory / f"phase{index}-{lo}.arrows"))
        for lo, hi in itertools.pairwise(edges)
        if hi > lo
    ]


def parallel_chunks(
    inputs: PlanInputs,
    models: Sequence[PhaseModel],
    executor: Executor,
    workers: int,
    directory: Path,
) -> Iterator[tuple[StepChunk, pa.RecordBatch]]:
    """Every chunk of the plan (without rows) and its record batch, in step order."""
    first, pending = 0, []
    for model in models:
        steps = model.spec.num_steps
        if steps is not None:
            pending += range_tasks(model, first, inputs, workers, directory)
            first += steps
            continue
        yield from _collect(executor, inputs, pending)
        pending = []
        for chunk in phase_chunks(
            model, inputs.seed, inputs.num_streams, first, inputs.batch_rows, inputs.batch_steps
        ):
            first = chunk.first_step + chunk.num_steps
            yield chunk, chunk.to_record_batch()
    yield from _collect(executor, inputs, pending)


def _collect(
    executor: Executor, inputs: PlanInputs, tasks: list[RangeTask]
) -> Iterator[tuple[StepChunk, pa.RecordBatch]]:
    """Run ``tasks``; yield their chunks and batches, reading one batch at a time."""
    if not tasks:
        return
    results = executor.map(generate_range, inputs, tasks, label="plan step range")
    for task, chunks in zip(tasks, results, strict=True):
        with pa.OSFile(task.path, "rb") as source:
            batches = pa.ipc.open_stream(source)
            yield from zip(chunks, batches, strict=True)
        os.unlink(task.path)
