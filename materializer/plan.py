"""The global step plan: which manifest rows every global step trains on.

A plan is a pure function of (phases, seed): no clocks, no hidden state, no platform
dependent sort ties. Per phase (docs/plan.md derives every bound quoted here):

1. **Buckets.** Step ``t``'s bucket comes from an earliest-deadline-first schedule over
   the shares ``sigma_b``: after every prefix of ``t`` steps bucket ``b`` has
   ``|steps_b - t * sigma_b| <= 1``. ``sigma_b`` is proportional to the bucket's
   weighted sample count divided by its global batch, so every pool drains at one rate.
2. **Streams.** Inside bucket ``b`` stream ``k`` has the conditional weight
   ``u_kb``. Cumulative quotas are largest remainder with carried deficits along a
   Huffman tree of two-way splits (house-monotone, so never a negative count, and a
   closed form of the cumulative count, so vectorised across steps).
3. **Rows.** Each (stream, bucket) pool walks seeded permutations of its rows, a fresh
   one per epoch, only when the previous is exhausted; where an epoch starts inside a
   step, the old epoch's rows already in the step are deferred in the new one
   (:mod:`materializer.plan_draw`), so no step holds a row twice unless a pool is
   smaller than its per-step quota, which a phase must allow explicitly. Rows are
   then shuffled within the step so that every rank's contiguous slice carries the
   mixture.

Randomness is counter based (splitmix64 of (seed, purpose, coordinates)), so the
output does not depend on how steps are chunked, and every sort key is unique.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import ArrayLike, NDArray

from catalog.errors import InvalidInput, InvalidRecipe
from loader.format import PLAN_SCHEMA
from materializer.plan_draw import defer_tails, step_boundaries

__all__ = [
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_BATCH_STEPS",
    "PhaseLayout",
    "PhaseSpec",
    "PhaseSummary",
    "PlanSummary",
    "Pool",
    "StepChunk",
    "bucket_schedule",
    "cumulative_quotas",
    "generate_steps",
    "plan_layout",
    "scatter_keys",
    "scatter_order",
    "scatter_permutation",
    "write_plan",
]

DEFAULT_BATCH_ROWS = 1 << 20  # plan rows per record batch (bounds memory; part of the bytes)
DEFAULT_BATCH_STEPS = 1 << 16  # steps per record batch at most
MAX_GLOBAL_BATCH = 1 << 24  # slot numbers share a 64-bit counter with step numbers
_PERM_BLOCK = 1 << 20  # elements per vectorised block of tiny-pool epoch permutations
_M64 = (1 << 64) - 1
_TAG_SCATTER, _TAG_EPOCH, _TAG_STEP = 0x5C, 0xE9, 0x57

Int64s = NDArray[np.int64]
Int32s = NDArray[np.int32]
Floats = NDArray[np.float64]


# --------------------------------------------------------------------------- hashing


def _mix_int(x: int) -> int:
    """splitmix64 on a Python int (seeds and per-purpose bases)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _base(*parts: int) -> int:
    h = 0
    for part in parts:
        h = _mix_int(h ^ (part & _M64))
    return h


