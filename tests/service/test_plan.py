"""POST /v1/recipes:plan, Client.plan and ``vidlake cut --dry-run``: a dry run over
HTTP and in process, publishing nothing; a cut that selects nothing prints the same
breakdown."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from materializer.recipe import load_recipe
from service.app import create_app
from service.client import HttpClient
from service.client_local import LocalClient
from tests.service.support import TestClient, World, assert_error, bearer, serve, world_recipe

REPO = Path(__file__).resolve().parents[2]


def _empty_recipe() -> dict[str, Any]:
    return {
        **world_recipe("empty", seed=1),
        "filters": [{"name": "aesthetic", "version": "2", "min": 1e9}],
    }


def test_plan_reports_and_publishes_nothing(client: TestClient, world: World) -> None:
    before = client.get("/v1/snapshots").json()["count"]
    r = client.post("/v1/recipes:plan", json={"recipe": world_recipe("p", seed=1)})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["publishable"] is True
    assert plan["num_steps"] == 5 and plan["phases"][0]["targets"] == {"a": 0.5, "b": 0.5}
    assert plan["counts"]["samples"] == sum(plan["counts"]["per_stream"].values()) > 0
    assert client.get("/v1/snapshots").json()["count"] == before
    assert client.get("/v1/jobs").json()["count"] == 0


def test_plan_of_an_empty_selection_is_a_200_with_problems(client: TestClient) -> None:
    r = client.post("/v1/recipes:plan", json={"recipe": _empty_recipe()})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["publishable"] is False and plan["drops"]["filter:aesthetic"] > 0
    assert "selects no samples" in plan["problems"][0]["message"]


def test_plan_of_a_typo_is_a_422(client: TestClient) -> None:
    typo = {**world_recipe("t", seed=1), "tokenizer_version": "vae-v9"}
    err = assert_error(
        client.post("/v1/recipes:plan", json={"recipe": typo}), 422, "invalid_recipe"
    )
    assert "vae-v9" in err["message"]


def test_plan_needs_read(authed: TestClient) -> None:
    body = {"recipe": world_recipe("p", seed=1)}
    assert authed.post("/v1/recipes:plan", json=body).status_code == 401
    assert (
        authed.post("/v1/recipes:plan", json=body, headers=bearer("tok-write")).status_code == 403
    )
    assert authed.post("/v1/recipes:plan", json=body, headers=bearer("tok-read")).status_code == 200


@pytest.fixture(scope="module")
def url(world: World) -> Iterator[str]:
    with serve(create_app(world.settings(), catalog=world.catalog)) as base:
        yield base


def test_both_clients_plan_the_same(world: World, url: str) -> None:
    recipe = load_recipe(world_recipe("c", seed=2))
    with HttpClient(url) as remote, LocalClient(world.settings()) as local:
        assert remote.plan(recipe) == local.plan(recipe)


def _vidlake(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "VIDLAKE_HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "COLUMNS": "200",
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


def test_cli_dry_run_then_an_empty_cut_prints_the_breakdown(world: World, tmp_path: Path) -> None:
    good, empty = tmp_path / "good.json", tmp_path / "empty.json"
    good.write_text(json.dumps(world_recipe("g", seed=4)))
    empty.write_text(json.dumps(_empty_recipe()))
    versions = len(list(world.registry.versions()))

    dry = _vidlake(world.home, "cut", str(good), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "nothing published" in dry.stdout and "kept per stream" in dry.stdout
    as_json = json.loads(_vidlake(world.home, "cut", str(good), "--dry-run", "--json").stdout)
    assert as_json["publishable"] is True

    dry_empty = _vidlake(world.home, "cut", str(empty), "--dry-run")
    assert dry_empty.returncode == 2
    assert "filter:aesthetic" in dry_empty.stdout and "a cut would fail" in dry_empty.stderr

    cut = _vidlake(world.home, "cut", str(empty))
    assert cut.returncode == 2
    assert "kept per stream" in cut.stdout and "filter:aesthetic" in cut.stdout
    assert "filter:aesthetic" in cut.stderr  # the error line names the drops too
    assert len(list(world.registry.versions())) == versions
