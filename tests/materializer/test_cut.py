"""The cut end to end: recipe + pinned catalog → artifacts → registered version."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput, InvalidRecipe
from manifests.format import LINEAGE_NAME, QUALITY_NAME, SNAPSHOT_REQUIRED_KEYS
from manifests.registry import Registry
from materializer.cut import build_artifacts, cut_snapshot
from materializer.recipe import Recipe, load_recipe
from service.demo.corpus import DEMO_EVAL_SALT, generate_corpus
from tests.fixtures.recipes import small_corpus_demo, write_small_corpus_demo

REPO = Path(__file__).resolve().parents[2]
DEMO_RECIPE = REPO / "docs" / "recipes" / "demo.yaml"
DATA_ARTIFACTS = ("manifest.parquet", "plan.arrow", "index.arrow", LINEAGE_NAME, QUALITY_NAME)


@pytest.fixture(
    scope="module",
    params=[
        "embedded",
        # The scale-out path: PostgreSQL catalog, warehouse and objects on S3.
        pytest.param("scale-out", marks=[pytest.mark.postgres, pytest.mark.s3]),
    ],
)
def lake(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[VidlakeCatalog, Path]:
    root = tmp_path_factory.mktemp("lake")
    if request.param == "embedded":
        config = CatalogConfig.embedded(root, eval_salt="00" * 16)
    else:
        import uuid

        from tests.fixtures.s3 import s3_client

        endpoint = request.getfixturevalue("s3_server")
        bucket = f"cut-{uuid.uuid4().hex[:12]}"
        s3_client(endpoint).create_bucket(Bucket=bucket)
        config = CatalogConfig.embedded(
            root,
            eval_salt="00" * 16,
            uri=request.getfixturevalue("postgres_url"),
            namespace=f"cut_{uuid.uuid4().hex[:12]}",
            warehouse=f"s3://{bucket}/warehouse",
            objects=f"s3://{bucket}/objects",
            s3_endpoint_url=endpoint,
            s3_path_style=True,
        )
    (root / "config.json").write_text(config.model_dump_json())
    catalog = VidlakeCatalog.open(config)
    generate_corpus(catalog, assets=150, seed=3)
    return catalog, root


@pytest.fixture()
def recipe() -> Recipe:
    """The demo recipe, opting in to repeats in a step: these corpora are 10-15x
    smaller than the demo's, too small for some pools' per-step quota."""
    return load_recipe(small_corpus_demo())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_ipc(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def test_cut_writes_every_artifact_and_accounts_for_every_candidate(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe, tmp_path: Path
) -> None:
    catalog, _ = lake
    artifacts, snap = build_artifacts(catalog, recipe, tmp_path)
    assert set(artifacts) == set(DATA_ARTIFACTS)
    assert SNAPSHOT_REQUIRED_KEYS - {"version", "parent", "artifacts"} <= set(snap)
    counts = snap["counts"]
    assert counts["samples"] + sum(snap["drops"].values()) == counts["candidates"]
    assert snap["drops"].get("eval", 0) > 0  # the corpus holds eval material
    assert snap["recipe_sha256"] == recipe.sha256()
    assert abs(sum(snap["stream_shares"].values()) - 1.0) < 1e-9
    manifest = pq.read_table(artifacts["manifest.parquet"])
    index = _read_ipc(artifacts["index.arrow"])
    assert manifest.num_rows == index.num_rows == counts["samples"]
    assert index["row"].to_pylist() == list(range(index.num_rows))
    assert manifest["clip_id"].to_pylist() == index["clip_id"].to_pylist()
    # No eval clip, ever.
    eval_clips = set(
        catalog.scan("clips", columns=["clip_id", "split"], include_eval=True)
        .filter(pa.compute.equal(pa.compute.field("split"), "eval"))["clip_id"]
        .to_pylist()
    )
    assert eval_clips and not eval_clips & set(index["clip_id"].to_pylist())


def test_plan_steps_are_bucket_pure_and_respect_phases(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe, tmp_path: Path
) -> None:
    catalog, _ = lake
    artifacts, snap = build_artifacts(catalog, recipe, tmp_path)
    index = _read_ipc(artifacts["index.arrow"])
    manifest = pq.read_table(artifacts["manifest.parquet"])
    plan = _read_ipc(artifacts["plan.arrow"])
    buckets = index["bucket"].to_numpy()
    streams = index["stream"].to_numpy()
    rungs = np.asarray(manifest["rung"].to_pylist())
    names = snap["streams"]
    assert plan["step"].to_pylist() == list(range(snap["num_steps"]))
    for step, phase, bucket, rows in zip(
        plan["step"].to_pylist(),
        plan["phase"].to_pylist(),
        plan["bucket"].to_pylist(),
        plan["rows"].to_pylist(),
        strict=True,
    ):
        spec = recipe.phases[phase]
        rows_a = np.asarray(rows)
        assert len(rows) == spec.global_batch.for_bucket(recipe.buckets.bucket_keys()[bucket])
        assert (buckets[rows_a] == bucket).all(), f"step {step} is not bucket-pure"
        assert (rungs[rows_a] == spec.rung).all()
        assert {names[s] for s in streams[rows_a]} <= set(spec.weights)


def test_lineage_lists_exactly_the_steps_that_serve_each_row(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe, tmp_path: Path
) -> None:
    catalog, _ = lake
    artifacts, _ = build_artifacts(catalog, recipe, tmp_path)
    plan = _read_ipc(artifacts["plan.arrow"])
    expected: dict[int, list[int]] = {}
    for step, rows in zip(plan["step"].to_pylist(), plan["rows"].to_pylist(), strict=True):
        for r in rows:
            expected.setdefault(r, []).append(step)
    lineage = _read_ipc(artifacts[LINEAGE_NAME])
    got = dict(zip(lineage["row"].to_pylist(), lineage["steps"].to_pylist(), strict=True))
    assert {r: s for r, s in got.items() if s} == expected


def test_same_recipe_same_pin_gives_byte_identical_artifacts_across_processes(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe, tmp_path: Path
) -> None:
    catalog, root = lake
    first, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "a"))
    second, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "b"))
    hashes = {name: _sha(first[name]) for name in DATA_ARTIFACTS}
    assert hashes == {name: _sha(second[name]) for name in DATA_ARTIFACTS}
    # A fresh interpreter (other hash seeds, other import order) agrees.
    script = (
        "import hashlib, json, sys\nfrom pathlib import Path\n"
        "from catalog.catalog import VidlakeCatalog\n"
        "from catalog.config import CatalogConfig\n"
        "from materializer.cut import build_artifacts\n"
        "from materializer.recipe import load_recipe\n"
        "config = CatalogConfig.model_validate_json(Path(sys.argv[1], 'config.json').read_text())\n"
        "cat = VidlakeCatalog.open(config)\n"
        "arts, _ = build_artifacts(cat, load_recipe(Path(sys.argv[2])), Path(sys.argv[3]))\n"
        "shas = {k: hashlib.sha256(v.read_bytes()).hexdigest() for k, v in arts.items()}\n"
        "print(json.dumps(shas))\n"
    )
    out = _mkdir(tmp_path / "c")
    recipe_file = write_small_corpus_demo(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", script, str(root), str(recipe_file), str(out)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=240,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == hashes


def test_takedown_excludes_every_clip_of_the_asset_and_leaves_old_versions(
    tmp_path: Path, recipe: Recipe
) -> None:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake", eval_salt="02" * 16))
    generate_corpus(catalog, assets=100, seed=5)
    registry = Registry(catalog.objects)
    v1 = cut_snapshot(catalog, registry, recipe)
    index1 = _read_ipc(Path(registry.artifact_path(1, "index.arrow", tmp_path)))
    asset = index1["asset_id"][0].as_py()
    assert asset in set(index1["asset_id"].to_pylist())
    catalog.add_tombstones([{"asset_id": asset, "reason": "licence revoked", "kind": "soft"}])
    v2 = cut_snapshot(catalog, registry, recipe)
    assert v2.version == 2 and v2.parent == 1
    index2 = _read_ipc(Path(registry.artifact_path(2, "index.arrow", _mkdir(tmp_path / "v2"))))
    assert asset not in set(index2["asset_id"].to_pylist())
    assert v2.snapshot["drops"]["tombstoned"] >= 1
    # Version 1 is immutable: same record, same artifacts.
    again = registry.get(1)
    assert again.snapshot["artifacts"] == v1.snapshot["artifacts"]
    assert registry.diff(1, 2).num_clips_removed >= 1


def test_explicit_pin_replays_an_old_state(tmp_path: Path, recipe: Recipe) -> None:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake", eval_salt="01" * 16))
    generate_corpus(catalog, assets=100, seed=9)
    pin = catalog.pin()
    before, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "before"))
    index = _read_ipc(before["index.arrow"])
    catalog.add_tombstones(
        [{"asset_id": index["asset_id"][0].as_py(), "reason": "test", "kind": "soft"}]
    )
    pinned = load_recipe({**_recipe_dict(recipe), "catalog_pin": pin.to_dict()})
    replay, _ = build_artifacts(catalog, pinned, _mkdir(tmp_path / "replay"))
    latest, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "latest"))
    for name in ("plan.arrow", "index.arrow"):
        assert _sha(replay[name]) == _sha(before[name])
    assert _sha(latest["index.arrow"]) != _sha(before["index.arrow"])


def test_a_recipe_that_selects_nothing_is_refused_and_registers_nothing(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe
) -> None:
    catalog, _ = lake
    data = _recipe_dict(recipe)
    data["filters"] = [{"name": "aesthetic", "version": "2", "min": 1e9}]
    data["phases"] = [{**data["phases"][0]}]
    registry = Registry(catalog.objects)
    before = registry.versions()
    with pytest.raises(InvalidInput, match="selects no samples"):
        cut_snapshot(catalog, registry, load_recipe(data))
    assert registry.versions() == before


def test_a_pool_smaller_than_its_step_quota_is_refused_by_name(
    lake: tuple[VidlakeCatalog, Path], tmp_path: Path
) -> None:
    """Issue 11.4: without the opt-in, a (stream, bucket) pool holding fewer samples
    than a step draws from it fails the cut, named as the recipe names it; nothing is
    written or registered."""
    catalog, _ = lake
    strict = load_recipe(DEMO_RECIPE)
    registry = Registry(catalog.objects)
    before = registry.versions()
    with pytest.raises(InvalidRecipe) as err:
        cut_snapshot(catalog, registry, strict, workdir=tmp_path)
    assert registry.versions() == before
    assert list(tmp_path.iterdir()) == []
    exc = err.value
    phase = strict.phases[0]
    assert exc.details["path"] == "phases[0].allow_repeats_in_step"
    assert exc.details["phase"] == phase.name
    pools = exc.details["pools"]
    streams = {s.name for s in strict.streams}
    keys = set(strict.buckets.bucket_keys())
    assert pools and all(p["stream"] in streams and p["bucket"] in keys for p in pools)
    assert all(p["pool_size"] < p["quota"] for p in pools)
    first = pools[0]
    assert (exc.details["stream"], exc.details["bucket"]) == (first["stream"], first["bucket"])
    assert f"stream {first['stream']!r} has {first['pool_size']} samples" in exc.message
    assert f"bucket {first['bucket']} at rung {phase.rung}" in exc.message
    assert f"draws up to {first['quota']} of them" in exc.message


def test_snapshot_counts_the_repeats_a_phase_allows(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe, tmp_path: Path
) -> None:
    """With the opt-in, snapshot.json counts exactly the samples that repeat a row
    already in their step, per phase and in total."""
    catalog, _ = lake
    artifacts, snap = build_artifacts(catalog, recipe, tmp_path)
    plan = _read_ipc(artifacts["plan.arrow"])
    per_phase = [0] * len(recipe.phases)
    for phase, rows in zip(plan["phase"].to_pylist(), plan["rows"].to_pylist(), strict=True):
        per_phase[phase] += len(rows) - len(set(rows))
    assert [p["repeats_in_step"] for p in snap["phases"]] == per_phase
    assert snap["repeats_in_step"] == sum(per_phase) > 0  # the corpus is small


@pytest.mark.slow
def test_the_demo_recipe_cuts_the_demo_corpus_with_no_repeat(tmp_path: Path) -> None:
    """Issue 11.4: the demo's recipe and corpus (service/demo/run.py) fit: every pool holds
    a step's draw, so the strict recipe cuts and no step holds a sample twice."""
    config = CatalogConfig.embedded(tmp_path / "lake").model_copy(
        update={"eval_salt": DEMO_EVAL_SALT}  # the demo's catalog carves out these assets
    )
    catalog = VidlakeCatalog.open(config)
    generate_corpus(catalog, seed=0)  # the demo's corpus: default size, seed 0
    artifacts, snap = build_artifacts(catalog, load_recipe(DEMO_RECIPE), _mkdir(tmp_path / "a"))
    plan = _read_ipc(artifacts["plan.arrow"])
    assert snap["repeats_in_step"] == 0
    assert all(len(rows) == len(set(rows)) for rows in plan["rows"].to_pylist())


