"""The plan's inputs: a phase's candidate rows (:class:`Pool`) and its schedule
(:class:`PhaseSpec`), both checked on construction and immutable after it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from catalog.errors import InvalidInput, InvalidRecipe

__all__ = ["MAX_GLOBAL_BATCH", "Floats", "Int32s", "Int64s", "PhaseSpec", "Pool", "readonly"]

MAX_GLOBAL_BATCH = 1 << 24  # slot numbers share a 64-bit counter with step numbers

Int64s = NDArray[np.int64]
Int32s = NDArray[np.int32]
Floats = NDArray[np.float64]


def readonly(a: NDArray[Any]) -> NDArray[Any]:
    """``a``, marked read-only (pools and their slices are shared, never copied)."""
    a.flags.writeable = False
    return a


def _int_array(value: ArrayLike, dtype: type[np.integer[Any]], field: str) -> NDArray[Any]:
    raw = np.asarray(value)
    if raw.ndim != 1 or (raw.size and raw.dtype.kind not in "iu"):
        raise InvalidInput(f"pool.{field} must be a 1-D integer array", field=field)
    info = np.iinfo(dtype)
    if raw.size and (raw.min() < max(0, info.min) or raw.max() > info.max):
        raise InvalidInput(f"pool.{field} must lie in [0, {info.max}]", field=field)
    return readonly(np.ascontiguousarray(raw, dtype=dtype))


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

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its arrays (a parallel plan sends pools to its workers)."""
        return Pool, (self.row, self.stream, self.bucket, self.tokens)

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
        self._check_scalars(at)
        self._check_batches(at)
        batches = {int(b): int(v) for b, v in sorted(self.global_batch.items())}
        object.__setattr__(self, "stream_weights", MappingProxyType(self._normalised(at)))
        object.__setattr__(self, "global_batch", MappingProxyType(batches))

    def _check_scalars(self, at: str) -> None:
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

    def _check_batches(self, at: str) -> None:
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

    def _normalised(self, at: str) -> dict[int, float]:
        """The positive weights, checked, summing to one, by stream id."""
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
        return {k: w / total for k, w in sorted(weights.items())}

    @property
    def unit(self) -> Literal["samples", "tokens"]:
        """What the stream weights are shares of."""
        return "tokens" if self.token_budget is not None else "samples"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as checked (a worker of a parallel plan gets these exact weights:
        normalising them again could move their last bits, and with them the plan)."""
        return _restore_spec, tuple(
            dict(v) if isinstance(v, MappingProxyType) else v
            for v in (getattr(self, f.name) for f in fields(self))
        )


def _restore_spec(*values: Any) -> PhaseSpec:
    spec = object.__new__(PhaseSpec)
    for f, v in zip(fields(PhaseSpec), values, strict=True):
        object.__setattr__(spec, f.name, MappingProxyType(v) if isinstance(v, dict) else v)
    return spec


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)
