"""The recipe: a frozen, validated description of one snapshot cut.

A recipe names what to select from the catalog (pin, split, filters, exclusions,
dedup, tiers, streams, captions), how to bucket it (frame counts x aspect ratios) and
how to schedule it (phases). It is a recorded fact: the model is frozen, unknown keys
are rejected, and :meth:`Recipe.sha256` hashes a canonical JSON form, so the same
recipe written as YAML or JSON, with keys in any order, has one SHA-256.

:func:`load_recipe` is the front door; every problem becomes
:class:`~catalog.errors.InvalidRecipe` whose ``path`` names the field
(``phases[1].weights.web``). ``docs/recipes.md`` documents every field.

Modules: :mod:`.fields` (shared field types and validators), :mod:`.selection` (what
to select), :mod:`.schedule` (buckets, batches, phases), :mod:`.pin` (the catalog
pin), :mod:`.quality` (the plan quality gate), :mod:`.model` (:class:`Recipe` and its
cross-section checks), :mod:`.load` (parsing YAML/JSON and translating pydantic's
errors), :mod:`.notes` (what loading changed, e.g. normalised weights, for warnings
and the snapshot).
"""

from materializer.recipe.load import load_recipe
from materializer.recipe.model import Recipe
from materializer.recipe.notes import recipe_notes
from materializer.recipe.pin import PIN_TABLES
from materializer.recipe.quality import QualityGate
from materializer.recipe.schedule import Buckets, GlobalBatch, Phase
from materializer.recipe.selection import (
    Captions,
    EvalNearDuplicates,
    Exclusions,
    ScoreFilter,
    ScoreRef,
    SemanticDedup,
    Stream,
    TierRule,
    Tiers,
)

__all__ = [
    "PIN_TABLES",
    "Buckets",
    "Captions",
    "EvalNearDuplicates",
    "Exclusions",
    "GlobalBatch",
    "Phase",
    "QualityGate",
    "Recipe",
    "ScoreFilter",
    "ScoreRef",
    "SemanticDedup",
    "Stream",
    "TierRule",
    "Tiers",
    "load_recipe",
    "recipe_notes",
]
