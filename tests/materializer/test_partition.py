"""The partitioned cut: artifacts byte-identical for every partition count and executor.

The selection's join runs per ``clip_id`` bucket (:mod:`materializer.partition`) on an
executor (:mod:`materializer.executors`); neither may change a byte of the artifacts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput, InvalidRecipe, StorageError
from manifests.format import LINEAGE_NAME, QUALITY_NAME
from materializer.cut import build_artifacts
from materializer.executors import LocalExecutor, RayExecutor, open_executor, parse_executor
from materializer.partition import (
    ClipShared,
    bucket_bounds,
    bucket_of,
    partition_inputs,
    run_partition,
)
from materializer.recipe import Recipe, load_recipe
from materializer.select import Execution
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo

DATA_ARTIFACTS = ("manifest.parquet", "plan.arrow", "index.arrow", LINEAGE_NAME, QUALITY_NAME)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> VidlakeCatalog:
    root = tmp_path_factory.mktemp("lake")
    cat = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16))
    # Two ingest rounds: several data files per table, so partitions prune some.
    generate_corpus(cat, assets=80, seed=3)
    generate_corpus(cat, assets=70, seed=4)
    # Asset-side exclusions the partitions must see: a takedown and a quarantine.
    status = cat.asset_status().filter(pc.invert(pc.field("quarantined")))
    train = sorted(status.filter(pc.equal(status["split"], "train"))["asset_id"].to_pylist())
    cat.add_tombstones([{"asset_id": train[0], "kind": "soft", "reason": "licence revoked"}])
    at = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
    cat.add_asset_events([{"asset_id": train[1], "event": "quarantined", "at": at}])
    # An eval re-upload of a train asset: the original's clips are eval duplicates.
    original = cat.scan("assets", row_filter=f"asset_id = '{train[2]}'", include_eval=True)
    copy = original.drop_columns(["duplicate_of", "near_duplicates", "ingested_at"])
    copy = copy.set_column(0, "asset_id", pa.array([hashlib.sha256(b"copy").hexdigest()]))
    cat.add_assets(copy.set_column(copy.schema.get_field_index("split"), "split", [["eval"]]))
    return cat


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return load_recipe(small_corpus_demo())


@pytest.fixture(scope="module")
def baseline(
    catalog: VidlakeCatalog, recipe: Recipe, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, str], dict[str, object]]:
    """The one-process cut (no execution given): the bytes every other must equal."""
    shas, snap = _cut(catalog, recipe, tmp_path_factory.mktemp("base"), None)
    drops = set(snap["drops"])  # type: ignore[call-overload]
    assert {"tombstoned", "quarantined", "duplicate_asset", "eval_duplicate_asset", "eval"} <= drops
    return shas, snap


def _cut(
    catalog: VidlakeCatalog, recipe: Recipe, out: Path, execution: Execution | None
) -> tuple[dict[str, str], dict[str, object]]:
    artifacts, snap = build_artifacts(catalog, recipe, out, execution=execution)
    shas = {n: hashlib.sha256(artifacts[n].read_bytes()).hexdigest() for n in DATA_ARTIFACTS}
    assert sorted(p.name for p in out.iterdir()) == sorted(DATA_ARTIFACTS)  # no spill left
    return shas, snap


@pytest.mark.parametrize("partitions", [1, 3, 16])
def test_every_partition_count_gives_the_same_artifact_bytes(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    baseline: tuple[dict[str, str], dict[str, object]],
    tmp_path: Path,
    partitions: int,
) -> None:
    shas, snap = _cut(catalog, recipe, tmp_path, Execution(LocalExecutor(1), partitions))
    assert shas == baseline[0]
    assert snap == baseline[1]  # counts, drops, shares: every fact of snapshot.json


def test_a_recipe_without_embedding_drops_gives_the_same_bytes_partitioned(
    catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    """Without embedding drops the driver has no clip ids (the snapshot counts clips
    by partition and number): the same bytes and snapshot as the one-process cut."""
    doc = small_corpus_demo()
    doc.pop("semantic_dedup")
    doc["exclusions"].pop("eval_near_duplicates")
    plain = load_recipe(doc)
    (tmp_path / "one").mkdir()
    (tmp_path / "p3").mkdir()
    base = _cut(catalog, plain, tmp_path / "one", None)
    assert _cut(catalog, plain, tmp_path / "p3", Execution(LocalExecutor(1), 3)) == base


@pytest.mark.slow  # a spawned pool of 2 imports pyarrow, DuckDB and pyiceberg (~5-10 s)
def test_a_process_pool_gives_the_same_artifact_bytes(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    baseline: tuple[dict[str, str], dict[str, object]],
    tmp_path: Path,
) -> None:
    shas, snap = _cut(catalog, recipe, tmp_path, Execution(open_executor("local:2"), 3))
    assert shas == baseline[0]
    assert snap == baseline[1]


class _Recording:
    """Runs every map in this process and records, for each clip partition, the rows
    of its inputs (read while the cut's scratch shards exist)."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self.shared: list[Any] = []
        self.inputs: list[dict[str, pa.Table]] = []

    def map(
        self,
        fn: Callable[[Any, Any], Any],
        shared: Any,
        tasks: Sequence[Any],
        *,
        label: str = "partition",
    ) -> list[Any]:
        self.labels.append(label)
        self.shared.append(shared)
        if fn is run_partition:
            self.inputs += [partition_inputs(shared, task) for task in tasks]
        return LocalExecutor(1).map(fn, shared, tasks, label=label)


def test_a_clip_partition_receives_its_assets_and_the_eval_sets_only(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    baseline: tuple[dict[str, str], dict[str, object]],
    tmp_path: Path,
) -> None:
    """No worker receives the whole asset side: a clip partition's asset rows are those
    of the assets its clips reference, and what every one receives (the broadcast
    set) is the eval assets and what they duplicate, nothing else of the assets."""
    recording, scratch = _Recording(), tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "out").mkdir()
    execution = Execution(recording, 16, scratch=str(scratch))  # type: ignore[arg-type]
    shas, _ = _cut(catalog, recipe, tmp_path / "out", execution)
    assert shas == baseline[0]
    assert recording.labels == ["asset partition", "partition"]
    assert list(scratch.iterdir()) == []  # the shards are gone with the cut
    shared = recording.shared[1]
    assert isinstance(shared, ClipShared)
    assets = catalog.scan("assets", columns=["asset_id", "split"], include_eval=True)
    evals = set(pc.filter(assets["asset_id"], pc.equal(assets["split"], "eval")).to_pylist())
    assert set(shared.evals.eval_ids.to_pylist()) == evals and len(evals) < assets.num_rows / 4
    assert all(t.num_rows == 0 for t in shared.empty.values())
    assert len(recording.inputs) == 16
    for inputs in recording.inputs:
        referenced = set(inputs["clips"]["asset_id"].to_pylist())
        assert set(inputs["asset_rows"]["asset_id"].to_pylist()) == referenced
        assert inputs["asset_rows"].num_rows == len(referenced) < assets.num_rows / 2
        assert not set(inputs) & {"assets", "tombstones", "asset_events"}


