"""Generation: the plan as chunks of consecutive global steps.

Per step, the bucket comes from the phase's
:class:`~materializer.plan.buckets.BucketScheduler`, the per-stream counts from the
bucket's apportioner, the rows from each pool's
:class:`~materializer.plan.draw.PoolWalk`; then the step's rows are shuffled (sorted by
``mix(step, slot)``) so that every rank's contiguous slice carries the mixture. A phase
ends after ``num_steps`` steps, or with the first step whose cumulative tokens reach its
``token_budget``. Chunk boundaries move with ``batch_rows``/``batch_steps``; contents do
not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from catalog.errors import InvalidInput, InvalidRecipe
from manifests.format import PLAN_SCHEMA
from materializer.plan.buckets import BucketScheduler
from materializer.plan.draw import PoolWalk
from materializer.plan.layout import PhaseModel, check_quotas
from materializer.plan.rng import TAG_EPOCH, TAG_STEP, check_seed, derive, mix_order
from materializer.plan.spec import Int32s, Int64s, PhaseSpec

__all__ = [
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_BATCH_STEPS",
    "StepChunk",
    "check_batching",
    "chunk_steps",
    "generate_steps",
    "iter_chunks",
    "phase_chunks",
    "phase_models",
]

DEFAULT_BATCH_ROWS = 1 << 20  # plan rows per record batch (bounds memory; part of the bytes)
DEFAULT_BATCH_STEPS = 1 << 16  # steps per record batch at most


@dataclass(frozen=True, eq=False)
class StepChunk:
    """A run of consecutive global steps of one phase, in flat form.

    Attributes:
        phase: Phase index.
        first_step: Global number of the first step.
        bucket: Bucket per step (int32).
        offsets: Step ``i`` holds ``rows[offsets[i]:offsets[i+1]]`` (int64, from 0).
        rows: Manifest rows, shuffled within each step (int64).
        stream_epochs: Per step and stream id, the epoch the stream is in (int32,
            steps x streams): the fewest times any of its rows in the phase was drawn
            before the step.
        stream_samples: Samples per step and stream (int64).
        stream_tokens: Tokens per step and stream (int64).
    """

    phase: int
    first_step: int
    bucket: Int32s
    offsets: Int64s
    rows: Int64s
    stream_epochs: Int32s
    stream_samples: Int64s
    stream_tokens: Int64s

    @property
    def num_steps(self) -> int:
        return int(self.bucket.size)

    @property
    def steps(self) -> Int64s:
        return np.arange(self.first_step, self.first_step + self.num_steps, dtype=np.int64)

    def head(self, m: int) -> StepChunk:
        """The first ``m`` steps."""
        return StepChunk(
            self.phase,
            self.first_step,
            self.bucket[:m],
            self.offsets[: m + 1],
            self.rows[: int(self.offsets[m])],
            self.stream_epochs[:m],
            self.stream_samples[:m],
            self.stream_tokens[:m],
        )

    def to_record_batch(self) -> pa.RecordBatch:
        """The chunk as a :data:`~manifests.format.PLAN_SCHEMA` record batch (no copies of
        the row values; list arrays built from offsets and flat values)."""
        m, k = self.stream_epochs.shape
        epochs = pa.ListArray.from_arrays(
            pa.array(np.arange(0, (m + 1) * k, k, dtype=np.int32)),
            pa.array(np.ascontiguousarray(self.stream_epochs).reshape(-1)),
        )
        rows = pa.ListArray.from_arrays(
            pa.array(self.offsets.astype(np.int32)), pa.array(self.rows)
        )
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.steps),
                pa.array(np.full(m, self.phase, dtype=np.int32)),
                pa.array(self.bucket),
                epochs,
                rows,
                pa.array(np.zeros(m, dtype=np.int32)),
            ],
            schema=PLAN_SCHEMA,
        )


class _PhaseRun:
    """One phase being generated: its bucket schedule and pool walks, by step."""

    def __init__(self, model: PhaseModel, seed: int, first_step: int, num_streams: int) -> None:
        self.model = model
        self.phase = model.spec.index
        self.num_streams = num_streams
        self.schedule = BucketScheduler(model.sigma)
        self.next_step = first_step
        self.bucket_steps = [0] * len(model.buckets)
        self.walks = [
            [
                PoolWalk(r, t, derive(seed, TAG_EPOCH, self.phase, k, bm.bucket))
                for k, (r, t) in zip(bm.streams, bm.pools, strict=True)
            ]
            for bm in model.buckets
        ]
        self.step_base = np.uint64(derive(seed, TAG_STEP, self.phase))
        self.batches = np.array([bm.batch for bm in model.buckets], dtype=np.int64)
        self.allow_repeats = model.spec.allow_repeats_in_step

    def seek(self, steps: int) -> None:
        """Skip the phase's first ``steps`` steps without generating them: the state
        :meth:`chunk` would leave after them (how a step range is generated on its own).

        The bucket schedule is replayed (two heap operations a step); each pool's walk
        is put where the skipped steps leave it (cumulative quotas are a closed form of
        the bucket's step count) and replays only its last few steps, from one whose
        epoch is as generated from there on (:meth:`PoolWalk.replay_from`).
        """
        positions = self.schedule.take(steps)
        done = np.bincount(positions, minlength=len(self.model.buckets))
        for bi, bm in enumerate(self.model.buckets):
            j = int(done[bi])
            self.bucket_steps[bi] = j
            if not j:
                continue
            cum = bm.apportioner.cumulative(np.arange(j + 1, dtype=np.int64) * bm.batch)
            for si, (k, walk) in enumerate(zip(bm.streams, self.walks[bi], strict=True)):
                walk.replay_from(cum[:, si], self.model.quota[(k, bm.bucket)])
        self.next_step += steps

    def chunk(self, m: int) -> StepChunk:
        """The next ``m`` steps of the phase."""
        positions = self.schedule.take(m)
        offsets = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(self.batches[positions], out=offsets[1:])
        rows = np.empty(int(offsets[-1]), dtype=np.int64)
        tally = _Tally(self.num_streams, m)
        steps = np.arange(self.next_step, self.next_step + m, dtype=np.uint64)
        for bi, bm in enumerate(self.model.buckets):
            idx = np.flatnonzero(positions == bi)
            if not idx.size:
                for k, walk in zip(bm.streams, self.walks[bi], strict=True):
                    np.minimum(tally.epochs[k], walk.drawn // walk.n, out=tally.epochs[k])
                continue
            block = self._draw_bucket(bi, idx, tally)
            # Within-step shuffle: sort slots by mix(step, slot) -- unique keys per step.
            batch = bm.batch
            keys = (steps[idx] << np.uint64(24))[:, None] | np.arange(batch, dtype=np.uint64)
            keys += self.step_base
            order = mix_order(keys)
            shuffled = np.take_along_axis(block.reshape(idx.size, batch), order, axis=1)
            dest = offsets[idx][:, None] + np.arange(batch, dtype=np.int64)
            rows[dest.reshape(-1)] = shuffled.reshape(-1)
            self.bucket_steps[bi] += idx.size
        epochs = tally.epochs
        epochs[epochs == np.iinfo(np.int32).max] = 0  # streams not sampled in this phase
        chunk = StepChunk(
            phase=self.phase,
            first_step=self.next_step,
            bucket=np.asarray(self.model.bucket_ids, dtype=np.int32)[positions],
            offsets=offsets,
            rows=rows,
            stream_epochs=np.ascontiguousarray(epochs.T, dtype=np.int32),
            stream_samples=np.ascontiguousarray(tally.samples.T),
            stream_tokens=np.ascontiguousarray(tally.tokens.T),
        )
        self.next_step += m
        return chunk

    def _draw_bucket(self, bi: int, idx: Int64s, tally: _Tally) -> Int64s:
        """The rows of the chunk's steps ``idx`` of bucket ``bi``, step after step, each
        step's streams in order (``len(idx) * batch`` rows); counts go to ``tally``."""
        bm, walks = self.model.buckets[bi], self.walks[bi]
        batch, mb = bm.batch, idx.size
        j0 = self.bucket_steps[bi]
        seats = np.arange(j0, j0 + mb + 1, dtype=np.int64) * batch
        counts = np.diff(bm.apportioner.cumulative(seats), axis=0)  # (mb, streams)
        col = np.cumsum(counts, axis=1) - counts
        block = np.empty(mb * batch, dtype=np.int64)
        for si, (k, walk) in enumerate(zip(bm.streams, walks, strict=True)):
            c = counts[:, si]
            if not self.allow_repeats and int(c.max()) > walk.n:  # max_increments bounds it
                check_quotas(self.phase, {(k, bm.bucket): int(c.max())}, {(k, bm.bucket): walk.n})
            before = np.cumsum(c) - c
            drawn = np.zeros(tally.epochs.shape[1], dtype=np.int64)
            drawn[idx] = c
            pool_epoch = (walk.drawn + np.cumsum(drawn) - drawn) // walk.n
            np.minimum(tally.epochs[k], pool_epoch, out=tally.epochs[k])
            total = int(c.sum())
            if not total:
                continue
            r, t = walk.draw(c)
            base = np.arange(mb, dtype=np.int64) * batch + col[:, si] - before
            block[np.repeat(base, c) + np.arange(total)] = r
            csum = np.zeros(total + 1, dtype=np.int64)
            np.cumsum(t, out=csum[1:])
            tally.samples[k, idx] = c
            tally.tokens[k, idx] = csum[before + c] - csum[before]
        return block


class _Tally:
    """Per stream and step of one chunk: samples, tokens and the stream's epoch (the
    smallest epoch of its pools; int32 max until a pool of the stream is seen)."""

    def __init__(self, num_streams: int, m: int) -> None:
        self.samples = np.zeros((num_streams, m), dtype=np.int64)
        self.tokens = np.zeros((num_streams, m), dtype=np.int64)
        self.epochs = np.full((num_streams, m), np.iinfo(np.int32).max, dtype=np.int64)


def phase_models(
    phases: Sequence[PhaseSpec], num_streams: int | None
) -> tuple[list[PhaseModel], int]:
    """Every phase's model and the number of stream columns, checked before any step."""
    if not phases:
        raise InvalidRecipe("a plan needs at least one phase", path="phases")
    for i, spec in enumerate(phases):
        if spec.index != i:
            raise InvalidRecipe(
                f"phases[{i}] has index {spec.index}; phases are numbered 0, 1, ... in order",
                path=f"phases[{i}]",
            )
    models = [PhaseModel(spec) for spec in phases]
    needed = 1 + max(int(s.pool.stream.max(initial=0)) for s in phases)
    needed = max(needed, 1 + max(max(s.stream_weights) for s in phases))
    if num_streams is None:
        num_streams = needed
    elif num_streams < needed:
        raise InvalidInput(
            f"num_streams={num_streams} but stream id {needed - 1} occurs", field="num_streams"
        )
    return models, num_streams


def check_batching(batch_rows: int, batch_steps: int) -> None:
    """Refuse chunk sizes outside ``[1, 2**30]``."""
    if not (1 <= batch_rows <= 1 << 30 and 1 <= batch_steps <= 1 << 30):
        # List offsets are int32: a record batch holds fewer than 2**31 rows.
        raise InvalidInput("batch_rows and batch_steps must be in [1, 2**30]", field="batch_rows")


def iter_chunks(
    models: list[PhaseModel], seed: int, num_streams: int, batch_rows: int, batch_steps: int
) -> Iterator[StepChunk]:
    """The chunks of checked ``models`` (:func:`generate_steps` without the checks)."""
    first = 0
    for model in models:
        for chunk in phase_chunks(model, seed, num_streams, first, batch_rows, batch_steps):
            yield chunk
            first = chunk.first_step + chunk.num_steps


def chunk_steps(model: PhaseModel, batch_rows: int, batch_steps: int) -> int:
    """Steps per chunk of a phase (its last chunk may be shorter)."""
    return min(batch_steps, max(1, batch_rows // model.max_batch))


def phase_chunks(
    model: PhaseModel,
    seed: int,
    num_streams: int,
    first_step: int,
    batch_rows: int,
    batch_steps: int,
    *,
    skip: int = 0,
    count: int | None = None,
) -> Iterator[StepChunk]:
    """The chunks of one phase that starts at global step ``first_step``: all of them,
    or (a ``num_steps`` phase) the ``count`` steps after the first ``skip``, which
    must be a multiple of :func:`chunk_steps` so that chunks fall where a whole run
    puts them."""
    run = _PhaseRun(model, seed, first_step, num_streams)
    spec = model.spec
    per_chunk = chunk_steps(model, batch_rows, batch_steps)
    if skip:
        run.seek(skip)
    stop = spec.num_steps if count is None else skip + count
    done, tokens = skip, 0
    while True:
        m = per_chunk if stop is None else min(per_chunk, stop - done)
        if m <= 0:
            return
        chunk = run.chunk(m)
        if spec.token_budget is not None:
            # The phase ends with the first step whose cumulative tokens reach the budget.
            reached = np.cumsum(chunk.stream_tokens.sum(axis=1)) + tokens >= spec.token_budget
            if reached.any():
                chunk = chunk.head(int(np.argmax(reached)) + 1)
            tokens += int(chunk.stream_tokens.sum())
        done += chunk.num_steps
        yield chunk
        if done >= (stop or 0) and tokens >= (spec.token_budget or 0):
            return


def generate_steps(
    phases: Sequence[PhaseSpec],
    seed: int,
    *,
    num_streams: int | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_steps: int = DEFAULT_BATCH_STEPS,
) -> Iterator[StepChunk]:
    """Generate the plan as chunks of consecutive steps (pure: same inputs, same chunks'
    contents; chunk boundaries move with ``batch_rows``/``batch_steps``, contents do not).

    Args:
        phases: Phases in order; ``phases[i].index`` must be ``i``.
        seed: Any integer in ``[0, 2**64)``.
        num_streams: Length of ``stream_epochs`` (default: one past the largest stream
            id in any pool or weights).
        batch_rows: Plan rows per chunk at most (a single step may exceed it).
        batch_steps: Steps per chunk at most.

    Raises:
        InvalidRecipe: See :class:`PhaseSpec` and :func:`plan_layout`; checked for every
            phase before the first chunk is produced.
    """
    seed = check_seed(seed)
    check_batching(batch_rows, batch_steps)
    models, k = phase_models(phases, num_streams)
    return iter_chunks(models, seed, k, batch_rows, batch_steps)
