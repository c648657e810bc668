"""The Ray executor: a cut whose partitions run as Ray tasks on a cluster started on
127.0.0.1 has the bytes of the one-process cut; a task that raises or whose worker
dies fails the map naming its partition, and such a cut publishes nothing and reruns
to the same bytes. Ray starts in seconds: one cluster for the module."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import StorageError
from catalog.objects.local import LocalObjectStore
from manifests.format import LINEAGE_NAME, QUALITY_NAME
from manifests.registry import Registry
from materializer.cut import build_artifacts, cut_snapshot
from materializer.executors import RayExecutor, open_executor
from materializer.recipe import Recipe, load_recipe
from materializer.select import Execution
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo

DATA_ARTIFACTS = ("manifest.parquet", "plan.arrow", "index.arrow", LINEAGE_NAME, QUALITY_NAME)

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # Ray's start is ~5-10 s here


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'vidlake[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    # Ray's workers need not import the tests package: ship this module's functions.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[VidlakeCatalog, Recipe]:
    root = tmp_path_factory.mktemp("lake")
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16))
    generate_corpus(catalog, assets=60, seed=5)
    return catalog, load_recipe(small_corpus_demo())


def test_ray_tasks_give_the_bytes_of_the_one_process_cut(
    ray_cluster: Any, lake: tuple[VidlakeCatalog, Recipe], tmp_path: Path
) -> None:
    catalog, recipe = lake
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


def _raise_on_two(shared: int, task: int) -> int:
    if task == 2:
        raise ValueError("boom in the join")
    return shared + task


def _die_on_one(shared: int, task: int) -> int:
    if task == 1:
        os._exit(9)  # the worker process dies: no exception, no result
    return shared + task


def _die_in_partition_one(shared: tuple[Any, Any, bool], item: tuple[int, Any]) -> Any:
    fn, inner, armed = shared
    if armed and item[0] == 1:
        os._exit(9)
    return fn(inner, item[1])


class _DyingOnRay:
    """Ray tasks of the real partition functions; clip partition 1's worker dies."""

    def map(
        self,
        fn: Callable[[Any, Any], Any],
        shared: Any,
        tasks: Sequence[Any],
        *,
        label: str = "partition",
    ) -> list[Any]:
        ray = RayExecutor("auto", max_retries=0)
        armed = label == "partition"
        return ray.map(
            _die_in_partition_one, (fn, shared, armed), list(enumerate(tasks)), label=label
        )


def test_a_ray_task_that_raises_or_dies_fails_the_cut_naming_it(
    ray_cluster: Any, lake: tuple[VidlakeCatalog, Recipe], tmp_path: Path
) -> None:
    with pytest.raises(StorageError, match=r"^partition 2 of 3 .*ValueError: boom") as err:
        RayExecutor("auto").map(_raise_on_two, 10, [0, 1, 2])
    assert err.value.details["partition"] == 2
    with pytest.raises(StorageError, match=r"^partition 1 of 3 .*worker process died"):
        RayExecutor("auto", max_retries=1).map(_die_on_one, 10, [0, 1, 2])
    # A cut whose partition's worker dies: named, nothing published, no scratch left;
    # the rerun publishes the one-process cut's bytes.
    catalog, recipe = lake
    registry = Registry(LocalObjectStore(tmp_path / "registry"))
    work, scratch, out = tmp_path / "work", tmp_path / "scratch", tmp_path / "one"
    for folder in (work, scratch, out):
        folder.mkdir()
    dying = Execution(_DyingOnRay(), partitions=3, scratch=str(scratch))  # type: ignore[arg-type]
    with pytest.raises(StorageError, match=r"^partition 1 of 3 .*worker process died"):
        cut_snapshot(catalog, registry, recipe, execution=dying, workdir=work)
    assert registry.versions() == []
    assert list(work.iterdir()) == [] and list(scratch.iterdir()) == []
    good = Execution(open_executor("auto"), partitions=3, scratch=str(scratch))
    record = cut_snapshot(catalog, registry, recipe, execution=good, workdir=work)
    one, _ = build_artifacts(catalog, recipe, out)
    for name in DATA_ARTIFACTS:
        assert record.artifacts[name].sha256 == hashlib.sha256(one[name].read_bytes()).hexdigest()