def _mix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """splitmix64's finaliser, in place. A bijection on 64 bits: distinct counters give
    distinct keys, so every argsort below has no ties and one platform-free answer."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= _M64:
        raise InvalidRecipe(f"seed must be an integer in [0, 2**64), got {seed!r}", path="seed")
    return int(seed)


# ---------------------------------------------------------------- write-time scatter


def scatter_order(n: int, seed: int) -> Int64s:
    """The write-time scatter permutation of ``n`` rows.

    Manifest row ``i`` is input row ``scatter_order(n, seed)[i]``. Use it when the input
    order is already canonical (e.g. sorted by clip id); otherwise order by content
    with :func:`scatter_permutation`.
    """
    if n < 0:
        raise InvalidInput(f"n must be >= 0, got {n}", field="n")
    keys = np.arange(n, dtype=np.uint64)
    keys += np.uint64(_base(_check_seed(seed), _TAG_SCATTER))
    return np.argsort(_mix(keys)).astype(np.int64)


def scatter_keys(ids: pa.Array | pa.ChunkedArray | Sequence[str], seed: int) -> NDArray[np.uint64]:
    """A seeded 64-bit key per id (a clip id), independent of the input order.

    Sorting rows by ``(key, id)`` scatters them: neighbours in the source (one asset,
    one crawl) land far apart in the manifest. Vectorised over 8-byte words of the
    UTF-8 ids, 1M ids at a time.
    """
    arr = ids if isinstance(ids, pa.Array | pa.ChunkedArray) else pa.array(ids, pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise InvalidInput("ids must not be null", field="ids")
    binary = arr.cast(pa.large_binary())
    base = np.uint64(_base(_check_seed(seed), _TAG_SCATTER, 1))
    out = np.empty(len(binary), dtype=np.uint64)
    step = 1 << 20
    for lo in range(0, len(binary), step):
        part = binary.slice(lo, step)
        offsets = np.frombuffer(part.buffers()[1], dtype=np.int64)[part.offset :][: len(part) + 1]
        data = np.frombuffer(part.buffers()[2] or b"", dtype=np.uint8)
        lengths = np.diff(offsets)
        width = max(8, int(-(-int(lengths.max(initial=0)) // 8) * 8))
        padded = np.zeros((len(part), width), dtype=np.uint8)
        owner = np.repeat(np.arange(len(part)), lengths)
        col = np.arange(int(lengths.sum())) - np.repeat(offsets[:-1] - offsets[0], lengths)
        padded[owner, col] = data[offsets[0] : offsets[-1]]
        words = padded.view("<u8")
        h = lengths.astype(np.uint64) + base
        _mix(h)
        for w in range(words.shape[1]):
            h ^= words[:, w]
            h += base
            _mix(h)
        out[lo : lo + len(part)] = h
    return out


def scatter_permutation(ids: pa.Array | pa.ChunkedArray | Sequence[str], seed: int) -> Int64s:
    """Input positions in manifest order: manifest row ``i`` is input row ``perm[i]``.

    Orders by ``(scatter_keys(ids, seed), id)``, so the result depends on the set of
    ids and the seed, never on the order a query returned them in.
    """
    arr = ids if isinstance(ids, pa.Array | pa.ChunkedArray) else pa.array(ids, pa.string())
    keys = scatter_keys(arr, seed)
    table = pa.table({"k": pa.array(keys, pa.uint64()), "id": arr})
    order = pc.sort_indices(table, sort_keys=[("k", "ascending"), ("id", "ascending")])
    return np.asarray(order.to_numpy(zero_copy_only=False), dtype=np.int64)


# ---------------------------------------------------------------------------- inputs


def _readonly(a: NDArray[Any]) -> NDArray[Any]:
    a.flags.writeable = False
    return a


def _int_array(value: ArrayLike, dtype: type[np.integer[Any]], field: str) -> NDArray[Any]:
    raw = np.asarray(value)
    if raw.ndim != 1 or (raw.size and raw.dtype.kind not in "iu"):
        raise InvalidInput(f"pool.{field} must be a 1-D integer array", field=field)
    info = np.iinfo(dtype)
    if raw.size and (raw.min() < max(0, info.min) or raw.max() > info.max):
        raise InvalidInput(f"pool.{field} must lie in [0, {info.max}]", field=field)
    return _readonly(np.ascontiguousarray(raw, dtype=dtype))


class Pool:
    """The candidate rows of one phase, as parallel arrays (one entry per row).

    Args:
        row: Manifest row numbers (stored int64; unique within the pool).
        stream: Stream id per row (stored int32).
        bucket: Bucket id per row (stored int32).
        tokens: Latent tokens per row (stored int64, >= 0).

    Raises:
        InvalidInput: An array is not 1-D integer, is negative, or lengths differ.
    """

    __slots__ = ("bucket", "row", "stream", "tokens")
    row: Int64s
    stream: Int32s
    bucket: Int32s
    tokens: Int64s

    def __init__(
        self, row: ArrayLike, stream: ArrayLike, bucket: ArrayLike, tokens: ArrayLike
    ) -> None:
        arrays = {
            "row": _int_array(row, np.int64, "row"),
            "stream": _int_array(stream, np.int32, "stream"),
            "bucket": _int_array(bucket, np.int32, "bucket"),
            "tokens": _int_array(tokens, np.int64, "tokens"),
        }
        if len({a.size for a in arrays.values()}) != 1:
            sizes = {f: a.size for f, a in arrays.items()}
            raise InvalidInput(f"pool arrays differ in length: {sizes}", field="pool")
        for name, value in arrays.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Pool is immutable")

    def __len__(self) -> int:
        return int(self.row.size)


@dataclass(frozen=True, eq=False)
class PhaseSpec:
    """One phase of the plan: a pool of candidate rows and how to schedule it.

    Exactly one of ``num_steps`` and ``token_budget`` ends the phase. Weights are
    normalised to sum to one; a stream with rows in the pool but no (or zero) weight is
    not sampled. In a token-budget phase the weights are shares of tokens, else of
    samples. A pool smaller than the most rows a step draws from it is an error unless
    ``allow_repeats_in_step``: only then may a step hold a row twice.

    Raises:
        InvalidRecipe: A field is out of range; ``path`` names it
            (``phases[1].global_batch[3]``).
    """

    index: int
    pool: Pool
    global_batch: Mapping[int, int]
    stream_weights: Mapping[int, float]
    num_steps: int | None = None
    token_budget: int | None = None
    rank_multiple: int = 1
    allow_repeats_in_step: bool = False

    def __post_init__(self) -> None:
        at = f"phases[{self.index}]"
        if not _is_int(self.index) or not 0 <= self.index < 2**31:
            raise InvalidRecipe(f"phase index must be in [0, 2**31), got {self.index!r}", path=at)
        if (self.num_steps is None) == (self.token_budget is None):
            raise InvalidRecipe(f"{at}: set exactly one of num_steps and token_budget", path=at)
        for name in ("num_steps", "token_budget"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise InvalidRecipe(f"{at}.{name} must be a positive integer", path=f"{at}.{name}")
        if not isinstance(self.allow_repeats_in_step, bool):
            where = f"{at}.allow_repeats_in_step"
            raise InvalidRecipe(f"{where} must be true or false", path=where)
        if not _is_int(self.rank_multiple) or self.rank_multiple < 1:
            raise InvalidRecipe(
                f"{at}.rank_multiple must be a positive integer", path=f"{at}.rank_multiple"
            )
        if not self.global_batch:
            raise InvalidRecipe(f"{at}.global_batch is empty", path=f"{at}.global_batch")
        for b, batch in self.global_batch.items():
            where = f"{at}.global_batch[{b}]"
            if not _is_int(b) or not 0 <= b < 2**31:
                raise InvalidRecipe(f"{where}: bucket ids are integers >= 0", path=where)
            if not _is_int(batch) or not 1 <= batch <= MAX_GLOBAL_BATCH:
                raise InvalidRecipe(f"{where} must be in [1, {MAX_GLOBAL_BATCH}]", path=where)
            if batch % self.rank_multiple:
                raise InvalidRecipe(
                    f"{where}: global batch {batch} is not a multiple of rank_multiple "
                    f"{self.rank_multiple}",
                    path=where,
                    bucket=int(b),
                )
        weights = {}
        for k, w in self.stream_weights.items():
            where = f"{at}.stream_weights[{k}]"
            if not _is_int(k) or not 0 <= k < 2**31:
                raise InvalidRecipe(f"{where}: stream ids are integers >= 0", path=where)
            if not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
                raise InvalidRecipe(f"{where} must be a finite number >= 0", path=where)
            if w > 0:
                weights[int(k)] = float(w)
        if not weights:
            raise InvalidRecipe(
                f"{at}: no stream has a positive weight", path=f"{at}.stream_weights"
            )
        total = math.fsum(weights.values())
        normalised = {k: w / total for k, w in sorted(weights.items())}
        batches = {int(b): int(v) for b, v in sorted(self.global_batch.items())}
        object.__setattr__(self, "stream_weights", MappingProxyType(normalised))
        object.__setattr__(self, "global_batch", MappingProxyType(batches))

    @property
    def unit(self) -> Literal["samples", "tokens"]:
        """What the stream weights are shares of."""
        return "tokens" if self.token_budget is not None else "samples"


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


# ------------------------------------------------------------------ bucket schedule


class _BucketScheduler:
    """Earliest deadline first over the windows of the +-1 band.

    Copy ``j`` (1-based) of bucket ``b`` may be placed at prefix length ``L`` only if
    ``j - 1 <= L * sigma_b`` (release) and must be by ``L <= j / sigma_b + 1``
    (deadline). A schedule inside every window exists (Tijdeman 1980) and EDF is
    optimal for unit jobs with release times, so it never misses one.
    """

    def __init__(self, shares: Sequence[float]) -> None:
        self._sigma = [float(s) for s in shares]
        self._count = [0] * len(self._sigma)
        self._placed = 0
        self._pending = [(0.0, b) for b, s in enumerate(self._sigma) if s > 0]
        heapq.heapify(self._pending)
        self._ready: list[tuple[float, int]] = []

    def take(self, m: int) -> Int32s:
        sigma, count, pending, ready = self._sigma, self._count, self._pending, self._ready
        out: list[int] = []
        push, pop = heapq.heappush, heapq.heappop
        for length in range(self._placed + 1, self._placed + m + 1):
            while pending and pending[0][0] <= length:
                b = pop(pending)[1]
                push(ready, ((count[b] + 1) / sigma[b], b))
            b = pop(ready)[1]  # never empty: sum(count) < length = sum(length * sigma)
            out.append(b)
            count[b] += 1
            push(pending, (count[b] / sigma[b], b))
        self._placed += m
        return np.array(out, dtype=np.int32)


def bucket_schedule(shares: Mapping[int, float], num_steps: int) -> Int32s:
    """The bucket of each of the first ``num_steps`` steps.

    Deterministic and low-discrepancy: for every prefix length ``t`` and bucket ``b``,
    ``|#{s < t : bucket[s] = b} - t * share_b| <= 1`` (shares are normalised).
    """
    ids = sorted(b for b, s in shares.items() if s > 0)
    if not ids:
        raise InvalidInput("bucket_schedule needs a positive share", field="shares")
    total = math.fsum(shares[b] for b in ids)
    positions = _BucketScheduler([shares[b] / total for b in ids]).take(num_steps)
    return np.asarray(ids, dtype=np.int32)[positions]


# -------------------------------------------------------------------- stream quotas


class _Apportioner:
    """Cumulative largest-remainder quotas along a Huffman tree of two-way splits.

    At a split with ``M`` cumulative seats, the lighter child gets ``floor(p*M + 1/2)``
    (two-party largest remainder with the carried deficit), the heavier the rest. Each
    child's count never decreases as ``M`` grows (no Alabama paradox, unlike K-party
    largest remainder), so per-step counts are differences of a closed form.
    """

    def __init__(self, weights: Floats) -> None:
        n = len(weights)
        total = float(np.sum(weights))
        self.weights = weights / total
        node_w = list(self.weights)
        self._splits: list[tuple[int, int, int, float]] = []  # (node, light, heavy, p)
        heap = [(w, i, i) for i, w in enumerate(node_w)]  # (weight, tie: min leaf, node)
        heapq.heapify(heap)
        parent = [-1] * n
        while len(heap) > 1:
            w1, t1, a = heapq.heappop(heap)
            w2, t2, b = heapq.heappop(heap)
            node = len(node_w)
            node_w.append(w1 + w2)
            parent += [-1]
            parent[a] = parent[b] = node
            self._splits.append((node, a, b, w1 / (w1 + w2)))  # a is the lighter one
            heapq.heappush(heap, (w1 + w2, min(t1, t2), node))
        self._splits.reverse()  # root first
        self._n = n
        # e_child <= p * e_parent + 1/2 unrolls to 1/2 * sum over the path below the
        # root (leaf included) of w_leaf / W_node.
        bound = np.zeros(n)
        for leaf in range(n):
            node = leaf
            while parent[node] >= 0:
                bound[leaf] += 0.5 * node_w[leaf] / node_w[node]
                node = parent[node]
        self.bounds = bound

    def max_increments(self, batch: int) -> list[int]:
        """Per leaf, the most seats one step of ``batch`` seats can give it.

        A lighter child's increment over a parent increment ``d`` is
        ``floor(p * d)`` or ``ceil(p * d)`` (the heavier one gets the rest), so
        propagating the parent's largest increment down the tree bounds every step.
        """
        top = {len(self._splits) + self._n - 1: batch}
        for node, light, heavy, p in self._splits:
            d = top.pop(node)
            top[light], top[heavy] = math.ceil(p * d), d - math.floor(p * d)
        return [top[leaf] for leaf in range(self._n)]

    def cumulative(self, seats: Int64s) -> Int64s:
        """Cumulative quota of each leaf for each cumulative seat count (len x n)."""
        values: dict[int, Int64s] = {len(self._splits) + self._n - 1: seats}
        for node, light, heavy, p in self._splits:
            m = values.pop(node)
            # Rounding the lighter child (p <= 1/2) keeps both children monotone even
            # under float rounding: its increment never exceeds the parent's.
            lo = np.floor(m.astype(np.float64) * p + 0.5).astype(np.int64)
            values[light], values[heavy] = lo, m - lo
        out = np.empty((len(seats), self._n), dtype=np.int64)
        for leaf in range(self._n):
            out[:, leaf] = values[leaf]
        return out


def cumulative_quotas(weights: Sequence[float], seats: ArrayLike) -> Int64s:
    """Cumulative largest-remainder quotas of ``seats`` (non-decreasing) among weights.

    Row ``i`` splits ``seats[i]``; each column is non-decreasing and within
    :func:`plan_layout`'s per-stream bound (< 1 when the tree is shallow) of
    ``weight * seats``.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not w.size or (w <= 0).any() or not np.isfinite(w).all():
        raise InvalidInput("weights must be positive and finite", field="weights")
    s = np.asarray(seats, dtype=np.int64)
    if s.ndim != 1 or (s.size and (s.min() < 0 or (np.diff(s) < 0).any())):
        raise InvalidInput("seats must be non-decreasing and >= 0", field="seats")
    return _Apportioner(w).cumulative(s)


