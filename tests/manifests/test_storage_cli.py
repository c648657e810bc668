"""``vidlake storage …`` end to end through the CLI, on the embedded catalog."""

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
from materializer.recipe import load_recipe
from service.cli import app
from service.demo.corpus import generate_corpus
from service.settings import get_settings
from tests.fixtures.recipes import small_corpus_demo

pytestmark = pytest.mark.s3

RECIPE = small_corpus_demo()  # a 40-asset corpus: pools smaller than a step's draw


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "home"
    with VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16)) as catalog:
        generate_corpus(catalog, assets=40, seed=3)
        cut_snapshot(catalog, Registry(catalog.objects), load_recipe(RECIPE))
    monkeypatch.setenv("VIDLAKE_HOME", str(root))
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()


def _run(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["storage", *args, "--json"])
    assert result.exit_code == 0, result.output
    out: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def test_cli_inventory_upload_seal_restore_cleanup(
    home: Path, s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    inv = tmp_path / "inv.jsonl"
    listed = _run("inventory", "--snapshot", "1", "--out", str(inv))
    assert listed["entries"] == len(inv.read_text().splitlines()) - 1
    s3 = ["--bucket", s3_bucket, "--prefix", "bk", "--endpoint-url", s3_server]
    rdir = str(tmp_path / "receipts")
    up = _run("upload", str(inv), "--name", "n1", "--workers", "3", "--receipts-dir", rdir, *s3)
    assert up["ok"] and up["uploaded"] == listed["entries"] - up["existing"]
    again = _run("upload", str(inv), "--name", "n1", "--receipts-dir", rdir, *s3)
    assert again["skipped"] == listed["entries"]
    receipts = str(tmp_path / "receipts" / "n1.jsonl")
    sealed = _run(
        "seal", "--inventory", str(inv), "--receipts", receipts, "--out", str(tmp_path / "s"), *s3
    )
    spec = str(tmp_path / "s" / "restore_spec.json")
    assert Path(sealed["local"]) == Path(spec)
    restored = _run("restore", "--restore-spec", spec, "--out", str(tmp_path / "r"))
    assert restored["read_check"]["samples"] > 0  # type: ignore[index]
    latent = json.loads(inv.read_text().splitlines()[-1])["path"]
    verdict = _run(
        "cleanup-check",
        latent,
        "--inventory",
        str(inv),
        "--receipts",
        receipts,
        "--restore-spec",
        spec,
    )
    files = verdict["files"]
    assert isinstance(files, list) and files[0]["path"] == latent


def test_cli_watch_passes_and_status(s3_server: str, s3_bucket: str, tmp_path: Path) -> None:
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "h0.bin").write_bytes(b"h" * 1000)
    (tmp_path / "gpu" / "h0.bin.done").write_text("")
    status_file = tmp_path / "status.json"
    s3 = ["--bucket", s3_bucket, "--prefix", "live", "--endpoint-url", s3_server]
    args = ["watch", str(tmp_path / "gpu"), *s3, "--receipts-dir", str(tmp_path / "r")]
    out = _run(*args, "--status-file", str(status_file), "--passes", "1", "--poll-seconds", "0")
    assert out["files_uploaded"] == 1 and out["backlog_files"] == 0
    assert json.loads(status_file.read_text())["files_done"] == 1
