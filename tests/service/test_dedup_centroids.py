"""``POST /v1/dedup/centroids`` (an explicit refit: a new version) and
``GET /v1/dedup/centroids`` over HTTP and through the in-process client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from service.app import create_app
from service.client_local import LocalClient
from service.settings import Settings
from tests.service.support import TestClient, assert_error


@pytest.fixture
def lake(tmp_path: Path) -> VidlakeCatalog:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path))
    rng = np.random.default_rng(0)
    catalog.embeddings("m").add(
        [f"c{i}" for i in range(40)], ["a"] * 40, ["train"] * 40, rng.standard_normal((40, 8))
    )
    return catalog


@pytest.fixture
def client(lake: VidlakeCatalog, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(home=tmp_path), catalog=lake)) as c:
        yield c


def test_fit_makes_a_new_version_each_time_and_list_shows_them(client: TestClient) -> None:
    body = {"embedding_model": "m", "cluster_size": 10}
    first = client.post("/v1/dedup/centroids", json=body)
    assert first.status_code == 201, first.text
    got = first.json()
    assert got["version"] == 1 and got["num_clusters"] == 4 and got["dim"] == 8
    assert got["fitted_on"]["train_vectors"] == 40
    second = client.post("/v1/dedup/centroids", json=body).json()
    assert second["version"] == 2 and second["centroids_sha256"] == got["centroids_sha256"]
    listed = client.get("/v1/dedup/centroids", params=body).json()
    assert [v["version"] for v in listed["data"]] == [1, 2] and listed["count"] == 2
    other = client.get("/v1/dedup/centroids", params={"embedding_model": "m", "num_clusters": 4})
    assert other.json()["count"] == 0  # another config is another family


def test_bad_fit_requests_are_422_and_change_nothing(client: TestClient) -> None:
    both = {"embedding_model": "m", "cluster_size": 10, "num_clusters": 3}
    assert_error(client.post("/v1/dedup/centroids", json=both), 422)
    assert_error(client.post("/v1/dedup/centroids", json={"embedding_model": "m"}), 422)
    empty = client.post("/v1/dedup/centroids", json={"embedding_model": "nope", "num_clusters": 2})
    assert "no train vectors" in assert_error(empty, 422)["message"]
    listed = client.get("/v1/dedup/centroids", params={"embedding_model": "m", "cluster_size": 10})
    assert listed.json()["count"] == 0


def test_the_local_client_fits_and_lists_the_same(client: TestClient, tmp_path: Path) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    local = LocalClient(Settings(home=tmp_path), services=services)
    fitted = local.fit_centroids("m", num_clusters=3)
    assert fitted["version"] == 1 and fitted["num_clusters"] == 3
    assert local.centroids("m", num_clusters=3)["data"] == [fitted]
