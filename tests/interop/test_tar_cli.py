"""``vidlake import tar-shards`` / ``vidlake export tar-shards`` end to end (embedded)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from manifests.registry import Registry
from materializer.cut import cut_snapshot
from service.cli import app
from service.settings import get_settings
from tests.interop._tar_data import make_dataset
from tests.interop.test_tar_import import _recipe


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("VIDLAKE_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    yield tmp_path / "home"
    get_settings.cache_clear()


def _json(output: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads(output)
    return doc


def test_cli_import_verify_and_export(home: Path, tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "ds", per_shard=3)
    runner = CliRunner()
    res = runner.invoke(
        app, ["import", "tar-shards", str(data.root), "--revision", "v000001", "--json"]
    )
    assert res.exit_code == 0, res.output
    first = _json(res.stdout)
    assert first["revision"] == "v000001" and first["imported"] == len(data.v1_ids)
    res = runner.invoke(app, ["import", "tar-shards", str(data.root), "--verify", "--json"])
    assert res.exit_code == 1, res.output  # a shard failed: the gate says so
    second = _json(res.stdout)
    assert second["duplicates"] == len(data.v1_ids) - len(data.excluded)
    verify = second["verify"]
    assert isinstance(verify, dict) and verify["failed"] == [data.shard_sha["train-000000.tar"]]
    # Bad input: one clean error, exit code 2 (through main's handler in real use).
    res = runner.invoke(app, ["import", "tar-shards", str(data.root), "--revision", "nope"])
    assert res.exit_code != 0

    catalog = VidlakeCatalog.open(CatalogConfig.embedded(home))
    version = cut_snapshot(catalog, Registry(catalog.objects), _recipe(steps=4)).version
    catalog.close()
    out = tmp_path / "exported"
    res = runner.invoke(
        app, ["export", "tar-shards", "--snapshot", str(version), "--out", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    report = _json(res.stdout)
    assert (out / "manifest.json").is_file() and report["shards"] != 0
