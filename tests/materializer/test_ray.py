"""The Ray executor: a cut whose partitions run as Ray tasks on a cluster started on
127.0.0.1 has the bytes of the one-process cut. Ray starts in seconds: one test."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from manifests.format import LINEAGE_NAME, QUALITY_NAME
from materializer.cut import build_artifacts
from materializer.executors import open_executor
from materializer.recipe import load_recipe
from materializer.select import Execution
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo

DATA_ARTIFACTS = ("manifest.parquet", "plan.arrow", "index.arrow", LINEAGE_NAME, QUALITY_NAME)

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # Ray's start is ~5-10 s here


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'vidlake[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_tasks_give_the_bytes_of_the_one_process_cut(ray_cluster: Any, tmp_path: Path) -> None:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake", eval_salt="00" * 16))
    generate_corpus(catalog, assets=60, seed=5)
    recipe = load_recipe(small_corpus_demo())
    shas = []
    for name, execution in (
        ("one", None),
        ("ray", Execution(open_executor("auto"), partitions=3)),
    ):
        out = tmp_path / name
        out.mkdir()
        artifacts, snap = build_artifacts(catalog, recipe, out, execution=execution)
        shas.append(
            (
                {n: hashlib.sha256(artifacts[n].read_bytes()).hexdigest() for n in DATA_ARTIFACTS},
                snap,
            )
        )
    assert shas[0] == shas[1]