def test_the_driver_receives_only_the_columns_it_reads(
    catalog: VidlakeCatalog, recipe: Recipe, tmp_path: Path
) -> None:
    """Each clip partition keeps its wide rows (captions, latent locations, ids) in a
    file of the cut's scratch and returns only what selection and the plan read; the
    selection's files go when it is closed."""
    from materializer.cut import checked_pin
    from materializer.partition_merge import PART, POS, driver_columns
    from materializer.select import select

    seen: list[Any] = []

    class _Seeing:
        def map(self, fn: Any, shared: Any, tasks: Any, *, label: str = "partition") -> Any:
            results = LocalExecutor(1).map(fn, shared, tasks, label=label)
            seen.extend(results if fn is run_partition else [])
            return results

    execution = Execution(_Seeing(), 3, scratch=str(tmp_path))  # type: ignore[arg-type]
    selection = select(catalog, recipe, checked_pin(catalog, recipe, None), execution=execution)
    allowed = {*driver_columns(recipe), PART, POS, "bucket"}
    assert len(seen) == 3 and all(set(c.kept.column_names) <= allowed for c in seen)
    assert set(selection.samples.column_names) <= allowed
    assert not {"captions", "object_sha256", "member_sha256"} & set(selection.samples.column_names)
    assert selection.parts is not None and len(selection.parts.files) == 3
    assert all(Path(f).is_file() for f in selection.parts.files)
    selection.close()
    assert list(tmp_path.iterdir()) == []


