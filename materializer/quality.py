"""The plan quality report (``quality.json``): what a written plan realized, measured.

The plan modules (:mod:`materializer.plan`) prove bounds on what they emit; this
module measures the emitted plan independently, from ``plan.arrow`` and the manifest
columns, so a planner bug (or a recipe that starves a stream) shows up as a number
in every cut. All of it is vectorised numpy over the flattened plan (one int64 per
plan row); 10M plan rows take a few seconds (``benchmarks/quality.py``).

What is measured (the shape is ``quality.json`` in ``manifests/format.py``):

* **Shares.** Per phase, every sliding window of ``window_steps`` consecutive steps
  (stride one step; the whole phase when shorter): each stream's realized share (of
  samples, or of tokens in a ``token_budget`` phase) against its target weight. The
  phase reports the largest ``|realized - target|`` over windows and streams and the
  99th percentile over windows of each window's worst stream; ``max_share_deviation``
  is the largest over phases. Per-step counts come from one ``bincount``; windows are
  differences of a cumulative sum.
* **Repeats.** Samples whose row already appears in their step (each step's rows
  sorted on their own, the steps of one size as one block): 0 unless a phase allows
  repeats.
* **Epochs.** Per (stream, bucket): manifest rows, plan draws, and draws / rows.
* **Autocorrelation** of the categorical keys ``source``, ``asset_id`` and, when the
  manifest has one, ``cluster``, over the realized sample stream (steps in order,
  rows in plan order within a step), at lags ``1 … 4 x global batch`` (at most 256
  lags, spread evenly). Encoding: the one-hot indicator vector of the key. Its
  autocorrelation, pooled over categories (the trace of the lag-``h`` autocovariance
  over the trace of the covariance), is exactly
  ``(m(h) - sum_c p_c**2) / (1 - sum_c p_c**2)``, where ``m(h)`` is the fraction of
  positions whose key equals the key ``h`` later and ``p_c`` the key's frequencies.
  So it is computed by comparing integer codes (no hashing, hence no collision noise
  for keys with few values, such as sources), in contiguous blocks that stay in
  cache: at most ``ACF_POSITIONS`` positions per lag (evenly spaced blocks beyond
  that, a standard error below 0.001). It is 0 for an even shuffle, 1 when equal
  keys come in runs longer than the lag, and defined as 0 for a key with one value.
  ``max_autocorr_beyond_batch`` is the largest ``|acf|`` over lags above the largest
  global batch of the recipe (``batch_lag``), the seeds' "flat beyond lag ~global
  batch" criterion.

The recipe's optional ``quality`` block sets ``window_steps`` and thresholds;
:func:`check_quality` fails the cut (:class:`~catalog.errors.InvalidInput`, nothing
published) when a measured number exceeds its threshold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog.atomic import write_bytes
from catalog.errors import InvalidInput
from manifests.format import QUALITY_NAME
from manifests.ipc import iter_batches
from materializer.memory import release_unused
from materializer.quality_rows import (
    AUTOCORR_KEYS,
    DrawnRows,
    drawn_rows,
    manifest_slices,
    whole_table,
)

if TYPE_CHECKING:
    from materializer.recipe import Recipe

__all__ = [
    "ACF_POSITIONS",
    "AUTOCORR_KEYS",
    "DEFAULT_WINDOW_STEPS",
    "MAX_LAGS",
    "MAX_WINDOW_POINTS",
    "DrawnRows",
    "PhaseTarget",
    "PlanArrays",
    "autocorrelation",
    "check_quality",
    "cut_quality",
    "drawn_report",
    "plan_quality",
    "quality_bytes",
    "quality_report",
    "quality_summary",
    "read_plan",
]

DEFAULT_WINDOW_STEPS = 16
#: Lags evaluated at most (spread evenly over ``1 … 4 x global batch``).
MAX_LAGS = 256
#: Window start points kept per phase in the report (downsampled evenly).
MAX_WINDOW_POINTS = 200
#: Positions compared per lag at most; beyond it, evenly spaced contiguous blocks.
ACF_POSITIONS = 1 << 21
_ACF_BLOCK = 1 << 16
_THRESHOLDS = ("max_autocorr_beyond_batch", "max_share_deviation")

Ints = NDArray[np.int64]


@dataclass(frozen=True)
class PlanArrays:
    """A plan, flattened: ``rows[offsets[s]:offsets[s+1]]`` are step ``s``'s rows.

    Attributes:
        phase: Phase index per step.
        offsets: ``num_steps + 1`` sample offsets.
        rows: Manifest row per sample, in plan order.
    """

    phase: Ints
    offsets: Ints
    rows: Ints

    @property
    def num_steps(self) -> int:
        return int(self.phase.size)

    def sample_steps(self) -> Ints:
        """The step of every sample."""
        return np.repeat(np.arange(self.num_steps, dtype=np.int64), np.diff(self.offsets))


@dataclass(frozen=True)
class PhaseTarget:
    """One phase's targets: its name, stream id -> target share, and the unit."""

    name: str
    targets: Mapping[int, float]
    unit: str = "samples"


