"""``POST /v1/erasures`` end to end: the job erases, the API reports it, the service's
own artifact cache keeps no erased byte, and bad requests change nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog.config import CatalogConfig
from catalog.erase import erasure_id
from service.app import create_app
from service.settings import Settings
from tests.catalog.test_erase import NO_HITS, Lake, _markers, scan_files
from tests.service.support import TestClient, assert_error


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    root = tmp_path_factory.mktemp("erase-service")
    return Lake(root, CatalogConfig.embedded(root, eval_salt="00" * 16), tombstone=False)


@pytest.fixture(scope="module")
def client(lake: Lake) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(home=lake.root), catalog=lake.catalog)) as c:
        yield c


def _poll(client: TestClient, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if body["state"] in ("succeeded", "failed"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


def test_bad_requests_are_4xx_and_change_nothing(client: TestClient, lake: Lake) -> None:
    assert_error(client.post("/v1/erasures", json={"asset_id": "nope"}), 422)
    body = assert_error(client.post("/v1/erasures", json={"asset_id": lake.asset}), 422)
    assert "hard tombstone" in body["message"]
    assert_error(client.post("/v1/erasures", json={"asset_id": "ab" * 32, "tombstone": True}), 422)
    assert_error(client.get(f"/v1/erasures/{erasure_id(lake.asset)}"), 404, "not_found")
    assert_error(client.get("/v1/erasures/not-an-id"), 422)
    assert_error(client.get(f"/v1/snapshots/{lake.version}/erasure"), 404, "not_found")
    assert client.get("/v1/erasures").json() == {"data": [], "count": 0}


def test_erase_job_round_trip(client: TestClient, lake: Lake) -> None:
    # The service caches the artifacts it serves: they hold the caption marker now.
    assert client.get(f"/v1/snapshots/{lake.version}/artifacts/index.arrow").status_code == 200
    assert client.get(f"/v1/objects/{lake.pack}").status_code == 200
    r = client.post(
        "/v1/erasures", json={"asset_id": lake.asset, "reason": "dmca", "tombstone": True}
    )
    assert r.status_code == 202, r.text
    job = _poll(client, r.json()["id"])
    assert job["state"] == "succeeded", job
    assert job["kind"] == "erase" and job["result"]["erasure_id"] == erasure_id(lake.asset)
    assert scan_files(lake.root, _markers(lake)) == NO_HITS
    assert_error(client.get(f"/v1/objects/{lake.pack}"), 404, "not_found")
    one = client.get(f"/v1/erasures/{erasure_id(lake.asset)}").json()
    assert one["state"] == "done" and one["reason"] == "dmca"
    assert lake.pack in one["audit"]["objects"]["deleted"]
    assert client.get("/v1/erasures").json()["count"] == 1
    listed = {s["version"]: s for s in client.get("/v1/snapshots").json()["data"]}
    assert listed[lake.version]["contains_erased_data"] is True
    assert listed[lake.version]["erasure_ids"] == [erasure_id(lake.asset)]
    mark = client.get(f"/v1/snapshots/{lake.version}/erasure").json()
    assert mark["erasure_id"] == erasure_id(lake.asset) and mark["erased_rows"]
    served = client.get(f"/v1/snapshots/{lake.version}/artifacts/index.arrow")
    assert served.status_code == 200
    assert served.headers["x-vidlake-sha256"] == mark["artifacts"]["index.arrow"]["sha256"]
    # A second request is the same erasure: it finishes at once with the same record.
    again = _poll(client, client.post("/v1/erasures", json={"asset_id": lake.asset}).json()["id"])
    assert again["result"] == job["result"]


def test_the_loader_reads_an_erased_version_over_http(lake: Lake, tmp_path: Path) -> None:
    from loader.source import HttpSource
    from tests.service.support import serve

    settings = Settings(home=lake.root)
    with serve(create_app(settings, catalog=lake.catalog)) as url:
        from loader.plan import open_plan

        plan = open_plan(HttpSource(url), lake.version, tmp_path / "node")
        mark = lake.registry.get(lake.version).erasures[-1]
        assert plan.erased_rows.tolist() == mark.erased_rows
        assert plan.index_sha256 == mark.artifacts["index.arrow"].sha256
