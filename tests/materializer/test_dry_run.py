"""materializer.dry_run: a dry run reports what the cut then publishes, and publishes
nothing; a recipe that selects nothing is reported, and its cut's error carries the
same breakdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from catalog.errors import InvalidInput, InvalidRecipe
from materializer.cut import cut_snapshot
from materializer.dry_run import plan_cut
from materializer.recipe import load_recipe
from tests.service.support import World, build_world, world_recipe


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("world"), snapshots=0)


def _recipe(**changes: Any) -> Any:
    data = world_recipe("dry", seed=3)
    data.update(changes)
    return load_recipe(data)


def test_dry_run_reports_what_the_cut_records_and_publishes_nothing(
    world: World, tmp_path: Path
) -> None:
    recipe = _recipe()
    before = list(world.registry.versions())
    plan = plan_cut(world.catalog, recipe, workdir=tmp_path)
    assert list(world.registry.versions()) == before
    assert list(tmp_path.iterdir()) == []  # the temp plan is gone
    assert plan["publishable"] is True and plan["problems"] == []

    record = cut_snapshot(world.catalog, world.registry, recipe, workdir=tmp_path)
    snap = record.snapshot
    assert plan["catalog_snapshot_ids"] == snap["catalog_snapshot_ids"]
    assert plan["candidates"] == snap["counts"]["candidates"]
    assert plan["drops"] == snap["drops"]
    assert plan["counts"]["samples"] == snap["counts"]["samples"]
    assert plan["counts"]["per_stream"] == snap["counts"]["samples_per_stream"]
    assert sum(plan["counts"]["per_tier"].values()) == snap["counts"]["samples"]
    assert plan["counts"]["per_bucket"] == {"12x16:9": snap["counts"]["samples"]}
    assert plan["phases"] == snap["phases"]
    assert plan["num_steps"] == snap["num_steps"] == 5
    assert plan["stream_shares"] == snap["stream_shares"]
    assert set(plan["coverage"]) == {"a", "b"}
    assert all(0.0 < c <= 1.0 for c in plan["coverage"].values())


def test_selecting_nothing_is_reported_with_its_drops(world: World) -> None:
    recipe = _recipe(filters=[{"name": "aesthetic", "version": "2", "min": 1e9}])
    plan = plan_cut(world.catalog, recipe)
    assert plan["publishable"] is False
    assert plan["counts"]["samples"] == 0
    assert plan["drops"]["filter:aesthetic"] > 0
    assert sum(plan["drops"].values()) == plan["candidates"]
    (problem,) = plan["problems"]
    assert "selects no samples" in problem["message"]
    assert "filter:aesthetic" in problem["message"]


def test_a_cut_that_selects_nothing_names_its_drops(world: World) -> None:
    recipe = _recipe(filters=[{"name": "aesthetic", "version": "2", "min": 1e9}])
    with pytest.raises(InvalidInput) as caught:
        cut_snapshot(world.catalog, world.registry, recipe)
    exc = caught.value
    assert "filter:aesthetic" in exc.message and "candidate samples" in exc.message
    assert exc.details["breakdown"]["per_stream"] == {"a": 0, "b": 0}


def test_a_plan_that_cannot_be_drawn_is_a_problem_not_an_error(world: World) -> None:
    phase = {**world_recipe("x", seed=0)["phases"][0], "global_batch": 64}
    plan = plan_cut(world.catalog, _recipe(phases=[phase]))
    assert plan["publishable"] is False
    (problem,) = plan["problems"]
    assert problem["path"] == "phases[0].allow_repeats_in_step"
    assert plan["counts"]["samples"] > 0  # the selection is still reported


def test_recipe_errors_are_raised_as_the_cut_raises_them(world: World) -> None:
    recipe = _recipe(filters=[{"name": "aesthetic", "version": "9", "min": 0.0}])
    with pytest.raises(InvalidRecipe) as caught:
        plan_cut(world.catalog, recipe)
    assert "9" in caught.value.message
