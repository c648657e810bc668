"""Where a cut runs (executor, partitions) over HTTP and in process: a choice of the
caller or the settings that changes no artifact, no inputs key, and no other cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from catalog.errors import InvalidInput
from service.app import create_app
from service.cuts import cut_execution
from service.settings import Settings
from tests.service.support import World, build_world, serve, world_recipe

RECIPE: dict[str, Any] = world_recipe("partitioned-cut", seed=5)


@pytest.fixture
def cutter(tmp_path: Path) -> Iterator[tuple[str, World]]:
    world = build_world(tmp_path / "world", snapshots=0)
    with serve(create_app(world.settings(), catalog=world.catalog)) as url:
        yield url, world


def _job(url: str, response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 202, response.text
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job: dict[str, Any] = httpx.get(f"{url}/v1/jobs/{response.json()['id']}").json()
        if job["state"] in ("succeeded", "failed"):
            assert job["state"] == "succeeded", job
            return job
        time.sleep(0.05)
    raise AssertionError("the cut job did not finish")


def test_a_partitioned_cut_is_the_same_cut_as_the_plain_one(cutter: tuple[str, World]) -> None:
    url, _ = cutter
    body = {"recipe": RECIPE, "executor": "local:1", "partitions": 3}
    job = _job(url, httpx.post(f"{url}/v1/snapshots", json=body, timeout=60))
    assert job["params"]["partitions"] == 3 and job["params"]["executor"] == "local:1"
    # The inputs key leaves the execution out: the plain cut is answered by that version.
    again = httpx.post(f"{url}/v1/snapshots", json={"recipe": RECIPE}, timeout=60)
    assert again.status_code == 200, again.text
    assert again.json()["version"] == job["result"]["version"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"executor": "spark"}, "executor 'spark'"),
        ({"executor": "ray://elsewhere.example:10001"}, "its own Ray cluster"),
        ({"partitions": 0}, "partitions"),
    ],
)
def test_a_bad_execution_is_refused_and_starts_no_job(
    cutter: tuple[str, World], extra: dict[str, Any], named: str
) -> None:
    url, _ = cutter
    response = httpx.post(f"{url}/v1/snapshots", json={"recipe": RECIPE, **extra}, timeout=60)
    assert 400 <= response.status_code < 500, response.text
    assert named in response.text
    assert httpx.get(f"{url}/v1/jobs").json()["count"] == 0


def test_settings_choose_the_execution_and_a_plain_cut_has_none(tmp_path: Path) -> None:
    plain = Settings(home=tmp_path)
    assert cut_execution(plain) is None
    found = cut_execution(Settings(home=tmp_path, cut_executor="local:2", cut_partitions=8))
    assert found is not None and found.partitions == 8
    assert found.scratch is None  # the system's temp directory
    shared = Settings(home=tmp_path, cut_partitions=8, cut_scratch=tmp_path / "nfs")
    assert (found := cut_execution(shared)) is not None and found.scratch == str(tmp_path / "nfs")
    ray = Settings(home=tmp_path, cut_executor="auto", ray_address="ray://head:10001")
    assert cut_execution(ray, "ray://head:10001") is not None  # its own cluster
    assert cut_execution(plain, "ray://other:10001", any_cluster=True) is not None
    with pytest.raises(InvalidInput, match="own Ray cluster"):
        cut_execution(ray, "ray://other:10001")
