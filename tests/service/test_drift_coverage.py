"""POST /v1/recipes:coverage, Client.coverage on both clients, and the ``vidlake
coverage`` / ``vidlake drift`` / ``vidlake reference-slice`` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.client import HttpClient
from service.client_local import LocalClient
from service.deps import Services
from tests.service.support import TestClient, World, assert_error, bearer, world_recipe

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backfilled(world: World) -> World:
    """The world with a ``motion`` v1 backfill over every other train clip."""
    clips = world.train_clips[::2]
    world.catalog.add_scores(
        [
            {"clip_id": c, "filter_name": "motion", "filter_version": "1", "score": 1.0}
            for c in clips
        ]
    )
    return world


def _recipe(min_motion: float) -> dict[str, Any]:
    data = world_recipe("cov", seed=1)
    data["scores"] = [{"name": "motion", "version": "1"}]
    data["min_coverage"] = {"scores": {"motion": min_motion}}
    return data


def test_rest_reports_and_refuses_nothing(client: TestClient, backfilled: World) -> None:
    r = client.post("/v1/recipes:coverage", json={"recipe": _recipe(0.99)})
    assert r.status_code == 200, r.text
    body = r.json()
    motion = next(q for q in body["requirements"] if q["key"] == "score:motion@1")
    assert body["passed"] is False and motion["passed"] is False
    assert 0 < motion["missing"] < motion["clips"] == body["clips"]
    assert sum(g["missing"]["score:motion@1"] for g in body["groups"]) >= motion["missing"]
    assert client.get("/v1/snapshots").json()["count"] == len(backfilled.versions)


def test_rest_rejects_a_bad_recipe(client: TestClient) -> None:
    bad = _recipe(0.5)
    bad["scores"] = [{"name": "motion", "version": "9"}]
    assert_error(client.post("/v1/recipes:coverage", json={"recipe": bad}), 422, "invalid_recipe")
    assert_error(client.post("/v1/recipes:coverage", json={"recipe": {}}), 422)


def test_coverage_and_drift_need_read(authed: TestClient) -> None:
    body = {"recipe": _recipe(0.5)}
    assert authed.post("/v1/recipes:coverage", json=body).status_code == 401
    assert authed.get("/v1/drift/aesthetic", params={"a": "1", "b": "2"}).status_code == 401
    write = bearer("tok-write")
    assert authed.post("/v1/recipes:coverage", json=body, headers=write).status_code == 403
    assert authed.get("/v1/reference-slice", headers=write).status_code == 403
    read = bearer("tok-read")
    assert authed.post("/v1/recipes:coverage", json=body, headers=read).status_code == 200


def test_both_clients_answer_the_same(client: TestClient, backfilled: World) -> None:
    remote = HttpClient("http://testserver", http=client)
    services = Services(backfilled.settings(), catalog=backfilled.catalog)
    local = LocalClient(backfilled.settings(), services=services)
    assert remote.coverage(_recipe(0.5)) == local.coverage(_recipe(0.5))
    assert remote.drift("aesthetic", "1", "2") == local.drift("aesthetic", "1", "2")
    assert remote.reference_slice(clips=True) == local.reference_slice(clips=True)
    assert remote.reference_slice()["fraction"] == 0.001  # the default, frozen at creation


def _vidlake(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"VIDLAKE_HOME": str(home), "PATH": "/usr/bin:/bin", "COLUMNS": "200",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300,
    )  # fmt: skip


@pytest.mark.slow  # three CLI processes: ~5 s each, 15-20 s on a loaded machine
def test_cli(backfilled: World, tmp_path: Path) -> None:
    short = tmp_path / "short.json"
    short.write_text(json.dumps(_recipe(0.99)))
    refused = _vidlake(backfilled.home, "coverage", str(short))
    assert refused.returncode == 2, refused.stderr
    assert "below min_coverage" in refused.stdout and "score:motion@1" in refused.stdout
    drift = _vidlake(backfilled.home, "drift", "aesthetic", "1", "2", "--threshold", "4.5")
    assert drift.returncode == 0, drift.stderr
    assert "KS statistic" in drift.stdout and "kill rate by day" in drift.stdout
    missing = _vidlake(backfilled.home, "drift", "aesthetic", "1", "7")
    assert missing.returncode == 2 and "no scores at version '7'" in missing.stderr


def test_dry_run_prints_the_backfill(client: TestClient, backfilled: World) -> None:
    from service.cli_common import out
    from service.cli_plan import render_plan

    plan = client.post("/v1/recipes:plan", json={"recipe": _recipe(0.99)}).json()
    assert plan["publishable"] is False
    assert plan["problems"][0]["path"] == "min_coverage.scores.motion"
    with out.capture() as captured:
        render_plan(plan)
    motion = next(q for q in plan["backfill"]["requirements"] if q["key"] == "score:motion@1")
    missing = motion["clips"] - motion["missing"]
    assert f"backfill score:motion@1: {missing:,} of {motion['clips']:,}" in captured.get()
    assert "captions@1" not in captured.get()  # complete, and no minimum: not worth a line