# ---------------------------------------------------------------------- phase model


@dataclass(frozen=True)
class PhaseLayout:
    """The expected shape of a phase, derived from its spec and pool.

    Attributes:
        unit: ``"samples"`` or ``"tokens"``: what the stream weights are shares of.
        stream_weights: Normalised weights of the sampled streams.
        bucket_shares: ``sigma_b``, the expected fraction of steps in bucket ``b``.
        stream_bucket_weights: ``u_kb``, stream ``k``'s share of samples in a
            bucket-``b`` step, by bucket then stream.
        share_bound: Per stream, the bound on ``|realized_k(t) - w_k * total(t)|`` over
            every prefix of the phase, in ``unit``.
        tokens_per_step: Expected tokens per step.
        step_quota: The most rows one step draws from pool (stream, bucket), by
            bucket then stream; a pool smaller than its quota repeats rows in a step.
    """

    unit: Literal["samples", "tokens"]
    stream_weights: Mapping[int, float]
    bucket_shares: Mapping[int, float]
    stream_bucket_weights: Mapping[int, Mapping[int, float]]
    share_bound: Mapping[int, float]
    tokens_per_step: float
    step_quota: Mapping[int, Mapping[int, int]]


@dataclass
class _BucketModel:
    bucket: int
    batch: int
    streams: list[int]
    apportioner: _Apportioner
    pools: list[tuple[Int64s, Int64s]]  # (rows sorted, their tokens) per stream


