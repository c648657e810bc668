"""``min_coverage``: how far a backfill must have got before a cut may run.

A new score or caption version is backfilled over days; a cut that filters on it
before the backfill is done would silently drop every clip not yet scored
(``missing_score:<name>@<version>``). ``min_coverage`` names, per score the recipe
reads and for its caption version, the least share of candidate clips that must have
it (:mod:`materializer.coverage`); below it the cut refuses with the numbers.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from materializer.recipe.fields import FrozenMap, Model, Name, no_negative_zero

__all__ = ["MinCoverage", "Share"]

#: A share of candidate clips, in ``[0, 1]``.
Share = Annotated[float, Field(strict=True, ge=0, le=1), AfterValidator(no_negative_zero)]


class MinCoverage(Model):
    """Least shares of candidate clips that must hold each score / the captions."""

    scores: FrozenMap[Name, Share] = Field(
        default_factory=dict, description="score name (at the recipe's version) -> share"
    )
    captions: Share | None = None
