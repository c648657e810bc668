"""A corrupt member of an adopted TAR shard (issue 18, item 5): every rank skips it and
records it, ``tar-shards-verify`` quarantines its sample and exits non-zero, and the
next cut leaves it out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.objects.refs import list_failed_members
from interop.corrupt import quarantine_failed_members
from interop.tar_import import import_tar_shards
from loader.dataset import SnapshotDataset
from manifests.registry import Registry
from materializer.cut import build_artifacts, cut_snapshot
from service.cli import app
from service.settings import get_settings
from tests.interop._tar_data import make_dataset
from tests.interop.test_tar_import import _metadata, _recipe

SALT = "ab" * 16


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("VIDLAKE_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    yield tmp_path / "home"
    get_settings.cache_clear()


def _open(home: Path) -> VidlakeCatalog:
    return VidlakeCatalog.open(CatalogConfig.embedded(home, eval_salt=SALT, eval_fraction=0.0))


def test_ranks_skip_the_corrupt_member_and_verify_quarantines_it(
    home: Path, tmp_path: Path
) -> None:
    data = make_dataset(tmp_path / "ds")
    catalog = _open(home)
    import_tar_shards(catalog, data.root)
    version = cut_snapshot(catalog, Registry(catalog.objects), _recipe(steps=8)).version
    meta = _metadata(catalog)
    bad_clip = meta[str(data.corrupt_id)]["clip_id"]
    served, corrupt = [], 0
    for rank in (0, 1):
        ds = SnapshotDataset(
            catalog.objects.url,
            version,
            rank=rank,
            world_size=2,
            cache_dir=tmp_path / f"cache{rank}",
            cache_budget_bytes=64 << 20,
            prefetch_steps=0,
        )
        with ds:
            batches = list(ds)
            assert [b["step"] for b in batches] == list(range(ds.plan.num_steps))  # no early stop
            served += [c for b in batches for c in b["clip_ids"]]
            corrupt += ds.stats()["corrupt_skipped"]
            assert ds.stats()["corrupt_skipped"] == sum(b["corrupt"] for b in batches)
    assert served and bad_clip not in served and corrupt >= 1
    assert list_failed_members(catalog.objects) == [data.corrupt_sha256]

    # The loader's record becomes catalog state: the sample's asset is quarantined,
    # and the next cut leaves it out.
    result = quarantine_failed_members(catalog)
    assert result["members"] == [data.corrupt_sha256] and result["clips"] == [bad_clip]
    assert result["quarantined"] == 1
    assert quarantine_failed_members(catalog)["quarantined"] == 0  # idempotent
    (tmp_path / "cut").mkdir()
    artifacts, _ = build_artifacts(catalog, _recipe(steps=8), tmp_path / "cut")
    catalog.close()
    with pa.memory_map(str(artifacts["index.arrow"])) as f:
        clip_ids = set(pa.ipc.open_file(f).read_all()["clip_id"].to_pylist())
    assert clip_ids and bad_clip not in clip_ids

    listed = CliRunner().invoke(app, ["import", "corrupt-members", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == {"members": [data.corrupt_sha256]}

    # The CLI gate: any failing shard or recorded member makes it exit 1.
    res = CliRunner().invoke(app, ["import", "tar-shards-verify", "--json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert report["failed"] == [data.shard_sha["train-000000.tar"]] and report["ok"] is False
    assert report["corrupt_members"]["members"] == [data.corrupt_sha256]


def test_verify_of_a_clean_dataset_exits_zero(home: Path, tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "ds", corrupt=False)
    _open(home).close()
    runner = CliRunner()
    res = runner.invoke(app, ["import", "tar-shards", str(data.root), "--verify", "--json"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["import", "tar-shards-verify", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert (
        report["ok"]
        and not report["failed"]
        and sorted(report["verified"]) == sorted(data.shard_sha.values())
    )
