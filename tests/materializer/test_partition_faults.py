"""Fault injection in a partitioned cut: a partition that raises, or whose worker is
killed, fails the cut with that partition named and publishes nothing; a rerun on a
sound executor publishes the cut the one-process run gives."""

from __future__ import annotations

import hashlib
import os
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import IntegrityError, StorageError, VidlakeError
from catalog.objects.local import LocalObjectStore
from manifests.registry import Registry
from materializer.cut import build_artifacts, cut_snapshot
from materializer.executors import LocalExecutor
from materializer.recipe import Recipe, load_recipe
from materializer.select import Execution
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")


def _raise_on_two(shared: int, task: int) -> int:
    if task == 2:
        raise ValueError("boom in the join")
    return shared + task


def _die_on_one(shared: int, task: int) -> int:
    if task == 1:
        os._exit(9)  # the worker is killed mid-partition: no exception, no result
    return shared + task


def _checksum_on_one(shared: int, task: int) -> int:
    if task == 1:
        raise IntegrityError("data file sha mismatch", path="x.parquet")
    return shared + task


def test_a_partition_that_raises_in_this_process_is_named() -> None:
    with pytest.raises(StorageError, match=r"partition 2 of 4") as err:
        LocalExecutor(1).map(_raise_on_two, 10, [0, 1, 2, 3])
    assert err.value.details["partition"] == 2
    assert "ValueError: boom in the join" in err.value.message


@pytest.mark.slow
def test_a_partition_that_raises_in_a_pool_worker_is_named() -> None:
    with pytest.raises(StorageError, match=r"partition 2 of 3") as err:
        LocalExecutor(2).map(_raise_on_two, 10, [0, 1, 2])
    assert err.value.details["partition"] == 2


@pytest.mark.slow
def test_a_killed_pool_worker_fails_the_map_naming_a_partition() -> None:
    with pytest.raises(StorageError, match=r"partition \d of 3.*worker process") as err:
        LocalExecutor(2).map(_die_on_one, 10, [0, 1, 2])
    assert err.value.details["partitions"] == 3


def test_a_vidlake_error_in_a_partition_keeps_its_class_and_gains_the_partition() -> None:
    with pytest.raises(IntegrityError, match=r"partition 1 of 2: data file sha mismatch") as err:
        LocalExecutor(1).map(_checksum_on_one, 0, [0, 1])
    assert err.value.details == {"path": "x.parquet", "partition": 1, "partitions": 2}


class _FailingExecutor:
    """Runs the real partition functions, but task ``bad`` of the map labelled
    ``stage`` raises instead."""

    def __init__(self, bad: int, stage: str) -> None:
        self.bad, self.stage = bad, stage

    def map(
        self, fn: Callable[[S, T], R], shared: S, tasks: Sequence[T], *, label: str = "partition"
    ) -> list[R]:
        def one(i: int, task: T) -> R:
            if i == self.bad and label == self.stage:
                raise MemoryError("worker out of memory")
            return fn(shared, task)

        return LocalExecutor(1).map(
            lambda s, it: one(*it),  # type: ignore[arg-type]
            shared,
            list(enumerate(tasks)),
            label=label,
        )


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[VidlakeCatalog, Recipe]:
    root = tmp_path_factory.mktemp("lake")
    cat = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16))
    generate_corpus(cat, assets=40, seed=3)
    return cat, load_recipe(small_corpus_demo())


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["asset partition", "partition"])
def test_a_failed_partition_publishes_nothing_and_a_rerun_gives_the_same_bytes(
    lake: tuple[VidlakeCatalog, Recipe], tmp_path: Path, stage: str
) -> None:
    catalog, recipe = lake
    registry = Registry(LocalObjectStore(tmp_path / "registry"))  # a fresh one per stage
    work, scratch, out = tmp_path / "work", tmp_path / "scratch", tmp_path / "one"
    for folder in (work, scratch, out):
        folder.mkdir()
    bad = Execution(executor=_FailingExecutor(1, stage), partitions=3, scratch=str(scratch))  # type: ignore[arg-type]
    with pytest.raises(VidlakeError, match=rf"^{stage} 1 of \d.*MemoryError") as err:
        cut_snapshot(catalog, registry, recipe, execution=bad, workdir=work)
    assert err.value.details["partition"] == 1
    assert registry.versions() == []
    assert list(work.iterdir()) == [] and list(scratch.iterdir()) == []  # no temp left
    good = Execution(executor=LocalExecutor(1), partitions=3, scratch=str(scratch))
    record = cut_snapshot(catalog, registry, recipe, execution=good, workdir=work)
    assert registry.versions() == [record.version] == [1]
    one, _ = build_artifacts(catalog, recipe, out)  # the one-process cut
    for name, ref in record.artifacts.items():
        if name in one:
            assert ref.sha256 == hashlib.sha256(one[name].read_bytes()).hexdigest(), name


def test_a_recipe_pickles_for_pool_and_ray_workers() -> None:
    """A pool worker receives the recipe (the partition's backfill coverage reads it);
    its read-only mappings made every ``local:N`` cut fail at the pool's start."""
    data = small_corpus_demo()
    data["min_coverage"] = {"scores": {data["filters"][0]["name"]: 0.5}}
    recipe = load_recipe(data)
    again = pickle.loads(pickle.dumps(recipe))
    assert again == recipe and again.sha256() == recipe.sha256()


def _slow_pid(shared: float, task: int) -> int:
    time.sleep(shared)  # long enough that both workers take tasks
    return os.getpid()


@pytest.mark.slow  # spawns a pool of 2 twice
def test_a_pool_serves_every_map_inside_with_and_a_broken_one_is_replaced() -> None:
    pool = LocalExecutor(2)
    with pool:
        first = set(pool.map(_slow_pid, 0.3, [0, 1, 2, 3]))
        assert set(pool.map(_slow_pid, 0.3, [0, 1, 2, 3])) == first and len(first) == 2
        with pytest.raises(StorageError, match="worker process died"):
            pool.map(_die_on_one, 10, [0, 1, 2])
        assert pool.map(_raise_on_two, 10, [0, 1]) == [10, 11]  # a fresh pool
    assert pool._pool is None and pool._dir is None  # shut down, its files removed
