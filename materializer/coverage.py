"""Backfill coverage: which candidate clips of a recipe lack the score and caption
versions it names, per stream and tier, and the cut's ``min_coverage`` gate.

A *candidate clip* is a train clip at the pin that the recipe's exclusions keep (not
eval, tombstoned, quarantined or a duplicate) and that has a latent at one of its
rungs: what a cut would consider before any score or caption requirement. It belongs
to the first stream whose predicate it matches (clips matching none are left out: a
cut never takes them) and to its tier. For every score the recipe reads (filters and
``scores``, each at its version) a clip *lacks* it when the catalog has no row of that
(name, version) for it; for the captions when it has no caption of the version in any
of the recipe's kinds (``partial``: some kinds but not all). Nothing is dropped here:
the numbers are reported (``vidlake coverage``, ``POST /v1/recipes:coverage``) and the
cut refuses, with them, while a requirement's coverage is below the recipe's
``min_coverage`` (:func:`check_min_coverage`).

Computed from the selection's candidate query, in one DuckDB pass per ``clip_id``
partition (:func:`materializer.partition.query_candidates` calls
:func:`backfill_coverage` on its rows); a clip lives in one partition, so the
partitions' counts add up (:func:`merge_coverage`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from catalog.errors import InvalidRecipe
from materializer.recipe import Recipe
from materializer.recipe.coverage import MinCoverage

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin

__all__ = [
    "BackfillCoverage",
    "CoverageSpec",
    "Requirement",
    "backfill_coverage",
    "check_min_coverage",
    "coverage_report",
    "merge_coverage",
]

#: Drop reasons that come after the candidate stage (a clip dropped for one of these
#: is still a candidate: its scores and captions are what coverage counts).
_LATER_REASONS = (
    "starts_with(drop_reason, 'missing_score:') OR starts_with(drop_reason, 'filter:') "
    "OR drop_reason = 'no_caption'"
)


@dataclass(frozen=True)
class Requirement:
    """One score version, or the caption version, a recipe names."""

    key: str
    kind: str
    name: str
    version: str
    clips: int
    missing: int
    min_coverage: float | None
    partial: int | None = None

    @property
    def coverage(self) -> float:
        """Share of candidate clips that have it (1.0 with no candidates)."""
        return 1.0 - self.missing / self.clips if self.clips else 1.0

    @property
    def passed(self) -> bool:
        """Whether the coverage reaches ``min_coverage`` (always, without one)."""
        return self.min_coverage is None or self.coverage >= self.min_coverage

    def to_dict(self) -> dict[str, Any]:
        found = {k: getattr(self, k) for k in ("key", "kind", "name", "version", "clips")}
        found.update(missing=self.missing, coverage=self.coverage)
        found.update(min_coverage=self.min_coverage, passed=self.passed)
        if self.partial is not None:
            found["partial"] = self.partial
        return found


@dataclass(frozen=True)
class BackfillCoverage:
    """Candidate clips, each requirement's totals, and per (stream, tier) the clips
    and how many lack each requirement (by ``key``)."""

    clips: int
    requirements: list[Requirement]
    groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.requirements)

    def to_dict(self) -> dict[str, Any]:
        return {
            "clips": self.clips,
            "passed": self.passed,
            "requirements": [r.to_dict() for r in self.requirements],
            "groups": self.groups,
        }


def _keys(recipe: Recipe) -> list[tuple[str, str, str, str]]:
    """(key, kind, name, version) of every requirement, scores first (by name)."""
    found = [(f"score:{n}@{v}", "score", n, v) for n, v in recipe.score_versions().items()]
    version = recipe.captions.version
    return [*found, (f"captions@{version}", "captions", "captions", version)]


def _sql(recipe: Recipe) -> str:
    """One row per (stream, tier), then one total row (``total`` = 1): the candidate
    clips and, per requirement, how many lack it (``m<i>``), then ``part``."""
    stream = " ".join(f"WHEN _match_{i} THEN '{s.name}'" for i, s in enumerate(recipe.streams))
    lacks = [f"score_{name} IS NULL" for name in recipe.score_versions()]
    lacks.append("caption_count = 0")
    lacks.append(f"caption_count > 0 AND caption_count < {len(recipe.captions.kinds)}")
    flags = ", ".join(f"({expr}) AS m{i}" for i, expr in enumerate(lacks))
    sums = ", ".join(f"count_if(m{i}) AS m{i}" for i in range(len(lacks)))
    names = ", ".join(f"m{i}" for i in range(len(lacks)))
    # Scores and captions are per clip, so a clip's flags agree across its rungs: one
    # row per (clip, stream, tier) after DISTINCT, and per clip for the total.
    return f"""
WITH c AS (
  SELECT DISTINCT clip_id, tier, CASE {stream} ELSE NULL END AS stream, {flags}
  FROM cand WHERE drop_reason IS NULL OR {_LATER_REASONS}
),
kept AS (SELECT * FROM c WHERE stream IS NOT NULL),
per_clip AS (SELECT DISTINCT clip_id, {names} FROM kept)
SELECT stream, tier, 0 AS total, count(*) AS clips, {sums} FROM kept GROUP BY stream, tier
UNION ALL
SELECT NULL, NULL, 1, count(*), {sums} FROM per_clip
"""


@dataclass(frozen=True)
class CoverageSpec:
    """What coverage needs of a recipe, as plain values that pickle (a partition's
    worker gets this, not the recipe): the query, the requirements, the streams'
    order and each requirement's ``min_coverage``."""

    sql: str
    keys: tuple[tuple[str, str, str, str], ...]
    streams: tuple[str, ...]
    minimums: tuple[float | None, ...]

    @classmethod
    def of(cls, recipe: Recipe) -> CoverageSpec:
        keys = tuple(_keys(recipe))
        mins = recipe.min_coverage
        return cls(
            sql=_sql(recipe),
            keys=keys,
            streams=tuple(s.name for s in recipe.streams),
            minimums=tuple(_minimum(mins, kind, name) for _, kind, name, _ in keys),
        )


