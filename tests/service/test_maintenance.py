"""``vidlake maintain`` / ``vidlake gc`` end to end: registered versions survive
maintenance byte for byte, the selection does not depend on file layout, the jobs run
over HTTP and the CLI, and gc deletes only debris (and nothing without --apply)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.maintenance import MaintainOptions
from catalog.pins import Pin
from manifests.registry import Registry, SnapshotRecord
from materializer.cut import cut_snapshot
from materializer.recipe import Recipe, load_recipe
from service.app import create_app
from service.gc import GcOptions, run_gc
from service.maintenance import registered_snapshot_ids, run_maintenance
from service.settings import Settings
from tests.catalog.test_maintenance import small_commits
from tests.fixtures.recipes import small_corpus_demo
from tests.service.support import TestClient, assert_error
from tests.service.test_cli import _vidlake

NOW = MaintainOptions(retention_s=0, orphan_age_s=0)
ARTIFACTS = ("plan.arrow", "index.arrow", "manifest.parquet")


@dataclass
class Lake:
    root: Path
    catalog: VidlakeCatalog
    registry: Registry
    recipe: Recipe
    first: SnapshotRecord


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    from service.demo.corpus import generate_corpus

    root = tmp_path_factory.mktemp("maintain")
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16))
    generate_corpus(catalog, assets=60, seed=5)
    registry = Registry(catalog.objects)
    recipe = load_recipe(small_corpus_demo())
    first = cut_snapshot(catalog, registry, recipe)
    small_commits(catalog, 20)
    return Lake(root, catalog, registry, recipe, first)


def _shas(record: SnapshotRecord) -> dict[str, str]:
    return {name: record.artifacts[name].sha256 for name in ARTIFACTS}


def test_pinned_recut_after_maintenance_is_byte_identical(lake: Lake) -> None:
    before = cut_snapshot(lake.catalog, lake.registry, lake.recipe)
    files = lake.catalog.iceberg_table("scores").scan().plan_files()
    report = run_maintenance(lake.catalog, lake.registry, NOW)
    totals = report["totals"]
    assert totals["data_files_after"] < totals["data_files_before"]
    assert report["tables"]["scores"]["after"]["data_files"] < len(list(files))
    assert report["versions_protected"] >= 2
    # Every snapshot a registered version read is still there.
    for table, ids in registered_snapshot_ids(lake.registry).items():
        assert ids <= set(lake.catalog.snapshot_ids(table)), table
    pinned = Pin.from_dict(lake.first.snapshot["catalog_snapshot_ids"])
    again = cut_snapshot(lake.catalog, lake.registry, lake.recipe, pin=pinned)
    assert _shas(again) == _shas(lake.first)
    # The same rows in compacted files select the same samples.
    compacted = cut_snapshot(lake.catalog, lake.registry, lake.recipe)
    assert compacted.snapshot["catalog_snapshot_ids"] != before.snapshot["catalog_snapshot_ids"]
    assert _shas(compacted) == _shas(before)


@pytest.fixture(scope="module")
def client(lake: Lake) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(home=lake.root), catalog=lake.catalog)) as c:
        yield c


def _poll(client: TestClient, job_id: str, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if body["state"] in ("succeeded", "failed"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.mark.parametrize(
    "body",
    [
        {"retention_s": -1},
        {"retention_s": 1e308},
        {"bogus": 1},
        {"tables": ["nope"]},
        {"target_file_bytes": 5},
    ],
)
def test_bad_maintenance_requests_are_422(client: TestClient, body: dict[str, Any]) -> None:
    assert_error(client.post("/v1/maintenance", json=body), 422)


def test_maintenance_and_gc_jobs_over_http(client: TestClient, lake: Lake) -> None:
    small_commits(lake.catalog, 4, start=50)
    r = client.post("/v1/maintenance", json={"retention_s": 0, "orphan_age_s": 0})
    assert r.status_code == 202 and r.headers["Location"] == f"/v1/jobs/{r.json()['id']}"
    job = _poll(client, r.json()["id"])
    assert job["state"] == "succeeded" and job["kind"] == "maintain", job
    assert job["result"]["tables"]["scores"]["compaction"]["files_removed"] >= 4
    assert_error(client.post("/v1/gc", json={"object_age_s": -5}), 422)
    r = client.post("/v1/gc", json={})
    job = _poll(client, r.json()["id"])
    assert job["state"] == "succeeded" and job["result"]["apply"] is False, job


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_gc_removes_only_debris_and_only_with_apply(lake: Lake, tmp_path: Path) -> None:
    dead = _dead_pid()
    work = tmp_path / "work"
    stale = work / f"vidlake-cut-{dead}-abc"
    live = work / f"vidlake-cut-{os.getpid()}-def"
    for d in (stale, live):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "plan.arrow").write_bytes(b"x" * 100)
        _age(d, 600)
    store_root = Path(lake.catalog.objects.root)  # type: ignore[attr-defined]
    (store_root / ".tmp").mkdir(exist_ok=True)
    tmp_dead = store_root / ".tmp" / f"{dead}-0123"
    tmp_dead.write_bytes(b"half a latent")
    _age(tmp_dead, 600)
    old = lake.catalog.objects.put_bytes(b"an object nothing names").info.sha256
    young = lake.catalog.objects.put_bytes(b"an object just uploaded").info.sha256
    sealed = lake.catalog.objects.put_bytes(b"a catalog file a restore reads").info.sha256
    spec = {"files": {"catalog.db": {"sha256": sealed, "size": 30}}}
    lake.catalog.objects.put_key("restore-specs/test.json", json.dumps(spec).encode())
    for sha in (old, sealed):
        _age(lake.catalog.objects.object_path(sha), 30 * 86400)  # type: ignore[attr-defined]
    options = GcOptions(workdir=str(work), object_age_s=86400)
    dry = run_gc(lake.catalog, lake.registry, options)
    assert dry["cut_dirs"]["count"] == 1 and dry["tmp_files"]["count"] == 1
    assert dry["objects"]["examples"] == [old]
    assert stale.exists() and tmp_dead.exists() and lake.catalog.objects.exists(old)
    done = run_gc(lake.catalog, lake.registry, GcOptions(**{**options.__dict__, "apply": True}))
    assert done["objects"]["count"] == 1 and done["objects"]["young"] >= 1
    assert not stale.exists() and live.exists() and not tmp_dead.exists()
    assert not lake.catalog.objects.exists(old) and lake.catalog.objects.exists(young)
    assert lake.catalog.objects.exists(sealed)
    for version in lake.registry.versions():
        for ref in lake.registry.get(version).artifacts.values():
            assert lake.catalog.objects.exists(ref.sha256)
    latents = lake.catalog.scan("latents", columns=["object_sha256"], include_eval=True)
    for sha in set(latents["object_sha256"].to_pylist()):
        assert lake.catalog.objects.exists(sha)


def test_service_start_removes_dead_process_temp_files(
    lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    stale = tmp_path / f"vidlake-cut-{dead}-zzz"
    stale.mkdir()
    _age(stale, 600)
    store_root = Path(lake.catalog.objects.root)  # type: ignore[attr-defined]
    (store_root / ".tmp").mkdir(exist_ok=True)
    tmp_dead = store_root / ".tmp" / f"{dead}-4567"
    tmp_dead.write_bytes(b"x")
    _age(tmp_dead, 600)
    with TestClient(create_app(Settings(home=lake.root), catalog=lake.catalog)) as c:
        assert c.get("/v1/health").status_code == 200
    assert not stale.exists() and not tmp_dead.exists()


def test_cli_maintain_and_gc(lake: Lake) -> None:
    small_commits(lake.catalog, 3, start=80)
    run = _vidlake(lake.root, "maintain", "--retention-s", "0", "--orphan-age-s", "0", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["tables"]["scores"]["compaction"]["files_removed"] >= 3
    human = _vidlake(lake.root, "gc")
    assert human.returncode == 0, human.stderr
    assert "dry run" in human.stdout
    bad = _vidlake(lake.root, "maintain", "--retention-s", "-1")
    assert bad.returncode == 2 and "retention_s" in bad.stderr
