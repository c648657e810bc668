"""A phase's model: its pools, bucket shares, stream weights per bucket and bounds.

:class:`PhaseModel` is everything about a phase that does not depend on the seed:
the (stream, bucket) pools, ``sigma_b`` (proportional to a bucket's weighted samples
over its global batch, so every pool drains at one rate), the per-bucket
apportioners, each pool's per-step quota and the derived bound on every stream's
share error (docs/plan.md, (B)). :func:`plan_layout` is its public face.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import numpy as np

from catalog.errors import InvalidInput, InvalidRecipe
from materializer.plan.quotas import Apportioner
from materializer.plan.spec import Int64s, PhaseSpec, readonly

__all__ = ["BucketModel", "PhaseLayout", "PhaseModel", "check_quotas", "plan_layout"]


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
class BucketModel:
    """One bucket of a phase: its global batch, streams and their pools."""

    bucket: int
    batch: int
    streams: list[int]
    apportioner: Apportioner
    pools: list[tuple[Int64s, Int64s]]  # (rows sorted, their tokens) per stream


class PhaseModel:
    """The seed-free model of one phase (see the module docstring).

    Raises:
        InvalidRecipe: See :func:`plan_layout`.
        InvalidInput: The pool repeats a row, or a weighted stream has no tokens.
    """

    def __init__(self, spec: PhaseSpec) -> None:
        self.spec = spec
        at = f"phases[{spec.index}]"
        self.unit = spec.unit
        self.weights = dict(spec.stream_weights)
        self.pools = _split_pools(spec, at)
        _check_coverage(spec, self.pools, at)
        q = _bucket_weights(spec, self.pools, at)
        self.bucket_ids = sorted(q)
        rate = {b: math.fsum(q[b].values()) / spec.global_batch[b] for b in self.bucket_ids}
        z = math.fsum(rate.values())
        self.sigma = [rate[b] / z for b in self.bucket_ids]
        self.buckets: list[BucketModel] = []
        u: dict[int, dict[int, float]] = {}
        for b in self.bucket_ids:
            streams = sorted(q[b])
            apportioner = Apportioner(np.array([q[b][k] for k in streams]))
            u[b] = dict(zip(streams, apportioner.weights.tolist(), strict=True))
            pools = [self.pools[(k, b)] for k in streams]
            self.buckets.append(BucketModel(b, spec.global_batch[b], streams, apportioner, pools))
        self.max_batch = max(bm.batch for bm in self.buckets)
        self.quota = {
            (k, bm.bucket): top
            for bm in self.buckets
            for k, top in zip(bm.streams, bm.apportioner.max_increments(bm.batch), strict=True)
        }
        if not spec.allow_repeats_in_step:
            sizes = {key: r.size for key, (r, _) in self.pools.items()}
            check_quotas(spec.index, self.quota, sizes)
        self.layout = self._layout(u)

    def _layout(self, u: dict[int, dict[int, float]]) -> PhaseLayout:
        return PhaseLayout(
            unit=self.unit,
            stream_weights=MappingProxyType(dict(self.weights)),
            bucket_shares=MappingProxyType(dict(zip(self.bucket_ids, self.sigma, strict=True))),
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


def _split_pools(spec: PhaseSpec, at: str) -> dict[tuple[int, int], tuple[Int64s, Int64s]]:
    """The weighted streams' rows by (stream, bucket): rows sorted, with their tokens."""
    pool = spec.pool
    ordered = np.sort(pool.row)  # (np.unique's hash path is far slower here)
    if (ordered[1:] == ordered[:-1]).any():
        raise InvalidInput(f"{at}: pool rows are not unique", field="row", path=at)
    keep = np.isin(pool.stream, np.fromiter(spec.stream_weights, dtype=np.int32))
    order = np.lexsort((pool.row[keep], pool.bucket[keep], pool.stream[keep]))
    rows, tokens = pool.row[keep][order], pool.tokens[keep][order]
    stream, bucket = pool.stream[keep][order], pool.bucket[keep][order]
    cut = np.flatnonzero((np.diff(stream) != 0) | (np.diff(bucket) != 0)) + 1
    starts, stops = np.r_[0, cut], np.r_[cut, rows.size]
    pools: dict[tuple[int, int], tuple[Int64s, Int64s]] = {}
    for lo, hi in zip(starts.tolist(), stops.tolist(), strict=True):
        if hi > lo:
            key = (int(stream[lo]), int(bucket[lo]))
            pools[key] = (readonly(rows[lo:hi]), readonly(tokens[lo:hi]))
    return pools


def _check_coverage(
    spec: PhaseSpec, pools: Mapping[tuple[int, int], tuple[Int64s, Int64s]], at: str
) -> None:
    """Every weighted stream has rows, and every bucket with rows has a global batch."""
    weights = spec.stream_weights
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


def _bucket_weights(
    spec: PhaseSpec, pools: Mapping[tuple[int, int], tuple[Int64s, Int64s]], at: str
) -> dict[int, dict[int, float]]:
    """``q_kb = w_k n_kb / m_k``, by bucket then stream.

    ``m_k`` is what stream ``k``'s weight is a share of (its rows, or its tokens), so
    ``q`` spreads the weight over buckets by the stream's rows there: every pool of
    ``k`` drains at the same rate and ``k``'s rows are drawn uniformly.
    """
    weights = spec.stream_weights
    mass = {k: 0.0 for k in weights}
    for (k, _), (r, t) in pools.items():
        mass[k] += float(r.size) if spec.unit == "samples" else float(t.sum())
    for k, m in mass.items():
        if m <= 0:
            raise InvalidInput(f"{at}: stream {k} has no tokens", field="tokens", stream=k)
    q: dict[int, dict[int, float]] = {}
    for (k, b), (r, _) in pools.items():
        q.setdefault(b, {})[k] = weights[k] * r.size / mass[k]
    return q


def check_quotas(
    phase: int, quota: Mapping[tuple[int, int], int], size: Mapping[tuple[int, int], int]
) -> None:
    """Refuse a pool smaller than its per-step quota: a step would hold a row twice."""
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
    return PhaseModel(phase).layout