def backfill_coverage(spec: Recipe | CoverageSpec, candidates: pa.Table) -> BackfillCoverage:
    """Coverage of a recipe's score and caption versions over the candidate query's
    rows (one partition's, or all of them: :func:`merge_coverage` sums partitions)."""
    spec = spec if isinstance(spec, CoverageSpec) else CoverageSpec.of(spec)
    con = duckdb.connect(":memory:", config={"threads": 2})
    try:
        con.register("cand", candidates)
        rows = con.sql(spec.sql).fetchall()
    finally:
        con.close()
    keys = spec.keys
    groups, clips, missing = [], 0, [0] * (len(keys) + 1)
    for stream, tier, is_total, count, *lacking in rows:
        if is_total:
            clips, missing = int(count), [int(m) for m in lacking]
            continue
        by_key = {k[0]: int(m) for k, m in zip(keys, lacking[:-1], strict=True)}
        groups.append({"stream": stream, "tier": tier, "clips": int(count), "missing": by_key})
    groups.sort(key=lambda g: (spec.streams.index(g["stream"]), g["tier"]))
    requirements = [
        Requirement(
            key=key,
            kind=kind,
            name=name,
            version=version,
            clips=clips,
            missing=missing[i],
            min_coverage=spec.minimums[i],
            partial=missing[-1] if kind == "captions" else None,
        )
        for i, (key, kind, name, version) in enumerate(keys)
    ]
    return BackfillCoverage(clips, requirements, groups)


def merge_coverage(spec: Recipe | CoverageSpec, parts: list[BackfillCoverage]) -> BackfillCoverage:
    """The coverage of disjoint sets of clips (``clip_id`` partitions) as one."""
    if len(parts) == 1:
        return parts[0]
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for part in parts:
        for g in part.groups:
            into = groups.setdefault(
                (g["stream"], g["tier"]),
                {"stream": g["stream"], "tier": g["tier"], "clips": 0, "missing": {}},
            )
            into["clips"] += g["clips"]
            for key, n in g["missing"].items():
                into["missing"][key] = into["missing"].get(key, 0) + n
    spec = spec if isinstance(spec, CoverageSpec) else CoverageSpec.of(spec)
    merged = sorted(groups.values(), key=lambda g: (spec.streams.index(g["stream"]), g["tier"]))
    clips = sum(p.clips for p in parts)
    requirements = [
        replace(
            first,
            clips=clips,
            missing=sum(p.requirements[i].missing for p in parts),
            partial=None
            if first.partial is None
            else sum(p.requirements[i].partial or 0 for p in parts),
        )
        for i, first in enumerate(parts[0].requirements)
    ]
    return BackfillCoverage(clips, requirements, merged)


def _minimum(mins: MinCoverage | None, kind: str, name: str) -> float | None:
    if mins is None:
        return None
    return mins.captions if kind == "captions" else mins.scores.get(name)


def check_min_coverage(recipe: Recipe, found: BackfillCoverage | None) -> None:
    """Refuse a cut while a backfill is below the recipe's ``min_coverage``.

    Raises:
        InvalidRecipe: At ``min_coverage.scores.<name>`` (or ``min_coverage.captions``),
            with every failing requirement's numbers in ``errors`` and the message.
    """
    if found is None:
        return
    failing = [r for r in found.requirements if not r.passed]
    if not failing:
        return
    errors = [
        {
            "path": "min_coverage.captions"
            if r.kind == "captions"
            else f"min_coverage.scores.{r.name}",
            "message": f"{r.missing:,} of {r.clips:,} candidate clips lack {r.kind} "
            f"{r.name!r} version {r.version!r}: coverage {r.coverage:.4f} is below "
            f"min_coverage {r.min_coverage} (finish the backfill, or lower min_coverage)",
            "value": r.min_coverage,
        }
        for r in failing
    ]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    raise InvalidRecipe(
        f"{errors[0]['path']}: {errors[0]['message']}{more}",
        path=errors[0]["path"],
        value=errors[0]["value"],
        known=None,
        errors=errors,
        coverage=found.to_dict(),
    )


def coverage_report(
    catalog: VidlakeCatalog, recipe: Recipe, *, pin: Pin | None = None
) -> dict[str, Any]:
    """Backfill coverage of ``recipe`` at its pin (or ``pin``), with the recipe's name,
    SHA-256 and the resolved pin (``CoveragePublic``); refuses nothing.

    Raises:
        InvalidRecipe: As a cut raises it for the recipe itself (an unknown name).
    """
    from materializer.cut import checked_pin
    from materializer.select import candidate_coverage

    pin = checked_pin(catalog, recipe, pin)
    found = candidate_coverage(catalog, recipe, pin)
    return {
        "name": recipe.name,
        "recipe_sha256": recipe.sha256(),
        "catalog_snapshot_ids": pin.to_dict(),
        **found.to_dict(),
    }
