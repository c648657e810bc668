"""The plan quality report over REST, both clients and ``vidlake report``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog.errors import NotFound
from manifests.format import QUALITY_NAME
from materializer.cut import cut_snapshot
from materializer.recipe import load_recipe
from service.app import create_app
from service.client import HttpClient
from service.client_local import LocalClient
from service.quality import load_quality
from tests.service.support import (
    TestClient,
    World,
    assert_error,
    build_world,
    serve,
    world_recipe,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """Two versions published before quality reports (fake cuts), then a real cut."""
    world = build_world(tmp_path_factory.mktemp("world"))
    record = cut_snapshot(world.catalog, world.registry, load_recipe(world_recipe("q", seed=1)))
    world.versions.append(record.version)
    return world


@pytest.fixture(scope="module")
def client(world: World) -> Iterator[TestClient]:
    with TestClient(create_app(world.settings(), catalog=world.catalog)) as c:
        yield c


def test_get_quality_is_the_artifact(client: TestClient, world: World) -> None:
    version = world.versions[-1]
    r = client.get(f"/v1/snapshots/{version}/quality")
    assert r.status_code == 200, r.text
    body = r.json()
    stored = json.loads(world.registry.read_artifact(version, QUALITY_NAME))
    assert body == stored == load_quality(world.registry, version)
    snapshot = world.registry.get(version).snapshot
    for key in ("repeated_in_step", "max_share_deviation", "max_autocorr_beyond_batch"):
        assert body[key] == snapshot["quality"][key]
    assert body["repeated_in_step"] == 0 and body["passed"] is True
    assert [p["name"] for p in body["phases"]] == ["p"]


def test_unknown_and_pre_quality_versions_are_clear_404s(client: TestClient, world: World) -> None:
    assert_error(client.get("/v1/snapshots/999/quality"), 404, "not_found")
    old = world.versions[0]  # published before quality.json existed
    assert load_quality(world.registry, old) is None
    error = assert_error(client.get(f"/v1/snapshots/{old}/quality"), 404, "not_found")
    assert "no plan quality report" in error["message"]
    assert error["details"]["reason"] == "no_quality_report"
    assert_error(client.get("/v1/snapshots/0/quality"), 422)


def test_both_clients_report_what_the_route_answers(client: TestClient, world: World) -> None:
    version = world.versions[-1]
    expected = client.get(f"/v1/snapshots/{version}/quality").json()
    local = LocalClient(world.settings())
    try:
        assert local.report(version) == expected
        with pytest.raises(NotFound, match="no plan quality report"):
            local.report(world.versions[0])
    finally:
        local.close()
    with serve(create_app(world.settings(), catalog=world.catalog)) as url, HttpClient(url) as http:
        assert http.report(version) == expected
        with pytest.raises(NotFound, match="no plan quality report"):
            http.report(world.versions[0])
        with pytest.raises(NotFound):
            http.report(999)


def _vidlake(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"VIDLAKE_HOME": str(home), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


@pytest.mark.slow  # three CLI processes, ~3 s each on a loaded machine
def test_cli_report_json_and_table(world: World) -> None:
    version = str(world.versions[-1])
    shown = _vidlake(world.home, "report", version, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert {"repeated_in_step", "max_share_deviation", "max_autocorr_beyond_batch"} <= set(data)
    table = _vidlake(world.home, "report", version)
    assert table.returncode == 0, table.stderr
    assert "passed: repeated_in_step 0" in table.stdout
    assert "stream shares" in table.stdout and "autocorrelation" in table.stdout
    missing = _vidlake(world.home, "report", str(world.versions[0]))
    assert missing.returncode == 2 and "no plan quality report" in missing.stderr