class _PhaseModel:
    def __init__(self, spec: PhaseSpec) -> None:
        self.spec = spec
        at = f"phases[{spec.index}]"
        pool = spec.pool
        ordered = np.sort(pool.row)  # (np.unique's hash path is far slower here)
        if (ordered[1:] == ordered[:-1]).any():
            raise InvalidInput(f"{at}: pool rows are not unique", field="row", path=at)
        weights = spec.stream_weights
        keep = np.isin(pool.stream, np.fromiter(weights, dtype=np.int32))
        order = np.lexsort((pool.row[keep], pool.bucket[keep], pool.stream[keep]))
        rows, tokens = pool.row[keep][order], pool.tokens[keep][order]
        stream, bucket = pool.stream[keep][order], pool.bucket[keep][order]
        cut = np.flatnonzero((np.diff(stream) != 0) | (np.diff(bucket) != 0)) + 1
        starts, stops = np.r_[0, cut], np.r_[cut, rows.size]
        pools: dict[tuple[int, int], tuple[Int64s, Int64s]] = {}
        for lo, hi in zip(starts.tolist(), stops.tolist(), strict=True):
            if hi > lo:
                key = (int(stream[lo]), int(bucket[lo]))
                pools[key] = (_readonly(rows[lo:hi]), _readonly(tokens[lo:hi]))
        present = {k for k, _ in pools}
        for k in weights:
            if k not in present:
                raise InvalidRecipe(
                    f"{at}: stream {k} has weight {weights[k]:.6g} but no candidate rows",
                    path=f"{at}.stream_weights[{k}]",
                    stream=k,
                )
        for _, b in pools:
            if b not in spec.global_batch:
                raise InvalidRecipe(
                    f"{at}: bucket {b} has candidate rows but no global batch",
                    path=f"{at}.global_batch",
                    bucket=b,
                )
        unit = spec.unit
        # mass_k: what stream k's weight is a share of (its rows, or its tokens).
        mass = {k: 0.0 for k in weights}
        for (k, _), (r, t) in pools.items():
            mass[k] += float(r.size) if unit == "samples" else float(t.sum())
        for k, m in mass.items():
            if m <= 0:
                raise InvalidInput(f"{at}: stream {k} has no tokens", field="tokens", stream=k)
        # q_kb = w_k n_kb / m_k spreads stream k's weight over buckets by its rows there,
        # so every pool of k drains at the same rate and k's rows are drawn uniformly.
        q: dict[int, dict[int, float]] = {}
        for (k, b), (r, _) in pools.items():
            q.setdefault(b, {})[k] = weights[k] * r.size / mass[k]
        bucket_ids = sorted(q)
        rate = {b: math.fsum(q[b].values()) / spec.global_batch[b] for b in bucket_ids}
        z = math.fsum(rate.values())
        self.unit = unit
        self.weights = dict(weights)
        self.bucket_ids = bucket_ids
        self.sigma = [rate[b] / z for b in bucket_ids]
        self.pools = pools
        self.buckets: list[_BucketModel] = []
        u: dict[int, dict[int, float]] = {}
        for b in bucket_ids:
            streams = sorted(q[b])
            apportioner = _Apportioner(np.array([q[b][k] for k in streams]))
            u[b] = dict(zip(streams, apportioner.weights.tolist(), strict=True))
            self.buckets.append(
                _BucketModel(
                    b, spec.global_batch[b], streams, apportioner, [pools[(k, b)] for k in streams]
                )
            )
        self.max_batch = max(bm.batch for bm in self.buckets)
        self.quota = {
            (k, bm.bucket): top
            for bm in self.buckets
            for k, top in zip(bm.streams, bm.apportioner.max_increments(bm.batch), strict=True)
        }
        if not spec.allow_repeats_in_step:
            _check_quotas(spec.index, self.quota, {key: r.size for key, (r, _) in pools.items()})
        self.layout = PhaseLayout(
            unit=unit,
            stream_weights=MappingProxyType(dict(weights)),
            bucket_shares=MappingProxyType(dict(zip(bucket_ids, self.sigma, strict=True))),
            stream_bucket_weights=MappingProxyType({b: MappingProxyType(u[b]) for b in u}),
            share_bound=MappingProxyType(self._bounds(u)),
            tokens_per_step=self._tokens_per_step(u),
            step_quota=MappingProxyType(
                {
                    bm.bucket: MappingProxyType({k: self.quota[(k, bm.bucket)] for k in bm.streams})
                    for bm in self.buckets
                }
            ),
        )

    def _mean_tokens(self, k: int, b: int) -> float:
        if self.unit == "samples":
            return 1.0
        t = self.pools[(k, b)][1]
        return float(t.sum()) / t.size

    def _tokens_per_step(self, u: dict[int, dict[int, float]]) -> float:
        total = 0.0
        for bm, s in zip(self.buckets, self.sigma, strict=True):
            for k in bm.streams:
                t = self.pools[(k, bm.bucket)][1]
                total += s * bm.batch * u[bm.bucket][k] * float(t.sum()) / t.size
        return total

    def _bounds(self, u: dict[int, dict[int, float]]) -> dict[int, float]:
        """Per stream: sup over prefixes of |realized - w * total| (docs/plan.md, (B))."""
        tau = {key: self._mean_tokens(*key) for key in self.pools}
        spread = {}  # V_kb: max drift of a pool's partial-epoch token sum from its mean
        for key, (_, t) in self.pools.items():
            dev = np.abs(t - t.mean()) if self.unit == "tokens" else np.zeros(1)
            spread[key] = 0.5 * float(dev.sum())
        out = {}
        for k, w in self.weights.items():
            a, term2, term3 = [], 0.0, 0.0
            for bm in self.buckets:
                b, ub = bm.bucket, u[bm.bucket]
                tau_b = math.fsum(ub[j] * tau[(j, b)] for j in bm.streams)
                a.append((ub.get(k, 0.0) * tau.get((k, b), 0.0) - w * tau_b) * bm.batch)
                c = [((j == k) - w) * tau[(j, b)] for j in bm.streams]
                term2 += _l1_center(c, bm.apportioner.bounds.tolist())
                term3 += math.fsum(abs((j == k) - w) * spread[(j, b)] for j in bm.streams)
            out[k] = _l1_center(a, [1.0] * len(a)) + term2 + term3
        return out


