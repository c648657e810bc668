"""The recipe model: a frozen, validated description of one snapshot cut.

:class:`Recipe` holds the sections (:mod:`~materializer.recipe.selection`,
:mod:`~materializer.recipe.schedule`, :mod:`~materializer.recipe.pin`) and checks
what spans them: names referenced across sections exist, embedding pins match the
models read, and predicates are stored in their validated normal form, which is what
:meth:`Recipe.sha256` covers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import Field, model_validator

from catalog.pins import CENTROIDS_PREFIX, EMBEDDINGS_PREFIX, embedding_key
from materializer.predicates import clip_view_columns, validate_predicate
from materializer.recipe.coverage import MinCoverage
from materializer.recipe.fields import Label, Model, Version, check_unique, fail, unknown
from materializer.recipe.pin import CatalogPin
from materializer.recipe.quality import QualityGate
from materializer.recipe.schedule import Buckets, Phase
from materializer.recipe.selection import (
    Captions,
    Exclusions,
    ScoreFilter,
    ScoreRef,
    SemanticDedup,
    Stream,
    Tiers,
)

__all__ = ["Recipe"]

#: A tensor key of a latent member (``latent``, ``text_emb``, ``i2v_y``, …).
TensorKey = Annotated[str, Field(strict=True, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")]
_LATER_FIELDS = ("tensor_keys", "quality", "min_coverage")


class Recipe(Model):
    """A snapshot recipe. Build it with :func:`load_recipe`; see ``docs/recipes.md``."""

    name: Label
    description: Annotated[str, Field(strict=True, max_length=4000)] = ""
    seed: Annotated[int, Field(strict=True, ge=0, lt=2**63)]
    catalog_pin: CatalogPin = "latest"
    split: Annotated[str, Field(strict=True)] = "train"
    tokenizer_version: Version
    scores: tuple[ScoreRef, ...] = ()
    filters: tuple[ScoreFilter, ...] = ()
    exclusions: Exclusions = Exclusions()
    semantic_dedup: SemanticDedup | None = None
    tiers: Tiers = Tiers()
    streams: tuple[Stream, ...] = Field(min_length=1)
    captions: Captions
    buckets: Buckets
    phases: tuple[Phase, ...] = Field(min_length=1)
    #: The tensors of each latent to deliver (default None: every tensor it holds).
    #: Samples lacking one are dropped (``missing_tensor_keys``).
    tensor_keys: tuple[TensorKey, ...] | None = Field(default=None, min_length=1)
    #: Plan quality window and thresholds (default None: report, enforce nothing).
    quality: QualityGate | None = None
    #: Least backfill coverage per score / of the captions (None: no minimum).
    min_coverage: MinCoverage | None = None

    def score_versions(self) -> dict[str, str]:
        """Score name -> version for every score the recipe names (filters and scores)."""
        out = {s.name: s.version for s in self.scores}
        out.update({f.name: f.version for f in self.filters})
        return dict(sorted(out.items()))

    def embedding_models(self) -> tuple[str, ...]:
        """Every embedding model version the recipe reads (decontamination, dedup)."""
        models = set()
        if self.exclusions.eval_near_duplicates is not None:
            models.add(self.exclusions.eval_near_duplicates.embedding_model)
        if self.semantic_dedup is not None:
            models.add(self.semantic_dedup.embedding_model)
        return tuple(sorted(models))

    def view_columns(self, *, include_tier: bool = True) -> dict[str, str]:
        """The clip view's columns for this recipe (see :mod:`materializer.predicates`)."""
        return clip_view_columns(self.score_versions(), include_tier=include_tier)

    def to_canonical_json(self) -> str:
        """Sorted keys, no whitespace, defaults included (but for later optional fields
        left unset): the form :meth:`sha256` hashes."""
        # Fields added after a recipe format shipped are left out at their default, so
        # every recipe written before them keeps its SHA-256.
        exclude = {k for k in _LATER_FIELDS if getattr(self, k) is None}
        return json.dumps(
            self.model_dump(mode="json", exclude=exclude),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the recipe's fields, validated again on load: its mappings are
        read-only views (``MappingProxyType``), which do not pickle, and a partitioned
        cut sends the recipe to its pool or Ray workers (:mod:`materializer.partition`)."""
        return (type(self).model_validate, (self.model_dump(),))

    def sha256(self) -> str:
        """SHA-256 hex of :meth:`to_canonical_json` (UTF-8), stable across processes."""
        return hashlib.sha256(self.to_canonical_json().encode("utf-8")).hexdigest()

    @model_validator(mode="after")
    def _cross_check(self) -> Recipe:
        if self.split != "train":
            raise fail("split", f"training cuts may only select split 'train', got {self.split!r}")
        check_unique([s.name for s in self.scores], "scores", by_name=True)
        check_unique(self.tensor_keys or (), "tensor_keys")
        check_unique([f.name for f in self.filters], "filters", by_name=True)
        filter_versions = {f.name: f.version for f in self.filters}
        for i, s in enumerate(self.scores):
            if filter_versions.get(s.name, s.version) != s.version:
                raise fail(
                    f"scores[{i}].version",
                    f"score {s.name!r} is filtered at version {filter_versions[s.name]!r}",
                )
        scores = self.score_versions()
        for name in self.min_coverage.scores if self.min_coverage else ():
            if name not in scores:
                raise fail(f"min_coverage.scores.{name}", unknown("score", name, scores))
        if self.semantic_dedup is not None and self.semantic_dedup.rank_by not in scores:
            raise fail(
                "semantic_dedup.rank_by", unknown("score", self.semantic_dedup.rank_by, scores)
            )
        tier_names = self.tiers.names()
        check_unique(tier_names[:-1], "tiers.rules", by_name=True)
        if self.tiers.default in tier_names[:-1]:
            raise fail(
                "tiers.default", f"default tier {self.tiers.default!r} is also a rule's name"
            )
        check_unique([s.name for s in self.streams], "streams", by_name=True)
        stream_names = [s.name for s in self.streams]
        check_unique([p.name for p in self.phases], "phases", by_name=True)
        bucket_keys = self.buckets.bucket_keys()
        for i, phase in enumerate(self.phases):
            for name in phase.weights:
                if name not in stream_names:
                    raise fail(f"phases[{i}].weights.{name}", unknown("stream", name, stream_names))
            for j, tier in enumerate(phase.tiers or ()):
                if tier not in tier_names:
                    raise fail(f"phases[{i}].tiers[{j}]", unknown("tier", tier, tier_names))
            for key in phase.global_batch.overrides:
                if key not in bucket_keys:
                    raise fail(
                        f"phases[{i}].global_batch.overrides.{key}",
                        unknown("bucket", key, bucket_keys),
                    )
        self._check_embedding_pins()
        return self._normalised_predicates()

    def _check_embedding_pins(self) -> None:
        """An explicit pin that names embedding versions names exactly the models the
        recipe reads (a pin without any keeps reading the latest, as before pins
        covered embeddings; snapshot.json records the versions read)."""
        if isinstance(self.catalog_pin, str):
            return
        named = [k for k in self.catalog_pin if k.startswith(EMBEDDINGS_PREFIX)]
        if not named:
            self._check_centroid_pins()
            return
        models = self.embedding_models()
        for key in named:
            if key[len(EMBEDDINGS_PREFIX) :] not in models:
                used = ", ".join(repr(embedding_key(m)) for m in models) or "none"
                raise fail(
                    f"catalog_pin.{key}",
                    f"the recipe reads no embeddings of {key[len(EMBEDDINGS_PREFIX) :]!r} "
                    f"(it reads: {used})",
                )
        for model in models:
            if embedding_key(model) not in self.catalog_pin:
                raise fail(
                    f"catalog_pin.{embedding_key(model)}",
                    f"the pin names embedding versions but not {embedding_key(model)!r}",
                )
        self._check_centroid_pins()

    def _check_centroid_pins(self) -> None:
        """An explicit ``centroids/<model>`` key belongs to the semantic dedup's model."""
        if isinstance(self.catalog_pin, str):
            return
        dd = self.semantic_dedup
        for key in self.catalog_pin:
            if key.startswith(CENTROIDS_PREFIX) and (
                dd is None or key[len(CENTROIDS_PREFIX) :] != dd.embedding_model
            ):
                want = "no semantic_dedup" if dd is None else repr(dd.embedding_model)
                raise fail(
                    f"catalog_pin.{key}",
                    f"centroids pinned for a model the semantic dedup does not use ({want})",
                )

    def _normalised_predicates(self) -> Recipe:
        # Store the validated, normalised SQL: it is what selection runs, so it is what
        # the SHA-256 covers. validate_predicate raises InvalidRecipe with the path.
        tier_cols = self.view_columns(include_tier=False)
        stream_cols = self.view_columns(include_tier=True)
        rules = tuple(
            r.model_copy(
                update={"where": validate_predicate(r.where, tier_cols, f"tiers.rules[{i}].where")}
            )
            for i, r in enumerate(self.tiers.rules)
        )
        streams = tuple(
            s.model_copy(
                update={"where": validate_predicate(s.where, stream_cols, f"streams[{i}].where")}
            )
            for i, s in enumerate(self.streams)
        )
        return self.model_copy(
            update={
                "tiers": self.tiers.model_copy(update={"rules": rules}),
                "streams": streams,
                # Filters and score refs are sets; sort them so order does not change the hash.
                "filters": tuple(sorted(self.filters, key=lambda f: f.name)),
                "scores": tuple(sorted(self.scores, key=lambda s: s.name)),
            }
        )
