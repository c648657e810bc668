"""How a recipe buckets and schedules its samples: the bucket lattice, global batches
and phases."""

from __future__ import annotations

import math
import re
from types import MappingProxyType
from typing import Annotated, Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BeforeValidator, Field, PrivateAttr, model_validator

from catalog.names import RUNG
from materializer.recipe.fields import (
    Aspect,
    FrozenMap,
    Label,
    Model,
    Name,
    PosInt,
    check_unique,
    fail,
    ratio,
    whole_number,
)

__all__ = ["Buckets", "GlobalBatch", "Phase"]

_MIN_WEIGHT = 1e-9
#: Rows per block of :meth:`Buckets.assign` (its temporaries are ~100 B a row).
_ASSIGN_BLOCK = 1 << 16


class Buckets(Model):
    """The bucket lattice: latent frame counts x aspect ratios ('W:H').

    A clip goes to the largest frame count not above its latent frames (the loader
    uses the first that many frames) and to the aspect ratio nearest its
    ``width / height`` in log space (ties go to the narrower ratio). A clip shorter
    than the smallest frame count fits no bucket. Bucket ids run frames-major over
    the sorted lattice: ``id = frame_index * len(aspect_ratios) + aspect_index``.
    """

    latent_frames: tuple[PosInt, ...] = Field(min_length=1)
    aspect_ratios: tuple[Aspect, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _canonical(self) -> Buckets:
        check_unique(self.latent_frames, "latent_frames")
        check_unique(self.aspect_ratios, "aspect_ratios")
        # Sorted is the canonical order: the lattice is a set, ids follow the order.
        frames = tuple(sorted(self.latent_frames))
        aspects = tuple(sorted(self.aspect_ratios, key=ratio))
        if frames != self.latent_frames or aspects != self.aspect_ratios:
            return self.model_copy(update={"latent_frames": frames, "aspect_ratios": aspects})
        return self

    def bucket_keys(self) -> tuple[str, ...]:
        """Bucket keys ``"<frames>x<W:H>"`` by bucket id."""
        return tuple(f"{f}x{a}" for f in self.latent_frames for a in self.aspect_ratios)

    def assign(
        self, latent_frames: NDArray[np.integer[Any]], aspect: NDArray[np.floating[Any]]
    ) -> NDArray[np.int32]:
        """Bucket id per clip, ``-1`` where the clip is shorter than every frame count.

        Args:
            latent_frames: Latent frame count per clip.
            aspect: ``width / height`` per clip (positive).
        """
        frames = np.asarray(self.latent_frames, dtype=np.int64)
        logs = np.log(np.array([ratio(a) for a in self.aspect_ratios], dtype=np.float64))
        n = len(latent_frames)
        out = np.empty(n, dtype=np.int32)
        # In blocks: the distances are a (rows x ratios) float64 matrix, and with the
        # other temporaries ~150 B a clip for the whole table at once.
        for lo in range(0, n, _ASSIGN_BLOCK):
            hi = min(n, lo + _ASSIGN_BLOCK)
            block = np.asarray(latent_frames[lo:hi], dtype=np.int64)
            fi = np.searchsorted(frames, block, side="right") - 1
            logged = np.log(np.asarray(aspect[lo:hi], dtype=np.float64))
            dist = np.abs(logged[:, None] - logs[None, :])
            ai = np.argmin(dist, axis=1)  # first minimum: ties go to the narrower ratio
            ids = fi * len(self.aspect_ratios) + ai
            out[lo:hi] = np.where(fi >= 0, ids, -1)
        return out


class GlobalBatch(Model):
    """Samples per global step: ``default``, or ``overrides["<frames>x<W:H>"]``."""

    default: PosInt
    overrides: FrozenMap[str, PosInt] = Field(default_factory=dict, validate_default=True)

    @model_validator(mode="after")
    def _canonical_keys(self) -> GlobalBatch:
        # Keys name buckets by reduced ratio ("4x32:18" is bucket "4x16:9").
        keys: dict[str, int] = {}
        for key, batch in self.overrides.items():
            canonical = canonical_bucket_key(key)
            if canonical in keys:
                raise fail(f"overrides.{key}", f"bucket {canonical!r} is named twice")
            keys[canonical] = batch
        if list(keys) != list(self.overrides):
            return self.model_copy(update={"overrides": MappingProxyType(keys)})
        return self

    def for_bucket(self, key: str) -> int:
        """The global batch of bucket ``key``."""
        return self.overrides.get(key, self.default)


def _global_batch(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"default": value}  # shorthand: one batch for every bucket
    return value


#: A weight sum further than this from 1 is the author's (0.5/0.3/0.3), not rounding.
_SUM_TOLERANCE = 1e-6


class Phase(Model):
    """One stretch of training at one rung with fixed stream weights.

    ``weights`` are normalised to sum to one; a declared stream left out of them is
    not sampled in this phase. Exactly one of ``steps`` and ``token_budget`` ends it.
    :attr:`given_weight_sum` keeps what the weights summed to when that was not one
    (not a field: the recipe's canonical form and SHA-256 hold the normalised weights),
    for the warning and the snapshot note of :func:`~materializer.recipe.notes.recipe_notes`.
    """

    name: Label
    rung: Annotated[str, Field(strict=True, pattern=RUNG)]
    tiers: tuple[Name, ...] | None = None
    weights: FrozenMap[Name, Annotated[float, Field(strict=True, gt=0)]]
    steps: PosInt | None = None
    token_budget: Annotated[PosInt | None, BeforeValidator(whole_number)] = None
    global_batch: Annotated[GlobalBatch, BeforeValidator(_global_batch)]
    rank_multiple: PosInt = 1
    # A (stream, bucket) pool smaller than its per-step quota repeats rows in a step;
    # the cut refuses that unless the phase says so (docs/plan.md, "Epochs").
    allow_repeats_in_step: bool = Field(default=False, strict=True)
    _given_weight_sum: float | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # Fields only: the given sum is a note about the source, not part of the phase
        # (a recipe reloaded from its canonical form equals the one it came from).
        if not isinstance(other, Phase):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = Model.__hash__

    @property
    def given_weight_sum(self) -> float | None:
        """The sum of the weights as written, when it was not 1 (they were normalised)."""
        return self._given_weight_sum

    @model_validator(mode="after")
    def _consistent(self) -> Phase:
        if (self.steps is None) == (self.token_budget is None):
            raise fail("steps", "set exactly one of steps and token_budget")
        if not self.weights:
            raise fail("weights", "a phase needs at least one stream weight")
        if self.tiers is not None:
            if not self.tiers:
                raise fail("tiers", "an empty tier gate admits nothing; omit it to admit all")
            check_unique(self.tiers, "tiers")
        batches = [("global_batch.default", self.global_batch.default)]
        batches += [
            (f"global_batch.overrides.{k}", v) for k, v in self.global_batch.overrides.items()
        ]
        for where, batch in batches:
            if batch % self.rank_multiple:
                raise fail(
                    where,
                    f"global batch {batch} is not a multiple of rank_multiple {self.rank_multiple}",
                )
        # Scale by the largest weight first so that the sum cannot overflow.
        top = max(self.weights.values())
        scaled = math.fsum(v / top for v in self.weights.values())
        weights = dict(self.weights)
        # Normalise once: a dump of normalised weights reloads unchanged (same SHA-256).
        if abs(scaled * top - 1.0) > 1e-12:
            weights = {k: (v / top) / scaled for k, v in weights.items()}
        for k, v in weights.items():
            if v < _MIN_WEIGHT:
                raise fail(f"weights.{k}", f"weight is below {_MIN_WEIGHT} of the phase; drop it")
        if weights != self.weights:
            normalised = self.model_copy(update={"weights": MappingProxyType(weights)})
            if abs(scaled * top - 1.0) > _SUM_TOLERANCE:  # not mere float rounding
                normalised._given_weight_sum = scaled * top
            return normalised
        return self


def canonical_bucket_key(key: str) -> str:
    m = re.fullmatch(r"(\d+)x(\d+):(\d+)", key)
    if not m or int(m.group(2)) == 0 or int(m.group(3)) == 0:
        return key  # left for the bucket check to name as unknown
    w, h = int(m.group(2)), int(m.group(3))
    g = math.gcd(w, h)
    return f"{int(m.group(1))}x{w // g}:{h // g}"