def _check_quotas(
    phase: int, quota: Mapping[tuple[int, int], int], size: Mapping[tuple[int, int], int]
) -> None:
    """A pool smaller than its per-step quota would put a row twice into one step."""
    short = [(k, b, size[(k, b)], q) for (k, b), q in sorted(quota.items()) if size[(k, b)] < q]
    if not short:
        return
    k, b, n, q = short[0]
    more = f" (and {len(short) - 1} more pools)" if len(short) > 1 else ""
    raise InvalidRecipe(
        f"phases[{phase}]: the pool of stream {k} in bucket {b} has {n} rows but a step "
        f"draws up to {q} from it{more}, so a step would hold a sample twice; add rows, "
        "lower the stream's weight or the bucket's global batch, or set "
        "allow_repeats_in_step",
        path=f"phases[{phase}].allow_repeats_in_step",
        phase=phase,
        stream=k,
        bucket=b,
        pool_size=n,
        quota=q,
        pools=[{"stream": k, "bucket": b, "pool_size": n, "quota": q} for k, b, n, q in short],
    )


def _l1_center(values: list[float], weights: list[float]) -> float:
    """``min over lambda of sum_i weights_i * |values_i - lambda|``: the dual of
    ``max sum_i values_i * e_i`` subject to ``|e_i| <= weights_i`` and ``sum e_i = 0``."""
    if not values:
        return 0.0
    return min(
        math.fsum(w * abs(v - c) for v, w in zip(values, weights, strict=True)) for c in values
    )


