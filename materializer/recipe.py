"""The recipe: a frozen, validated description of one snapshot cut.

A recipe names what to select from the catalog (pin, split, filters, exclusions,
dedup, tiers, streams, captions), how to bucket it (frame counts x aspect ratios) and
how to schedule it (phases). It is a recorded fact: the model is frozen, unknown keys
are rejected, and :meth:`Recipe.sha256` hashes a canonical JSON form, so the same
recipe written as YAML or JSON, with keys in any order, has one SHA-256.

:func:`load_recipe` is the front door; every problem becomes
:class:`~catalog.errors.InvalidRecipe` whose ``path`` names the field
(``phases[1].weights.web``). ``docs/recipes.md`` documents every field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
import yaml
from numpy.typing import NDArray
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from catalog.errors import InvalidRecipe
from catalog.names import LABEL, NAME, RUNG, VERSION_MAX_LENGTH
from catalog.pins import EMBEDDINGS_PREFIX, embedding_key
from materializer.predicates import clip_view_columns, validate_predicate

__all__ = [
    "PIN_TABLES",
    "Buckets",
    "Captions",
    "EvalNearDuplicates",
    "Exclusions",
    "GlobalBatch",
    "Phase",
    "Recipe",
    "ScoreFilter",
    "ScoreRef",
    "SemanticDedup",
    "Stream",
    "TierRule",
    "Tiers",
    "load_recipe",
]

#: Iceberg tables a cut reads; an explicit ``catalog_pin`` must name each of them.
PIN_TABLES = ("assets", "asset_events", "tombstones", "clips", "latents", "scores", "captions")
_OPTIONAL_PIN_TABLES = ("jobs",)
_MAX_RECIPE_BYTES = 1 << 20
_MIN_WEIGHT = 1e-9

K = TypeVar("K")
V = TypeVar("V")


def _fail(subpath: str, message: str) -> PydanticCustomError:
    # ``subpath`` is appended to pydantic's location, so a nested validator can name
    # the field it objects to without knowing where its model sits in the recipe.
    return PydanticCustomError("recipe", message, {"subpath": subpath})


def _freeze(value: Mapping[K, V]) -> Mapping[K, V]:
    return MappingProxyType(dict(value))


def _version(value: Any) -> Any:
    if isinstance(value, bool):
        return value  # rejected by the str type below
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        raise _fail("", "quote versions: YAML reads 1.10 as the number 1.1")
    return value


def _no_negative_zero(value: float) -> float:
    return value + 0.0  # -0.0 and 0.0 must not hash differently


def _aspect(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        raise _fail("", "quote aspect ratios: YAML reads an unquoted 16:9 as the number 969")
    if not isinstance(value, str) or not (m := re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", value)):
        raise _fail("", f"aspect ratio must be a 'W:H' string such as '16:9', got {value!r}")
    w, h = int(m.group(1)), int(m.group(2))
    if w == 0 or h == 0:
        raise _fail("", f"aspect ratio {value!r} has a zero side")
    g = math.gcd(w, h)
    return f"{w // g}:{h // g}"


def _whole_number(value: Any) -> Any:
    # YAML writes large budgets as 2.0e+9; accept whole floats, keep ints exact.
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# The shapes of names are the catalog's (catalog.names): ingest rejects a row whose
# name no recipe could spell.
Name = Annotated[str, Field(strict=True, pattern=NAME)]
Label = Annotated[str, Field(strict=True, pattern=LABEL)]
Version = Annotated[
    str,
    BeforeValidator(_version),
    Field(strict=True, min_length=1, max_length=VERSION_MAX_LENGTH),
]
Predicate = Annotated[str, Field(strict=True, min_length=1)]
PosInt = Annotated[int, Field(strict=True, gt=0, lt=2**63)]
Finite = Annotated[
    float, Field(strict=True, allow_inf_nan=False), AfterValidator(_no_negative_zero)
]
Distance = Annotated[float, Field(strict=True, gt=0, lt=1), AfterValidator(_no_negative_zero)]
Aspect = Annotated[str, BeforeValidator(_aspect)]
FrozenMap = Annotated[Mapping[K, V], AfterValidator(_freeze), PlainSerializer(dict)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ScoreRef(_Model):
    """A score the recipe uses by name (column ``score_<name>``) at one version."""

    name: Name
    version: Version


class ScoreFilter(_Model):
    """Keep clips whose score ``name`` at ``version`` lies in ``[min, max]``."""

    name: Name
    version: Version
    min: Finite | None = None
    max: Finite | None = None

    @model_validator(mode="after")
    def _bounds(self) -> ScoreFilter:
        if self.min is None and self.max is None:
            raise _fail("min", "a filter needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise _fail("max", f"max {self.max} is below min {self.min}")
        return self


class EvalNearDuplicates(_Model):
    """Drop training clips within ``max_distance`` (cosine) of any eval clip.

    A cut refuses to run when fewer than ``min_eval_coverage`` of the eval clips at
    the pin have a vector of ``embedding_model`` (default: every one must): an eval
    clip without a vector cannot be decontaminated against.
    """

    embedding_model: Version
    max_distance: Distance
    min_eval_coverage: Annotated[
        float, Field(strict=True, ge=0, le=1), AfterValidator(_no_negative_zero)
    ] = 1.0


class Exclusions(_Model):
    """What never enters the cut. Tombstoned assets are excluded, always."""

    tombstoned: bool = Field(default=True, strict=True)
    quarantined: bool = Field(default=True, strict=True)
    eval_near_duplicates: EvalNearDuplicates | None = None

    @model_validator(mode="after")
    def _governed(self) -> Exclusions:
        if not self.tombstoned:
            raise _fail("tombstoned", "tombstoned assets can never enter a snapshot")
        return self


class SemanticDedup(_Model):
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
            raise _fail("num_clusters", "set exactly one of num_clusters and cluster_size")
        return self


class TierRule(_Model):
    """Clips matching ``where`` (and no earlier rule) get tier ``name``."""

    name: Name
    where: Predicate


class Tiers(_Model):
    """Ordered tier rules; the first match wins, the rest get ``default``."""

    rules: tuple[TierRule, ...] = ()
    default: Name = "default"

    def names(self) -> tuple[str, ...]:
        """Every tier a clip can get, rules first."""
        return (*(r.name for r in self.rules), self.default)


class Stream(_Model):
    """Clips matching ``where`` (and no earlier stream) feed stream ``name``."""

    name: Name
    where: Predicate


class Captions(_Model):
    """Caption variants served with each sample: one version, these kinds in order."""

    version: Version
    kinds: tuple[Name, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Captions:
        _check_unique(self.kinds, "kinds")
        return self


class Buckets(_Model):
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
        _check_unique(self.latent_frames, "latent_frames")
        _check_unique(self.aspect_ratios, "aspect_ratios")
        # Sorted is the canonical order: the lattice is a set, ids follow the order.
        frames = tuple(sorted(self.latent_frames))
        aspects = tuple(sorted(self.aspect_ratios, key=_ratio))
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
        fi = np.searchsorted(frames, np.asarray(latent_frames, dtype=np.int64), side="right") - 1
        logs = np.log(np.array([_ratio(a) for a in self.aspect_ratios], dtype=np.float64))
        dist = np.abs(np.log(np.asarray(aspect, dtype=np.float64))[:, None] - logs[None, :])
        ai = np.argmin(dist, axis=1)  # first minimum: ties go to the narrower ratio
        ids = fi * len(self.aspect_ratios) + ai
        return np.where(fi >= 0, ids, -1).astype(np.int32)


class GlobalBatch(_Model):
    """Samples per global step: ``default``, or ``overrides["<frames>x<W:H>"]``."""

    default: PosInt
    overrides: FrozenMap[str, PosInt] = Field(default_factory=dict, validate_default=True)

    @model_validator(mode="after")
    def _canonical_keys(self) -> GlobalBatch:
        # Keys name buckets by reduced ratio ("4x32:18" is bucket "4x16:9").
        keys: dict[str, int] = {}
        for key, batch in self.overrides.items():
            canonical = _canonical_bucket_key(key)
            if canonical in keys:
                raise _fail(f"overrides.{key}", f"bucket {canonical!r} is named twice")
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


class Phase(_Model):
    """One stretch of training at one rung with fixed stream weights.

    ``weights`` are normalised to sum to one; a declared stream left out of them is
    not sampled in this phase. Exactly one of ``steps`` and ``token_budget`` ends it.
    """

    name: Label
    rung: Annotated[str, Field(strict=True, pattern=RUNG)]
    tiers: tuple[Name, ...] | None = None
    weights: FrozenMap[Name, Annotated[float, Field(strict=True, gt=0)]]
    steps: PosInt | None = None
    token_budget: Annotated[PosInt | None, BeforeValidator(_whole_number)] = None
    global_batch: Annotated[GlobalBatch, BeforeValidator(_global_batch)]
    rank_multiple: PosInt = 1
    # A (stream, bucket) pool smaller than its per-step quota repeats rows in a step;
    # the cut refuses that unless the phase says so (docs/plan.md, "Epochs").
    allow_repeats_in_step: bool = Field(default=False, strict=True)

    @model_validator(mode="after")
    def _consistent(self) -> Phase:
        if (self.steps is None) == (self.token_budget is None):
            raise _fail("steps", "set exactly one of steps and token_budget")
        if not self.weights:
            raise _fail("weights", "a phase needs at least one stream weight")
        if self.tiers is not None:
            if not self.tiers:
                raise _fail("tiers", "an empty tier gate admits nothing; omit it to admit all")
            _check_unique(self.tiers, "tiers")
        batches = [("global_batch.default", self.global_batch.default)]
        batches += [
            (f"global_batch.overrides.{k}", v) for k, v in self.global_batch.overrides.items()
        ]
        for where, batch in batches:
            if batch % self.rank_multiple:
                raise _fail(
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
                raise _fail(f"weights.{k}", f"weight is below {_MIN_WEIGHT} of the phase; drop it")
        if weights != self.weights:
            return self.model_copy(update={"weights": MappingProxyType(weights)})
        return self


def _catalog_pin(value: Any) -> Any:
    expected = "catalog_pin is 'latest' or a mapping table -> snapshot id"
    if isinstance(value, str):
        if value != "latest":
            raise _fail("", f"{expected}, got {value!r}")
        return value
    if not isinstance(value, Mapping):
        raise _fail("", f"{expected}, got {type(value).__name__}")
    known = (*PIN_TABLES, *_OPTIONAL_PIN_TABLES)
    for table, snap in value.items():
        if isinstance(table, str) and table.startswith(EMBEDDINGS_PREFIX):
            _check_embedding_pin(table, snap)
            continue
        if table not in known:
            raise _fail(f"{table}", f"unknown table {table!r} (pinnable: {', '.join(known)})")
        if snap is not None and (
            isinstance(snap, bool) or not isinstance(snap, int) or not -(2**63) <= snap < 2**63
        ):
            raise _fail(
                f"{table}", f"a snapshot id is a 64-bit integer or null (empty table), got {snap!r}"
            )
    missing = [t for t in PIN_TABLES if t not in value]
    if missing:
        raise _fail(
            missing[0],
            f"an explicit pin names every table a cut reads; missing {', '.join(missing)}",
        )
    return MappingProxyType({k: value[k] for k in sorted(value)})


def _check_embedding_pin(key: str, version: Any) -> None:
    if not key[len(EMBEDDINGS_PREFIX) :]:
        raise _fail(key, f"{key!r} names no embedding model ('embeddings/<model version>')")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**63
    ):
        raise _fail(key, f"a LanceDB table version is an integer >= 1, got {version!r}")


_PinJson = Literal["latest"] | dict[str, int | None]
CatalogPin = Annotated[
    Literal["latest"] | Mapping[str, int | None],
    # Plain: _catalog_pin checks everything, and the union would re-copy the mapping.
    PlainValidator(_catalog_pin, json_schema_input_type=_PinJson),
    PlainSerializer(lambda v: v if isinstance(v, str) else dict(v), return_type=_PinJson),
]


class Recipe(_Model):
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
        """Sorted keys, no whitespace, defaults included: the form :meth:`sha256` hashes."""
        return json.dumps(
            self.model_dump(mode="json"),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )

    def sha256(self) -> str:
        """SHA-256 hex of :meth:`to_canonical_json` (UTF-8), stable across processes."""
        return hashlib.sha256(self.to_canonical_json().encode("utf-8")).hexdigest()

    @model_validator(mode="after")
    def _cross_check(self) -> Recipe:
        if self.split != "train":
            raise _fail("split", f"training cuts may only select split 'train', got {self.split!r}")
        _check_unique([s.name for s in self.scores], "scores", by_name=True)
        _check_unique([f.name for f in self.filters], "filters", by_name=True)
        filter_versions = {f.name: f.version for f in self.filters}
        for i, s in enumerate(self.scores):
            if filter_versions.get(s.name, s.version) != s.version:
                raise _fail(
                    f"scores[{i}].version",
                    f"score {s.name!r} is filtered at version {filter_versions[s.name]!r}",
                )
        scores = self.score_versions()
        if self.semantic_dedup is not None and self.semantic_dedup.rank_by not in scores:
            raise _fail(
                "semantic_dedup.rank_by", _unknown("score", self.semantic_dedup.rank_by, scores)
            )
        tier_names = self.tiers.names()
        _check_unique(tier_names[:-1], "tiers.rules", by_name=True)
        if self.tiers.default in tier_names[:-1]:
            raise _fail(
                "tiers.default", f"default tier {self.tiers.default!r} is also a rule's name"
            )
        _check_unique([s.name for s in self.streams], "streams", by_name=True)
        stream_names = [s.name for s in self.streams]
        _check_unique([p.name for p in self.phases], "phases", by_name=True)
        bucket_keys = self.buckets.bucket_keys()
        for i, phase in enumerate(self.phases):
            for name in phase.weights:
                if name not in stream_names:
                    raise _fail(
                        f"phases[{i}].weights.{name}", _unknown("stream", name, stream_names)
                    )
            for j, tier in enumerate(phase.tiers or ()):
                if tier not in tier_names:
                    raise _fail(f"phases[{i}].tiers[{j}]", _unknown("tier", tier, tier_names))
            for key in phase.global_batch.overrides:
                if key not in bucket_keys:
                    raise _fail(
                        f"phases[{i}].global_batch.overrides.{key}",
                        _unknown("bucket", key, bucket_keys),
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
            return
        models = self.embedding_models()
        for key in named:
            if key[len(EMBEDDINGS_PREFIX) :] not in models:
                used = ", ".join(repr(embedding_key(m)) for m in models) or "none"
                raise _fail(
                    f"catalog_pin.{key}",
                    f"the recipe reads no embeddings of {key[len(EMBEDDINGS_PREFIX) :]!r} "
                    f"(it reads: {used})",
                )
        for model in models:
            if embedding_key(model) not in self.catalog_pin:
                raise _fail(
                    f"catalog_pin.{embedding_key(model)}",
                    f"the pin names embedding versions but not {embedding_key(model)!r}",
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


def load_recipe(source: Recipe | Mapping[str, Any] | str | Path) -> Recipe:
    """Load and validate a recipe.

    Args:
        source: A :class:`Recipe`; a mapping; a :class:`~pathlib.Path` to a YAML or
            JSON file; or a string holding YAML/JSON text, or naming an existing
            ``.yaml``/``.yml``/``.json`` file.

    Returns:
        The frozen, normalised recipe.

    Raises:
        InvalidRecipe: ``path`` names the first bad field ("" for the whole document);
            ``errors`` lists every problem pydantic found as ``{"path", "message"}``.
    """
    if isinstance(source, Recipe):
        return source
    data: Any = source
    looks_like_path = (
        isinstance(source, str)
        and "\n" not in source
        and source.lower().endswith((".yaml", ".yml", ".json"))
    )
    if isinstance(source, Path) or looks_like_path:
        path = Path(source)  # type: ignore[arg-type]  # a str when looks_like_path
        if not path.is_file():
            raise _invalid(f"no such recipe file: {str(source)!r}")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _invalid(f"cannot read recipe {str(source)!r}: {exc}") from None
        data = _parse_text(text)
    elif isinstance(source, str):
        data = _parse_text(source)
    if not isinstance(data, Mapping):
        raise _invalid(f"a recipe is a mapping of fields, got {type(data).__name__}")
    try:
        return Recipe.model_validate(dict(data))
    except ValidationError as exc:
        raise _translate(exc) from None
    except RecursionError:
        raise _invalid("recipe is nested too deeply") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and aliases (no silent overrides, no bombs)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "aliases are not allowed", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                raise yaml.constructor.ConstructorError(
                    None, None, "keys must be scalars", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads 2e9 as a string; accept exponent floats without a dot, as JSON does.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _parse_text(text: str) -> Any:
    if len(text.encode("utf-8", "surrogatepass")) > _MAX_RECIPE_BYTES:
        raise _invalid(f"recipe larger than {_MAX_RECIPE_BYTES} bytes")
    try:
        if text.lstrip().startswith("{"):
            # JSON first, so JSON numbers such as 1e-5 stay numbers; a YAML flow
            # mapping (also starting with "{") falls through to the YAML parser.
            try:
                return json.loads(
                    text, object_pairs_hook=_unique_pairs, parse_constant=_no_constant
                )
            except json.JSONDecodeError:
                pass
        return yaml.load(text, Loader=_StrictLoader)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        first = str(exc).strip().splitlines()
        raise _invalid(f"recipe does not parse: {' '.join(first[:3])}") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _translate(exc: ValidationError) -> InvalidRecipe:
    errors = []
    for err in exc.errors(include_url=False):
        path = _format_loc(err["loc"])
        sub = (err.get("ctx") or {}).get("subpath", "")
        if sub:
            path = f"{path}.{sub}" if path and not sub.startswith("[") else f"{path}{sub}"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        elif err["type"] == "missing":
            message = "required field is missing"
        errors.append({"path": path, "message": message})
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    text = f"{first['path']}: {first['message']}" if first["path"] else first["message"]
    return InvalidRecipe(text + more, path=first["path"], errors=errors)


def _invalid(message: str) -> InvalidRecipe:
    """An error about the whole document (it does not parse, or is not a mapping)."""
    return InvalidRecipe(message, path="", errors=[{"path": "", "message": message}])


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]" or part.startswith(("function-", "literal[", "nullable[")):
            continue  # pydantic's validator tags, not fields
        else:
            out += f".{part}" if out else str(part)
    return out


def _check_unique(values: Any, field: str, *, by_name: bool = False) -> None:
    seen: dict[Any, int] = {}
    for i, v in enumerate(values):
        if v in seen:
            where = f"{field}[{i}].name" if by_name else f"{field}[{i}]"
            raise _fail(where, f"duplicate {v!r} (first at index {seen[v]})")
        seen[v] = i


def _unknown(what: str, name: str, known: Any) -> str:
    names = ", ".join(repr(k) for k in known) or "none"
    return f"unknown {what} {name!r} (declared: {names})"


def _canonical_bucket_key(key: str) -> str:
    m = re.fullmatch(r"(\d+)x(\d+):(\d+)", key)
    if not m or int(m.group(2)) == 0 or int(m.group(3)) == 0:
        return key  # left for the bucket check to name as unknown
    w, h = int(m.group(2)), int(m.group(3))
    g = math.gcd(w, h)
    return f"{int(m.group(1))}x{w // g}:{h // g}"


def _ratio(aspect: str) -> float:
    w, h = aspect.split(":")
    return int(w) / int(h)