def test_a_phase_whose_stream_has_no_samples_is_a_clear_error(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe, tmp_path: Path
) -> None:
    catalog, _ = lake
    data = _recipe_dict(recipe)
    data["streams"] = [*data["streams"], {"name": "nothing", "where": "source = 'no-such'"}]
    data["streams"].insert(0, data["streams"].pop())  # first match wins: it must not match
    data["phases"][0]["weights"] = {**data["phases"][0]["weights"], "nothing": 0.1}
    with pytest.raises(InvalidInput, match="nothing"):
        build_artifacts(catalog, load_recipe(data), tmp_path)


@pytest.mark.slow
@pytest.mark.s3
def test_four_processes_cutting_at_once_get_distinct_versions_or_a_conflict(
    request: pytest.FixtureRequest,
    lake: tuple[VidlakeCatalog, Path],
    s3_bucket: str,
    s3_server: str,
    tmp_path: Path,
) -> None:
    if request.node.callspec.params["lake"] != "embedded":
        pytest.skip("the race runs once: the registry is on S3 in both lakes")
    _, root = lake
    script = (
        "import json, sys\nfrom pathlib import Path\n"
        "from catalog.catalog import VidlakeCatalog\n"
        "from catalog.config import CatalogConfig\n"
        "from catalog.errors import Conflict\n"
        "from catalog.objects import open_store\n"
        "from manifests.registry import Registry\n"
        "from materializer.cut import cut_snapshot\n"
        "from materializer.recipe import load_recipe\n"
        "config = CatalogConfig.model_validate_json(Path(sys.argv[1], 'config.json').read_text())\n"
        "cat = VidlakeCatalog.open(config)\n"
        "reg = Registry(open_store(sys.argv[3]))\n"
        "try:\n"
        "    rec = cut_snapshot(cat, reg, load_recipe(Path(sys.argv[2])))\n"
        "    print(json.dumps({'version': rec.version}))\n"
        "except Conflict as exc:\n"
        "    print(json.dumps({'conflict': exc.message}))\n"
    )
    url = f"s3://{s3_bucket}/race"
    recipe_file = write_small_corpus_demo(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(root), str(recipe_file), url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(4)
    ]
    outcomes = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr
        outcomes.append(json.loads(stdout.strip().splitlines()[-1]))
    versions = [o["version"] for o in outcomes if "version" in o]
    assert versions and len(versions) == len(set(versions))
    assert len(versions) + sum("conflict" in o for o in outcomes) == 4
    from catalog.objects import open_store

    registry = Registry(open_store(url))
    assert registry.versions() == sorted(versions) == list(range(1, len(versions) + 1))
    shas = {json.dumps(registry.get(v).snapshot["artifacts"], sort_keys=True) for v in versions}
    assert len(shas) == 1  # every winner registered the same bytes


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _recipe_dict(recipe: Recipe) -> dict[str, Any]:
    return json.loads(recipe.to_canonical_json())  # type: ignore[no-any-return]


def test_a_plan_too_large_for_the_disk_is_refused_before_any_work(
    lake: tuple[VidlakeCatalog, Path], recipe: Recipe, tmp_path: Path
) -> None:
    """A trillion steps is a well-formed recipe; its cut wrote GiB of plan a second
    into the work directory until the disk was full (and left it there when killed)."""
    catalog, _ = lake
    data = _recipe_dict(recipe)
    data["phases"][1]["steps"] = 10**12
    registry = Registry(catalog.objects)
    before = registry.versions()
    work = _mkdir(tmp_path / "work")
    with pytest.raises(InvalidRecipe, match="GiB free") as err:
        cut_snapshot(catalog, registry, load_recipe(data), workdir=work)
    assert err.value.details["path"] == "phases[1].steps"
    assert err.value.details["need_bytes"] > err.value.details["free_bytes"]
    assert list(work.iterdir()) == [] and registry.versions() == before