def plan_layout(phase: PhaseSpec) -> PhaseLayout:
    """Bucket shares, conditional stream weights and share bounds of ``phase``.

    Raises:
        InvalidRecipe: A weighted stream has no rows, a bucket with rows has no
            global batch, or (unless ``allow_repeats_in_step``) a pool is smaller than
            its ``step_quota``.
        InvalidInput: The pool repeats a row.
    """
    return _PhaseModel(phase).layout


# ---------------------------------------------------------------------- generation


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
        """The chunk as a :data:`~loader.format.PLAN_SCHEMA` record batch (no copies of
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


class _PoolWalk:
    """One (stream, bucket) pool's walk: epoch ``e`` is the permutation sorting
    ``mix(base + e*n + i)``, reordered where it starts inside a step so that the step
    holds no row twice (:mod:`materializer.plan_draw`); a new epoch starts only when
    the last is exhausted."""

    def __init__(self, rows: Int64s, tokens: Int64s, base: int) -> None:
        self.n = int(rows.size)
        self.rows, self.tokens = rows, tokens
        self.base = np.uint64(base)
        self.drawn = 0
        self._cached = -1
        self._perm = np.arange(self.n, dtype=np.int64)  # epoch _cached as drawn

    def _epochs(self, first: int, count: int) -> Int64s:
        n = self.n
        keys = np.arange(first, first + count, dtype=np.uint64)[:, None] * np.uint64(n)
        keys = keys + np.arange(n, dtype=np.uint64)[None, :]
        keys += self.base
        return np.argsort(_mix(keys), axis=1)

    def draw(self, counts: Int64s) -> tuple[Int64s, Int64s]:
        """The rows (and their tokens) of consecutive steps drawing ``counts[i]`` each."""
        n, start = self.n, self.drawn
        stop = start + int(counts.sum())
        parts: list[Int64s] = []
        epoch, last = start // n, (stop - 1) // n
        bounds = step_boundaries(start, counts, n) if last > epoch else None
        while epoch <= last:
            if epoch == self._cached:
                span, perms = 1, self._perm[None, :]
            else:
                span = min(last - epoch + 1, max(1, _PERM_BLOCK // n))
                perms = self._epochs(epoch, span)
                if bounds is not None:  # they lie in epochs start // n + 1 .. last
                    whole = epoch <= start // n + 1 and span > last - epoch
                    block = bounds if whole else bounds.select(epoch, epoch + span)
                    defer_tails(perms, self._perm, epoch, block)
                self._cached, self._perm = epoch + span - 1, perms[-1]
            lo = max(start - epoch * n, 0)
            hi = min(stop - epoch * n, span * n)
            parts.append(perms.reshape(-1)[lo:hi])
            epoch += span
        self.drawn = stop
        idx = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return self.rows[idx], self.tokens[idx]


class _PhaseRun:
    def __init__(self, model: _PhaseModel, seed: int, first_step: int, num_streams: int) -> None:
        self.model = model
        self.phase = model.spec.index
        self.num_streams = num_streams
        self.schedule = _BucketScheduler(model.sigma)
        self.next_step = first_step
        self.bucket_steps = [0] * len(model.buckets)
        self.walks = [
            [
                _PoolWalk(r, t, _base(seed, _TAG_EPOCH, self.phase, k, bm.bucket))
                for k, (r, t) in zip(bm.streams, bm.pools, strict=True)
            ]
            for bm in model.buckets
        ]
        self.step_base = np.uint64(_base(seed, _TAG_STEP, self.phase))
        self.batches = np.array([bm.batch for bm in model.buckets], dtype=np.int64)
        self.allow_repeats = model.spec.allow_repeats_in_step

    def chunk(self, m: int) -> StepChunk:
        model, k_all = self.model, self.num_streams
        positions = self.schedule.take(m)
        offsets = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(self.batches[positions], out=offsets[1:])
        rows = np.empty(int(offsets[-1]), dtype=np.int64)
        samples = np.zeros((k_all, m), dtype=np.int64)
        tokens = np.zeros((k_all, m), dtype=np.int64)
        epochs = np.full((k_all, m), np.iinfo(np.int32).max, dtype=np.int64)
        steps = np.arange(self.next_step, self.next_step + m, dtype=np.uint64)
        for bi, bm in enumerate(model.buckets):
            idx = np.flatnonzero(positions == bi)
            walks = self.walks[bi]
            if not idx.size:
                for k, walk in zip(bm.streams, walks, strict=True):
                    np.minimum(epochs[k], walk.drawn // walk.n, out=epochs[k])
                continue
            batch, mb = bm.batch, idx.size
            j0 = self.bucket_steps[bi]
            seats = np.arange(j0, j0 + mb + 1, dtype=np.int64) * batch
            counts = np.diff(bm.apportioner.cumulative(seats), axis=0)  # (mb, streams)
            col = np.cumsum(counts, axis=1) - counts
            block = np.empty(mb * batch, dtype=np.int64)
            for si, (k, walk) in enumerate(zip(bm.streams, walks, strict=True)):
                c = counts[:, si]
                if not self.allow_repeats and int(c.max()) > walk.n:  # max_increments bounds it
                    _check_quotas(
                        self.phase, {(k, bm.bucket): int(c.max())}, {(k, bm.bucket): walk.n}
                    )
                before = np.cumsum(c) - c
                drawn = np.zeros(m, dtype=np.int64)
                drawn[idx] = c
                pool_epoch = (walk.drawn + np.cumsum(drawn) - drawn) // walk.n
                np.minimum(epochs[k], pool_epoch, out=epochs[k])
                total = int(c.sum())
                if not total:
                    continue
                r, t = walk.draw(c)
                base = np.arange(mb, dtype=np.int64) * batch + col[:, si] - before
                block[np.repeat(base, c) + np.arange(total)] = r
                csum = np.zeros(total + 1, dtype=np.int64)
                np.cumsum(t, out=csum[1:])
                samples[k, idx] = c
                tokens[k, idx] = csum[before + c] - csum[before]
            # Within-step shuffle: sort slots by mix(step, slot) -- unique keys per step.
            keys = (steps[idx] << np.uint64(24))[:, None] | np.arange(batch, dtype=np.uint64)
            keys += self.step_base
            order = np.argsort(_mix(keys), axis=1)
            shuffled = np.take_along_axis(block.reshape(mb, batch), order, axis=1)
            dest = offsets[idx][:, None] + np.arange(batch, dtype=np.int64)
            rows[dest.reshape(-1)] = shuffled.reshape(-1)
            self.bucket_steps[bi] += mb
        epochs[epochs == np.iinfo(np.int32).max] = 0  # streams not sampled in this phase
        chunk = StepChunk(
            phase=self.phase,
            first_step=self.next_step,
            bucket=np.asarray(model.bucket_ids, dtype=np.int32)[positions],
            offsets=offsets,
            rows=rows,
            stream_epochs=np.ascontiguousarray(epochs.T, dtype=np.int32),
            stream_samples=np.ascontiguousarray(samples.T),
            stream_tokens=np.ascontiguousarray(tokens.T),
        )
        self.next_step += m
        return chunk


def _models(phases: Sequence[PhaseSpec], num_streams: int | None) -> tuple[list[_PhaseModel], int]:
    if not phases:
        raise InvalidRecipe("a plan needs at least one phase", path="phases")
    for i, spec in enumerate(phases):
        if spec.index != i:
            raise InvalidRecipe(
                f"phases[{i}] has index {spec.index}; phases are numbered 0, 1, ... in order",
                path=f"phases[{i}]",
            )
    models = [_PhaseModel(spec) for spec in phases]
    needed = 1 + max(int(s.pool.stream.max(initial=0)) for s in phases)
    needed = max(needed, 1 + max(max(s.stream_weights) for s in phases))
    if num_streams is None:
        num_streams = needed
    elif num_streams < needed:
        raise InvalidInput(
            f"num_streams={num_streams} but stream id {needed - 1} occurs", field="num_streams"
        )
    return models, num_streams


def _check_batching(batch_rows: int, batch_steps: int) -> None:
    if not (1 <= batch_rows <= 1 << 30 and 1 <= batch_steps <= 1 << 30):
        # List offsets are int32: a record batch holds fewer than 2**31 rows.
        raise InvalidInput("batch_rows and batch_steps must be in [1, 2**30]", field="batch_rows")


def _iter_chunks(
    models: list[_PhaseModel], seed: int, num_streams: int, batch_rows: int, batch_steps: int
) -> Iterator[StepChunk]:
    first = 0
    for model in models:
        run = _PhaseRun(model, seed, first, num_streams)
        spec = model.spec
        per_chunk = min(batch_steps, max(1, batch_rows // model.max_batch))
        done = tokens = 0
        while True:
            m = per_chunk if spec.num_steps is None else min(per_chunk, spec.num_steps - done)
            chunk = run.chunk(m)
            if spec.token_budget is not None:
                # The phase ends with the first step whose cumulative tokens reach the budget.
                reached = np.cumsum(chunk.stream_tokens.sum(axis=1)) + tokens >= spec.token_budget
                if reached.any():
                    chunk = chunk.head(int(np.argmax(reached)) + 1)
                tokens += int(chunk.stream_tokens.sum())
            done += chunk.num_steps
            yield chunk
            if done >= (spec.num_steps or 0) and tokens >= (spec.token_budget or 0):
                break
        first += done


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
    seed = _check_seed(seed)
    _check_batching(batch_rows, batch_steps)
    models, k = _models(phases, num_streams)
    return _iter_chunks(models, seed, k, batch_rows, batch_steps)


# -------------------------------------------------------------------------- writer


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


class _PhaseStats:
    """Running totals of one phase, including the worst prefix deviation per stream."""

    def __init__(self, model: _PhaseModel, first_step: int, num_streams: int) -> None:
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
    atomically (temp file, fsync, rename) and is byte-identical for the same phases,
    seed, ``num_streams``, ``batch_rows`` and ``batch_steps``.

    Raises:
        InvalidRecipe: A phase is invalid (nothing is written).
    """
    seed = _check_seed(seed)
    _check_batching(batch_rows, batch_steps)
    models, k = _models(phases, num_streams)
    chunks = _iter_chunks(models, seed, k, batch_rows, batch_steps)
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    tmp = Path(tmp_name)
    stats: list[_PhaseStats] = []
    try:
        with os.fdopen(fd, "wb") as raw:
            sink = _HashingSink(raw)
            with (
                pa.PythonFile(sink, mode="w") as stream,
                pa.ipc.new_file(
                    stream, PLAN_SCHEMA, options=pa.ipc.IpcWriteOptions(compression=None)
                ) as writer,
            ):
                for chunk in chunks:
                    if not stats or stats[-1].model.spec.index != chunk.phase:
                        stats.append(_PhaseStats(models[chunk.phase], chunk.first_step, k))
                    stats[-1].add(chunk)
                    writer.write_batch(chunk.to_record_batch())
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return _summarise(stats, sink.hash.hexdigest(), sink.size)


def _summarise(stats: list[_PhaseStats], sha256: str, size: int) -> PlanSummary:
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
