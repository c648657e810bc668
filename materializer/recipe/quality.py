"""The recipe's optional ``quality`` block: the plan quality report's window and the
thresholds that fail a cut (:mod:`materializer.quality`, ``docs/instruments.md``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from materializer.recipe.fields import Model, no_negative_zero

__all__ = ["QualityGate"]

#: A threshold on a share or a correlation: a number in (0, 1].
Fraction = Annotated[
    float, Field(strict=True, gt=0, le=1, allow_inf_nan=False), AfterValidator(no_negative_zero)
]


class QualityGate(Model):
    """How the cut measures its plan, and the numbers it must stay within.

    ``window_steps`` is the sliding window (in steps) over which realized stream
    shares are compared with their targets. A threshold left unset is reported,
    never enforced; a set one fails the cut, naming the number, when exceeded.
    """

    window_steps: Annotated[int, Field(strict=True, ge=1, le=1_000_000)] = 16
    max_autocorr_beyond_batch: Fraction | None = None
    max_share_deviation: Fraction | None = None