def test_a_selection_that_fails_after_the_partitions_leaves_no_files(
    catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    from materializer.cut import checked_pin
    from materializer.select import select

    doc = small_corpus_demo()
    doc["streams"][0]["where"] = "source_tier = 'no such tier'"
    empty = load_recipe(doc)
    execution = Execution(LocalExecutor(1), 3, scratch=str(tmp_path))
    with pytest.raises(InvalidRecipe, match=r"streams\[0\]\.where"):
        select(catalog, empty, checked_pin(catalog, empty, None), execution=execution)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_clip_map_leaves_no_kept_sample_files(
    catalog: VidlakeCatalog, recipe: Recipe, tmp_path: Path
) -> None:
    """The clip partitions ran (their files are written) and then the map failed: the
    cut fails and the scratch is empty."""

    class _FailsAfter:
        def map(self, fn: Any, shared: Any, tasks: Any, *, label: str = "partition") -> Any:
            results = LocalExecutor(1).map(fn, shared, tasks, label=label)
            if fn is run_partition:
                assert all(Path(c.spill).is_file() for c in results)
                raise StorageError("partition 2 of 3 failed: its worker died")
            return results

    execution = Execution(_FailsAfter(), 3, scratch=str(tmp_path / "scratch"))  # type: ignore[arg-type]
    (tmp_path / "scratch").mkdir()
    (tmp_path / "out").mkdir()
    with pytest.raises(StorageError, match="partition 2 of 3"):
        build_artifacts(catalog, recipe, tmp_path / "out", execution=execution)
    assert list((tmp_path / "scratch").iterdir()) == []


def test_buckets_are_key_ranges_that_cover_every_id_once() -> None:
    rng = np.random.default_rng(0)
    ids = [f"{v:08x}" + "0" * 24 for v in rng.integers(0, 1 << 32, 2000)]
    ids += ["0" * 32, "f" * 32, "55555555" + "0" * 24, "55555556" + "f" * 24]
    for partitions in (1, 2, 3, 7, 16, 1000):
        for clip_id in ids:
            p = bucket_of(clip_id, partitions)
            lo, hi = bucket_bounds(p, partitions)
            assert 0 <= p < partitions
            assert (lo is None or clip_id >= lo) and (hi is None or clip_id < hi)
        bounds = [bucket_bounds(p, partitions) for p in range(partitions)]
        assert bounds[0][0] is None and bounds[-1][1] is None
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def test_executor_specs_parse_and_bad_ones_are_named() -> None:
    assert str(parse_executor(None)) == "local"
    assert parse_executor("local:4").processes == 4
    assert str(parse_executor("ray://10.0.0.5:10001")) == "ray://10.0.0.5:10001"
    assert isinstance(open_executor("auto", ray_address="ray://head:10001"), RayExecutor)
    for bad in ("local:0", "spark", "ray://", "ray://host", "local:x"):
        with pytest.raises(InvalidInput, match="executor"):
            parse_executor(bad)


def test_one_process_pool_runs_in_this_process() -> None:
    pid = LocalExecutor(1).map(_pid, None, [1, 2])
    assert pid == [os.getpid(), os.getpid()]


def _pid(shared: object, task: int) -> int:
    return os.getpid()


@pytest.mark.ray
@pytest.mark.slow  # Ray's client gives up on a closed port after a few seconds
def test_an_unreachable_ray_cluster_is_a_clear_error() -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'vidlake[ray]')")
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray session of another test is open in this process")
    with pytest.raises(StorageError, match="cannot connect to the Ray cluster"):
        RayExecutor("ray://127.0.0.1:1").map(_pid, None, [1])
