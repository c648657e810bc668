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


def _run(*args: str, code: int = 0) -> dict[str, object]:
    result = CliRunner().invoke(app, ["storage", *args, "--json"])
    assert result.exit_code == code, result.output
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
    gate = ["--inventory", str(inv), "--receipts", receipts]
    verdict = _run("cleanup-check", latent, *gate, "--restore-spec", spec)
    files = verdict["files"]
    assert isinstance(files, list) and files[0]["path"] == latent and files[0]["safe"]
    assert verdict["all_safe"] and verdict["not_safe"] == 0
    # NOT SAFE must fail the gate: catalog.db is never in the inventory, and a latent is
    # not sealed when no restore spec is given. --json lists every path with its reasons.
    db = str(home / "catalog.db")
    mixed = _run("cleanup-check", latent, db, *gate, "--restore-spec", spec, code=1)
    by_path = {f["path"]: f for f in mixed["files"]}  # type: ignore[attr-defined]
    assert by_path[latent]["safe"] and not by_path[db]["safe"]
    assert "validated" in by_path[db]["failed"] and by_path[db]["reasons"]["validated"]
    assert mixed["not_safe"] == 1 and mixed["all_safe"] is False
    unsealed = _run("cleanup-check", latent, *gate, code=1)
    assert unsealed["files"][0]["failed"] == ["sealed"]  # type: ignore[index]
    text = CliRunner().invoke(app, ["storage", "cleanup-check", db, *gate])
    assert text.exit_code == 1 and "NOT SAFE" in text.stdout


def test_seal_records_the_endpoint_and_restore_needs_no_environment(
    home: Path, s3_server: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint came from AWS_ENDPOINT_URL only (no --endpoint-url): the spec must
    record it, and a restore from the spec alone must work once the variable is gone."""
    inv = tmp_path / "inv.jsonl"
    _run("inventory", "--snapshot", "1", "--out", str(inv))
    s3 = ["--bucket", s3_bucket, "--prefix", "env"]
    rdir = tmp_path / "receipts"
    _run("upload", str(inv), "--name", "n", "--receipts-dir", str(rdir), *s3)
    receipts = str(rdir / "n.jsonl")
    _run("seal", "--inventory", str(inv), "--receipts", receipts, "--out", str(tmp_path / "s"), *s3)
    spec_file = tmp_path / "s" / "restore_spec.json"
    pointer = json.loads(spec_file.read_text())
    assert pointer["endpoint_url"] == s3_server
    assert pointer["region_name"] == "us-east-1" and pointer["path_style"] is False
    assert not any("secret" in k or "key_id" in k or "token" in k for k in pointer)
    assert "testing" not in spec_file.read_text()  # the fixture's credentials
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    get_settings.cache_clear()
    out = tmp_path / "r"
    restored = _run("restore", "--restore-spec", str(spec_file), "--out", str(out))
    assert restored["read_check"]["samples"] > 0  # type: ignore[index]
    config = json.loads((out / "vidlake.json").read_text())
    assert config["s3_endpoint_url"] == s3_server and config["s3_region"] == "us-east-1"


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


def test_the_connection_record_names_what_boto3_resolved(s3_server: str, s3_bucket: str) -> None:
    """A store opened with no endpoint reaches the one in AWS_ENDPOINT_URL; the record
    (what restore_spec.json keeps) must name it rather than null."""
    from catalog.objects.s3 import S3ObjectStore
    from manifests.storage.seal import connection_record

    plain = connection_record(S3ObjectStore(s3_bucket, "p"))
    assert plain == {"endpoint_url": s3_server, "path_style": False, "region_name": "us-east-1"}
    styled = connection_record(S3ObjectStore(s3_bucket, "p", path_style=True))
    assert styled["path_style"] is True