def read_plan(path: str | Path) -> PlanArrays:
    """``plan.arrow`` as flat arrays (one pass over its record batches)."""
    phases, lengths, rows = [], [], []
    for batch in iter_batches(path, what="plan.arrow"):
        lists = batch.column("rows")
        phases.append(batch.column("phase").to_numpy().astype(np.int64))
        lengths.append(pc.list_value_length(lists).to_numpy().astype(np.int64))
        rows.append(np.asarray(pc.list_flatten(lists).to_numpy(), dtype=np.int64))
    phase = np.concatenate(phases) if phases else np.zeros(0, np.int64)
    length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    offsets = np.zeros(length.size + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return PlanArrays(phase=phase, offsets=offsets, rows=flat)


# -- the cut's entry points -----------------------------------------------------------
def cut_quality(
    recipe: Recipe,
    plan_path: Path,
    samples: pa.Table | Path,
    out: Path,
    *,
    distinct: dict[str, int] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The cut's ``quality`` stage: measure the plan, fail on a threshold
    (:func:`check_quality`), else write ``out/quality.json``; its path and the report.
    ``samples`` and ``distinct`` as :func:`plan_quality` takes them."""
    report = plan_quality(plan_path, samples, recipe, distinct=distinct)
    check_quality(report)
    path = out / QUALITY_NAME
    write_bytes(path, quality_bytes(report))
    return path, report


def quality_bytes(report: Mapping[str, Any]) -> bytes:
    """``quality.json`` as stored: sorted keys, no NaN, UTF-8 (byte-identical for
    the same plan)."""
    text = json.dumps(report, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def plan_quality(
    plan_path: str | Path,
    samples: pa.Table | Path,
    recipe: Recipe,
    *,
    distinct: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The quality report of a cut: ``plan.arrow`` against the manifest's ``samples``
    (manifest row order, with ``stream``, ``bucket``, ``tokens`` and the
    :data:`AUTOCORR_KEYS` present), or against ``manifest.parquet`` at that path, read
    one row group at a time (the same report), and the recipe's targets and
    thresholds. Only the drawn rows' values are kept (:mod:`materializer.quality_rows`),
    but of a table, which is held anyway: every row's.

    ``distinct``, given with a table, gets each string key's count of distinct non-null
    values, read off the codes made here anyway (the snapshot's asset count: a second
    hash of 600k asset ids cost ~0.15-0.3 s of the 1M-clip cut; decision 063)."""
    names = [s.name for s in recipe.streams]
    targets = [
        PhaseTarget(
            name=p.name,
            targets={names.index(n): w for n, w in p.weights.items()},
            unit="tokens" if p.token_budget is not None else "samples",
        )
        for p in recipe.phases
    ]
    gate = recipe.quality
    batch = max(
        max([p.global_batch.default, *p.global_batch.overrides.values()]) for p in recipe.phases
    )
    plan = read_plan(plan_path)
    if isinstance(samples, pa.Table):
        drawn = whole_table(plan.rows, samples)
        for k, codes in drawn.keys.items():
            if distinct is not None and not pa.types.is_integer(samples[k].type):
                # Codes are 0 … k-1 by first appearance, nulls one more past them.
                nulls = 1 if samples[k].null_count else 0
                distinct[k] = int(codes.max(initial=-1)) + 1 - nulls
    else:
        drawn = drawn_rows(plan.rows, manifest_slices(samples))
    # The slices and the encodings' hash tables are freed Arrow memory that mimalloc
    # would keep, and the report's numpy arrays cannot reuse.
    release_unused()
    return drawn_report(
        plan,
        drawn,
        phases=targets,
        stream_names=names,
        bucket_names=list(recipe.buckets.bucket_keys()),
        global_batch=int(batch),
        window_steps=gate.window_steps if gate is not None else DEFAULT_WINDOW_STEPS,
        thresholds={t: getattr(gate, t, None) for t in _THRESHOLDS},
    )


def check_quality(report: Mapping[str, Any]) -> None:
    """Fail the cut when a measured number exceeds the recipe's threshold.

    Raises:
        InvalidInput: ``path`` (and ``field``) name the threshold
            (``quality.max_share_deviation``); ``value`` and ``threshold`` are the
            two numbers.
    """
    for name in _THRESHOLDS:
        limit = report["thresholds"].get(name)
        value = report[name]
        if limit is not None and value > limit:
            raise InvalidInput(
                f"plan quality: {name} is {value:.4g}, above the recipe's threshold "
                f"quality.{name} = {limit:g}; nothing was published "
                "(`vidlake cut --dry-run` shows the numbers; docs/instruments.md)",
                path=f"quality.{name}",
                field=f"quality.{name}",
                value=value,
                threshold=limit,
            )


def quality_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """snapshot.json's ``quality``: the headline numbers and the verdict."""
    keys = ("repeated_in_step", "max_share_deviation", "max_autocorr_beyond_batch", "passed")
    return {k: report[k] for k in keys}


# -- the report -----------------------------------------------------------------------
def quality_report(
    plan: PlanArrays,
    *,
    stream: Ints,
    bucket: Ints,
    tokens: Ints,
    keys: Mapping[str, Ints],
    phases: Sequence[PhaseTarget],
    stream_names: Sequence[str],
    bucket_names: Sequence[str],
    global_batch: int,
    window_steps: int = DEFAULT_WINDOW_STEPS,
    thresholds: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """The report of ``plan`` over manifest rows with the given per-row arrays.

    ``stream``, ``bucket``, ``tokens`` and every array of ``keys`` (integer codes,
    e.g. :func:`~materializer.quality_rows.codes` of a string column) are indexed by
    manifest row. The same report as :func:`drawn_report` of their drawn rows.
    """
    drawn = DrawnRows.of_arrays(plan.rows, stream, bucket, tokens, keys)
    return drawn_report(
        plan,
        drawn,
        phases=phases,
        stream_names=stream_names,
        bucket_names=bucket_names,
        global_batch=global_batch,
        window_steps=window_steps,
        thresholds=thresholds,
    )


def drawn_report(
    plan: PlanArrays,
    drawn: DrawnRows,
    *,
    phases: Sequence[PhaseTarget],
    stream_names: Sequence[str],
    bucket_names: Sequence[str],
    global_batch: int,
    window_steps: int = DEFAULT_WINDOW_STEPS,
    thresholds: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """The report of ``plan`` over the manifest's ``drawn`` rows: every per-row array
    is indexed by the plan's rows renumbered to their place in ``drawn.rows`` (the
    equalities and counts it measures are the same), so it is O(plan), whatever the
    manifest's size."""
    if window_steps < 1 or global_batch < 1:
        raise InvalidInput("window_steps and global_batch must be >= 1", field="window_steps")
    n = drawn.rows.size
    if n and not (drawn.rows[0] == 0 and drawn.rows[-1] == n - 1):  # else every row: 0 … n-1
        local = np.searchsorted(drawn.rows, plan.rows)
        plan = PlanArrays(phase=plan.phase, offsets=plan.offsets, rows=local)
    steps = plan.sample_steps()
    width = max([len(stream_names), *(s + 1 for s, _ in drawn.available), 1])
    phase_docs = _shares(
        plan, steps, drawn.stream, drawn.tokens, phases, stream_names, window_steps, width
    )
    lags = _lags(global_batch, plan.rows.size)
    series = {k: _key_acf(_dense(c), plan.rows, lags) for k, c in drawn.keys.items()}
    beyond = lags > global_batch
    acf_max = max((float(np.abs(s[beyond]).max(initial=0.0)) for s in series.values()), default=0.0)
    share_max = max((p["max_abs_deviation"] for p in phase_docs), default=0.0)
    limits = {t: (thresholds or {}).get(t) for t in _THRESHOLDS}
    measured = {"max_autocorr_beyond_batch": acf_max, "max_share_deviation": share_max}
    passed = all(v is None or measured[k] <= v for k, v in limits.items())
    return {
        "format": 1,
        "global_batch": int(global_batch),
        "window_steps": int(window_steps),
        "repeated_in_step": _repeats(plan, steps),
        "max_share_deviation": share_max,
        "max_autocorr_beyond_batch": acf_max,
        "batch_lag": int(global_batch),
        "thresholds": limits,
        "passed": passed,
        "phases": phase_docs,
        "epochs": _epochs(plan.rows, drawn, stream_names, bucket_names),
        "autocorr": {
            "lags": lags.tolist(),
            "series": {k: [round(float(v), 6) for v in s] for k, s in series.items()},
        },
    }


def _repeats(plan: PlanArrays, steps: Ints) -> int:
    """Samples whose row already appears earlier in their step: the steps of each batch
    size as one (steps, size) block, each row sorted on its own (a sort of ``size``
    keys per step, not one sort of the whole plan: about half the time at 10M rows)."""
    if plan.rows.size == 0:
        return 0
    sizes = np.diff(plan.offsets)
    repeats = 0
    for size in np.unique(sizes[sizes > 1]).tolist():
        starts = plan.offsets[:-1][sizes == size]
        block = plan.rows[starts[:, None] + np.arange(size)]
        block.sort(axis=1)
        repeats += int(np.count_nonzero(block[:, 1:] == block[:, :-1]))
    return repeats


def _shares(
    plan: PlanArrays,
    steps: Ints,
    stream: Ints,
    tokens: Ints,
    phases: Sequence[PhaseTarget],
    stream_names: Sequence[str],
    window: int,
    k: int,
) -> list[dict[str, Any]]:
    """Per phase: realized share vs target over sliding windows of ``window`` steps
    (``k`` streams: above every stream id of the manifest)."""
    sample_stream = stream[plan.rows]
    flat = steps * k + sample_stream
    size = plan.num_steps * k
    counts = np.bincount(flat, minlength=size).astype(np.float64).reshape(plan.num_steps, k)
    token_counts = counts
    if any(t.unit == "tokens" for t in phases):
        weighted = np.bincount(flat, weights=tokens[plan.rows], minlength=size)
        token_counts = weighted.astype(np.float64).reshape(plan.num_steps, k)
    docs = []
    for index, target in enumerate(phases):
        where = np.flatnonzero(plan.phase == index)
        per_step = token_counts if target.unit == "tokens" else counts
        docs.append(_phase_shares(target, where, per_step, stream_names, window))
    return docs


def _phase_shares(
    target: PhaseTarget,
    where: Ints,
    per_step: NDArray[np.float64],
    stream_names: Sequence[str],
    window: int,
) -> dict[str, Any]:
    first = int(where[0]) if where.size else 0
    n = int(where.size)
    k = per_step.shape[1]
    goal = np.zeros(k)
    for s, w in target.targets.items():
        goal[s] = w
    goal /= goal.sum() or 1.0
    part = per_step[first : first + n]
    cum = np.zeros((n + 1, k))
    np.cumsum(part, axis=0, out=cum[1:])
    w = min(window, n)
    sums = cum[w:] - cum[: n - w + 1] if n else np.zeros((0, k))
    totals = sums.sum(axis=1, keepdims=True)
    realized = np.divide(sums, totals, out=np.zeros_like(sums), where=totals > 0)
    worst = np.abs(realized - goal).max(axis=1) if n else np.zeros(0)
    pick = _downsample(worst.size, MAX_WINDOW_POINTS)
    shown = [s for s in range(k) if goal[s] > 0 or part[:, s].any()]
    return {
        "name": target.name,
        "steps": n,
        "unit": target.unit,
        "max_abs_deviation": float(worst.max(initial=0.0)),
        "p99_abs_deviation": float(np.quantile(worst, 0.99)) if worst.size else 0.0,
        "windows": {
            "start_step": (first + pick).tolist(),
            "streams": {
                _name(stream_names, s): {
                    "target": float(goal[s]),
                    "realized": [round(float(v), 6) for v in realized[pick, s]],
                }
                for s in shown
            },
        },
    }


def _epochs(
    rows: Ints,
    drawn: DrawnRows,
    stream_names: Sequence[str],
    bucket_names: Sequence[str],
) -> list[dict[str, Any]]:
    """Per (stream, bucket) present in the manifest: rows, plan draws, draws / rows
    (``rows``: the plan's, as places in ``drawn.rows``)."""
    nb = max([len(bucket_names), *(b + 1 for _, b in drawn.available), 1])
    size = max([s * nb + b + 1 for s, b in drawn.available], default=0)
    available = np.zeros(size, dtype=np.int64)
    for (s, b), count in drawn.available.items():
        available[s * nb + b] = count
    pair = drawn.stream * nb + drawn.bucket
    draws = np.bincount(pair[rows], minlength=size)
    out = []
    for p in np.flatnonzero(available):
        out.append(
            {
                "stream": _name(stream_names, int(p) // nb),
                "bucket": _name(bucket_names, int(p) % nb),
                "samples": int(available[p]),
                "draws": int(draws[p]),
                "epochs": round(float(draws[p] / available[p]), 6),
            }
        )
    return out


# -- autocorrelation ------------------------------------------------------------------
def _lags(global_batch: int, n: int) -> Ints:
    """Lags ``1 … 4 x global_batch`` (below the stream length), at most
    :data:`MAX_LAGS` of them, spread evenly, always including the batch lag + 1."""
    top = min(4 * global_batch, n - 1)
    if top < 1:
        return np.zeros(0, np.int64)
    if top <= MAX_LAGS:
        return np.arange(1, top + 1, dtype=np.int64)
    spread = np.linspace(1, top, MAX_LAGS - 1).round().astype(np.int64)
    extra = [global_batch + 1] if global_batch + 1 <= top else []
    return np.unique(np.concatenate([spread, np.asarray(extra, np.int64)]))


def autocorrelation(codes: Ints, lags: Ints) -> NDArray[np.float64]:
    """The pooled one-hot autocorrelation of the categorical sequence ``codes`` at
    each lag: ``(m(h) - sum p**2) / (1 - sum p**2)`` (module docstring)."""
    dense = np.unique(codes, return_inverse=True)[1].astype(np.int64)
    return _key_acf(dense, np.arange(dense.size, dtype=np.int64), lags)


def _key_acf(codes: Ints, rows: Ints, lags: Ints) -> NDArray[np.float64]:
    """:func:`autocorrelation` of ``codes[rows]`` (``codes`` dense, >= 0), gathering
    only the compared blocks."""
    if lags.size == 0 or rows.size == 0:
        return np.zeros(lags.size)
    base = _sum_p_squared(np.bincount(codes[rows]))
    if base >= 1.0 - 1e-12:
        return np.zeros(lags.size)
    # int32 codes halve the bytes each comparison streams through.
    small = int(codes.max(initial=0)) < 2**31
    top = int(lags.max())
    matches = np.zeros(lags.size, dtype=np.int64)
    compared = 0
    for start, length in _blocks(rows.size - top):
        seg = codes[rows[start : start + length + top]]
        seg = seg.astype(np.int32) if small else seg
        head = seg[:length]
        for i, h in enumerate(lags):
            matches[i] += np.count_nonzero(head == seg[h : h + length])
        compared += length
    rate = matches / compared
    out: NDArray[np.float64] = (rate - base) / (1.0 - base)
    return out


def _sum_p_squared(freq: Ints) -> float:
    """``sum_c p_c**2`` with ``p_c = freq_c / sum(freq)``, as one correctly rounded
    division of exact integers: the same float whatever the order of the codes and
    whether keys never drawn are among them (a float dot product of the ``p_c``
    rounds by position, so the report would depend on how the keys were numbered)."""
    total = int(freq.sum())
    if int(freq.max(initial=0)) * total < 2**63:
        squares = int(np.dot(freq, freq))  # int64, exact below the bound
    else:
        squares = sum(f * f for f in freq.tolist())
    return squares / (total * total)


def _blocks(span: int) -> list[tuple[int, int]]:
    """Contiguous (start, length) blocks of ``[0, span)`` holding at most
    :data:`ACF_POSITIONS` positions, evenly spaced."""
    if span <= ACF_POSITIONS:
        return [(0, span)] if span > 0 else []
    count = ACF_POSITIONS // _ACF_BLOCK
    starts = np.linspace(0, span - _ACF_BLOCK, count).astype(np.int64)
    return [(int(s), _ACF_BLOCK) for s in starts]


# -- helpers --------------------------------------------------------------------------
def _dense(codes: Ints) -> Ints:
    """``codes`` as dense codes ``0 … k-1`` (already so for :func:`codes`' output)."""
    if codes.size == 0 or (codes.min() >= 0 and codes.max() < 2 * codes.size + 1024):
        return np.asarray(codes, dtype=np.int64)
    return np.unique(codes, return_inverse=True)[1].astype(np.int64)


def _downsample(n: int, most: int) -> Ints:
    """At most ``most`` evenly spaced indices of ``range(n)``, first and last kept."""
    if n <= most:
        return np.arange(n, dtype=np.int64)
    return np.unique(np.linspace(0, n - 1, most).round().astype(np.int64))


def _name(names: Sequence[str], i: int) -> str:
    return names[i] if i < len(names) else str(i)
