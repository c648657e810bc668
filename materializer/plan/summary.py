"""What a written plan realized: per-phase and whole-plan summaries.

:class:`PhaseStats` keeps running totals while chunks stream to disk, including each
stream's worst deviation from its share over every prefix of the phase; the summaries
go into ``snapshot.json`` (:meth:`PlanSummary.to_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from materializer.plan.layout import PhaseModel
from materializer.plan.steps import StepChunk

__all__ = ["PhaseStats", "PhaseSummary", "PlanSummary", "summarise"]


@dataclass(frozen=True)
class PhaseSummary:
    """What one phase of a written plan realized.

    Attributes:
        index: Phase index.
        first_step: Global number of the phase's first step.
        num_steps: Steps in the phase (derived from the budget in a token phase).
        plan_rows: Samples in the phase.
        tokens: Tokens in the phase.
        unit: What the weights are shares of (``"samples"`` or ``"tokens"``).
        bucket_steps: Steps per bucket.
        bucket_samples: Samples per bucket.
        stream_samples: Samples per stream.
        stream_tokens: Tokens per stream.
        stream_epochs: Per stream, its epoch after the phase (passes completed over
            every one of its rows).
        stream_passes: Per stream, samples drawn / rows available.
        share_bound: Per stream, the derived bound on the deviation (in ``unit``).
        max_deviation: Per stream, the largest ``|realized - w * total|`` over every
            prefix of the phase (in ``unit``); never above ``share_bound``.
        repeats_in_step: Samples that repeat a row already in their step (0 unless
            the phase allows repeats and a pool is smaller than its quota).
    """

    index: int
    first_step: int
    num_steps: int
    plan_rows: int
    tokens: int
    unit: str
    bucket_steps: Mapping[int, int]
    bucket_samples: Mapping[int, int]
    stream_samples: Mapping[int, int]
    stream_tokens: Mapping[int, int]
    stream_epochs: Mapping[int, int]
    stream_passes: Mapping[int, float]
    share_bound: Mapping[int, float]
    max_deviation: Mapping[int, float]
    repeats_in_step: int


@dataclass(frozen=True)
class PlanSummary:
    """What :func:`write_plan` wrote.

    Attributes:
        num_steps: Steps in the plan.
        plan_rows: Samples in the plan (sum of every step's batch).
        tokens: Tokens in the plan.
        stream_shares: Realized share of samples per stream over the whole plan.
        stream_token_shares: Realized share of tokens per stream.
        bucket_histogram: Per bucket, ``{"steps": ..., "samples": ...}``.
        stream_epochs: Per stream, epochs completed, summed over phases.
        repeats_in_step: Samples that repeat a row already in their step, all phases.
        sha256: SHA-256 of the plan file.
        size: Size of the plan file in bytes.
        phases: Per-phase detail.
    """

    num_steps: int
    plan_rows: int
    tokens: int
    stream_shares: Mapping[int, float]
    stream_token_shares: Mapping[int, float]
    bucket_histogram: Mapping[int, Mapping[str, int]]
    stream_epochs: Mapping[int, int]
    repeats_in_step: int
    sha256: str
    size: int
    phases: tuple[PhaseSummary, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (integer keys become strings), for ``snapshot.json``."""

        def plain(value: Any) -> Any:
            if isinstance(value, Mapping):
                return {str(k): plain(v) for k, v in value.items()}
            if isinstance(value, tuple | list):
                return [plain(v) for v in value]
            if isinstance(value, PhaseSummary):
                return {f: plain(getattr(value, f)) for f in value.__dataclass_fields__}
            return value

        return {f: plain(getattr(self, f)) for f in self.__dataclass_fields__}


class PhaseStats:
    """Running totals of one phase, including the worst prefix deviation per stream."""

    def __init__(self, model: PhaseModel, first_step: int, num_streams: int) -> None:
        self.model = model
        self.first_step = first_step
        self.streams = np.array(sorted(model.weights), dtype=np.int64)
        self.w = np.array([model.weights[k] for k in self.streams.tolist()])
        self.samples = np.zeros(num_streams, dtype=np.int64)
        self.tokens = np.zeros(num_streams, dtype=np.int64)
        self.worst = np.zeros(self.streams.size)
        self.steps = 0
        self.bucket_steps: dict[int, int] = {}
        self.bucket_samples: dict[int, int] = {}
        self.pool_drawn = dict.fromkeys(model.pools, 0)
        self.repeats = 0

    def add(self, chunk: StepChunk) -> None:
        per = chunk.stream_tokens if self.model.unit == "tokens" else chunk.stream_samples
        done = self.tokens if self.model.unit == "tokens" else self.samples
        cum = np.cumsum(per[:, self.streams], axis=0) + done[self.streams]
        total = np.cumsum(per.sum(axis=1)) + int(done.sum())
        dev = np.abs(cum - total[:, None] * self.w[None, :])
        np.maximum(self.worst, dev.max(axis=0, initial=0.0), out=self.worst)
        self.samples += chunk.stream_samples.sum(axis=0)
        self.tokens += chunk.stream_tokens.sum(axis=0)
        self.steps += chunk.num_steps
        sizes = np.diff(chunk.offsets)
        for b in self.model.bucket_ids:
            mask = chunk.bucket == b
            if not mask.any():
                continue
            self.bucket_steps[b] = self.bucket_steps.get(b, 0) + int(mask.sum())
            self.bucket_samples[b] = self.bucket_samples.get(b, 0) + int(sizes[mask].sum())
            # Steps are bucket-pure: stream k's samples in bucket-b steps all come from
            # pool (k, b).
            drawn = chunk.stream_samples[mask].sum(axis=0)
            for k in self.streams.tolist():
                if (k, b) in self.pool_drawn:
                    self.pool_drawn[(k, b)] += int(drawn[k])
                    # A step drawing c > n rows of a pool holds c - n of them twice.
                    excess = chunk.stream_samples[mask, k] - self.model.pools[(k, b)][0].size
                    self.repeats += int(np.maximum(excess, 0).sum())

    def summary(self) -> PhaseSummary:
        keys = self.streams.tolist()
        rows = dict.fromkeys(keys, 0)
        epochs: dict[int, int] = {}
        for (k, b), (r, _) in self.model.pools.items():
            rows[k] += r.size
            done = self.pool_drawn[(k, b)] // r.size
            epochs[k] = min(epochs.get(k, done), done)
        return PhaseSummary(
            index=self.model.spec.index,
            first_step=self.first_step,
            num_steps=self.steps,
            plan_rows=int(self.samples.sum()),
            tokens=int(self.tokens.sum()),
            unit=self.model.unit,
            bucket_steps=MappingProxyType(dict(sorted(self.bucket_steps.items()))),
            bucket_samples=MappingProxyType(dict(sorted(self.bucket_samples.items()))),
            stream_samples=MappingProxyType({k: int(self.samples[k]) for k in keys}),
            stream_tokens=MappingProxyType({k: int(self.tokens[k]) for k in keys}),
            stream_epochs=MappingProxyType(epochs),
            stream_passes=MappingProxyType({k: int(self.samples[k]) / rows[k] for k in keys}),
            share_bound=self.model.layout.share_bound,
            max_deviation=MappingProxyType(dict(zip(keys, self.worst.tolist(), strict=True))),
            repeats_in_step=self.repeats,
        )


def summarise(stats: list[PhaseStats], sha256: str, size: int) -> PlanSummary:
    """The plan's summary from its phases' running totals and the file's hash and size."""
    phases = tuple(st.summary() for st in stats)
    samples: dict[int, int] = {}
    tokens: dict[int, int] = {}
    epochs: dict[int, int] = {}
    histogram: dict[int, dict[str, int]] = {}
    for ph in phases:
        for k, v in ph.stream_samples.items():
            samples[k] = samples.get(k, 0) + v
            tokens[k] = tokens.get(k, 0) + ph.stream_tokens[k]
            epochs[k] = epochs.get(k, 0) + ph.stream_epochs[k]
        for b, steps in ph.bucket_steps.items():
            entry = histogram.setdefault(b, {"steps": 0, "samples": 0})
            entry["steps"] += steps
            entry["samples"] += ph.bucket_samples[b]
    plan_rows, plan_tokens = sum(samples.values()), sum(tokens.values())
    return PlanSummary(
        num_steps=sum(ph.num_steps for ph in phases),
        plan_rows=plan_rows,
        tokens=plan_tokens,
        stream_shares=MappingProxyType(
            {k: v / plan_rows for k, v in sorted(samples.items())} if plan_rows else {}
        ),
        stream_token_shares=MappingProxyType(
            {k: v / plan_tokens for k, v in sorted(tokens.items())} if plan_tokens else {}
        ),
        bucket_histogram=MappingProxyType(
            {b: MappingProxyType(v) for b, v in sorted(histogram.items())}
        ),
        stream_epochs=MappingProxyType(dict(sorted(epochs.items()))),
        repeats_in_step=sum(ph.repeats_in_step for ph in phases),
        sha256=sha256,
        size=size,
        phases=phases,
    )
