"""What a recipe selects: score references and filters, exclusions, dedup, tiers,
streams and captions (the sections of ``docs/recipes.md`` before buckets)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from materializer.recipe.fields import (
    Distance,
    Finite,
    Model,
    Name,
    PosInt,
    Predicate,
    Version,
    check_unique,
    fail,
    no_negative_zero,
)

__all__ = [
    "Captions",
    "EvalNearDuplicates",
    "Exclusions",
    "ScoreFilter",
    "ScoreRef",
    "SemanticDedup",
    "Stream",
    "TierRule",
    "Tiers",
]


class ScoreRef(Model):
    """A score the recipe uses by name (column ``score_<name>``) at one version."""

    name: Name
    version: Version


class ScoreFilter(Model):
    """Keep clips whose score ``name`` at ``version`` lies in ``[min, max]``."""

    name: Name
    version: Version
    min: Finite | None = None
    max: Finite | None = None

    @model_validator(mode="after")
    def _bounds(self) -> ScoreFilter:
        if self.min is None and self.max is None:
            raise fail("min", "a filter needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise fail("max", f"max {self.max} is below min {self.min}")
        return self


class EvalNearDuplicates(Model):
    """Drop training clips within ``max_distance`` (cosine) of any eval clip.

    A cut refuses to run when fewer than ``min_eval_coverage`` of the eval clips at
    the pin have a vector of ``embedding_model`` (default: every one must): an eval
    clip without a vector cannot be decontaminated against.
    """

    embedding_model: Version
    max_distance: Distance
    min_eval_coverage: Annotated[
        float, Field(strict=True, ge=0, le=1), AfterValidator(no_negative_zero)
    ] = 1.0


class Exclusions(Model):
    """What never enters the cut. Tombstoned assets are excluded, always."""

    tombstoned: bool = Field(default=True, strict=True)
    quarantined: bool = Field(default=True, strict=True)
    eval_near_duplicates: EvalNearDuplicates | None = None

    @model_validator(mode="after")
    def _governed(self) -> Exclusions:
        if not self.tombstoned:
            raise fail("tombstoned", "tombstoned assets can never enter a snapshot")
        return self


class SemanticDedup(Model):
    """SemDeDup: cluster embeddings, then drop near-duplicates within each cluster.

    Clips of one k-means cluster are visited best first by ``rank_by``; a clip is
    dropped when ``keep_per_cluster`` already-kept clips lie within ``eps`` (cosine
    distance) of it. Exactly one of ``num_clusters`` and ``cluster_size`` (the mean
    clip count per cluster, giving ``ceil(n / cluster_size)`` clusters) is set.
    """

    embedding_model: Version
    eps: Distance
    keep_per_cluster: PosInt = 1
    rank_by: Name
    higher_is_better: bool = Field(default=True, strict=True)
    num_clusters: PosInt | None = None
    cluster_size: PosInt | None = None

    @model_validator(mode="after")
    def _one_clustering(self) -> SemanticDedup:
        if (self.num_clusters is None) == (self.cluster_size is None):
            raise fail("num_clusters", "set exactly one of num_clusters and cluster_size")
        return self


class TierRule(Model):
    """Clips matching ``where`` (and no earlier rule) get tier ``name``."""

    name: Name
    where: Predicate


class Tiers(Model):
    """Ordered tier rules; the first match wins, the rest get ``default``."""

    rules: tuple[TierRule, ...] = ()
    default: Name = "default"

    def names(self) -> tuple[str, ...]:
        """Every tier a clip can get, rules first."""
        return (*(r.name for r in self.rules), self.default)


class Stream(Model):
    """Clips matching ``where`` (and no earlier stream) feed stream ``name``."""

    name: Name
    where: Predicate


class Captions(Model):
    """Caption variants served with each sample: one version, these kinds in order."""

    version: Version
    kinds: tuple[Name, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Captions:
        check_unique(self.kinds, "kinds")
        return self
