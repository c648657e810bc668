"""Backfill coverage: a v2 backfill that has reached 60 % of the candidate clips is
reported per stream and tier, the cut refuses below the recipe's min_coverage with the
numbers, and the drops tell a missing score version from a score below the bound."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import InvalidRecipe
from materializer.coverage import coverage_report
from materializer.cut import build_artifacts
from materializer.dry_run import plan_cut
from materializer.recipe import load_recipe
from tests.service.support import World, build_world, world_recipe


@dataclass
class Case:
    world: World
    candidates: list[str]
    scored: dict[str, float]

    @property
    def catalog(self) -> Any:
        return self.world.catalog

    def stream(self, clip_id: str) -> str:
        return "a" if self.world.train_assets.index(self.world.clips[clip_id]) % 2 else "b"


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    world = build_world(tmp_path_factory.mktemp("coverage"), snapshots=0)
    train = world.train_assets
    # Ten candidate clips: five train assets (two more tombstoned), two clips each.
    world.catalog.add_tombstones(
        [{"asset_id": a, "reason": "dmca", "kind": "soft"} for a in train[-3:-1]]
    )
    candidates = sorted(c for c, a in world.clips.items() if a in train[:5])
    assert len(candidates) == 10
    # The motion@2 backfill has scored 6 of them (60 %), three per stream: two pass
    # min 0.5, one is below it.
    case = Case(world, candidates, {})
    for stream in ("a", "b"):
        mine = [c for c in candidates if case.stream(c) == stream][:3]
        case.scored.update({c: (0.9 if i < 2 else 0.1) for i, c in enumerate(mine)})
    scored = case.scored
    world.catalog.add_scores(
        [
            {"clip_id": c, "filter_name": "motion", "filter_version": "2", "score": s}
            for c, s in scored.items()
        ]
    )
    return case


def _recipe(min_motion: float | None = 0.9, **changes: Any) -> Any:
    data = world_recipe("cov", seed=5)
    data["filters"] = [*data["filters"], {"name": "motion", "version": "2", "min": 0.5}]
    if min_motion is not None:
        data["min_coverage"] = {"scores": {"motion": min_motion}, "captions": 1.0}
    data.update(changes)
    return load_recipe(data)


def test_report_counts_missing_versions_per_stream_and_tier(case: Case) -> None:
    r = coverage_report(case.catalog, _recipe())
    assert r["clips"] == 10 and r["passed"] is False
    reqs = {q["key"]: q for q in r["requirements"]}
    assert list(reqs) == ["score:aesthetic@2", "score:motion@2", "captions@1"]
    motion = reqs["score:motion@2"]
    assert (motion["missing"], motion["coverage"], motion["passed"]) == (4, 0.6, False)
    assert reqs["score:aesthetic@2"]["missing"] == 0 and reqs["score:aesthetic@2"]["passed"]
    captions = reqs["captions@1"]
    assert captions | {"missing": 0, "partial": 0, "min_coverage": 1.0, "passed": True} == captions
    expected: dict[str, list[int]] = {"a": [0, 0], "b": [0, 0]}
    for c in case.candidates:
        expected[case.stream(c)][0] += 1
        expected[case.stream(c)][1] += c not in case.scored
    got = {g["stream"]: [g["clips"], g["missing"]["score:motion@2"]] for g in r["groups"]}
    assert got == expected and {g["tier"] for g in r["groups"]} == {"default"}


def test_cut_refuses_below_min_coverage_with_the_numbers(case: Case, tmp_path: Path) -> None:
    with pytest.raises(InvalidRecipe) as info:
        build_artifacts(case.catalog, _recipe(), tmp_path)
    exc = info.value
    assert exc.details["path"] == "min_coverage.scores.motion"
    assert "4 of 10 candidate clips lack score 'motion' version '2'" in exc.message
    assert "0.6000" in exc.message and "0.9" in exc.message
    assert list(tmp_path.iterdir()) == []


def test_dry_run_reports_the_refusal_and_separates_the_drops(case: Case) -> None:
    plan = plan_cut(case.catalog, _recipe())
    assert plan["publishable"] is False
    assert plan["problems"][0]["path"] == "min_coverage.scores.motion"
    assert plan["drops"]["missing_score:motion@2"] == 4  # one rung: a sample per clip
    assert plan["drops"]["filter:motion"] == 2
    assert plan["backfill"]["requirements"][1]["missing"] == 4


def test_cut_runs_once_the_backfill_crosses_min_coverage(case: Case, tmp_path: Path) -> None:
    _, snapshot = build_artifacts(case.catalog, _recipe(min_motion=0.6), tmp_path)
    assert snapshot["drops"]["missing_score:motion@2"] == 4
    assert snapshot["drops"]["filter:motion"] == 2
    assert snapshot["counts"]["samples"] == 4


def test_min_coverage_names_only_scores_the_recipe_reads() -> None:
    data = world_recipe("cov", seed=5)
    data["min_coverage"] = {"scores": {"motion": 0.5}}
    with pytest.raises(InvalidRecipe, match=r"min_coverage\.scores\.motion"):
        load_recipe(data)
    data["min_coverage"] = {"scores": {"aesthetic": 1.5}}
    with pytest.raises(InvalidRecipe, match="min_coverage"):
        load_recipe(data)


def test_recipes_without_min_coverage_keep_their_sha256() -> None:
    recipe = load_recipe(world_recipe("cov", seed=5))
    assert "min_coverage" not in recipe.to_canonical_json()
    assert "min_coverage" in _recipe().to_canonical_json()
