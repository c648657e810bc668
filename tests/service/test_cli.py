"""The ``vidlake`` CLI in embedded mode: a real catalog under a temporary home."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.recipes import write_small_corpus_demo

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "docs" / "recipes" / "demo.yaml"


def _vidlake(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"VIDLAKE_HOME": str(home), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig
    from service.demo.corpus import generate_corpus

    root = tmp_path_factory.mktemp("home")
    with VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="03" * 16)) as catalog:
        generate_corpus(catalog, assets=120, seed=1)
    return root


def test_cut_then_list_show_step_sql_and_diff(home: Path, tmp_path: Path) -> None:
    recipe = write_small_corpus_demo(tmp_path)  # 120 assets: opt in to repeats in a step
    cut = _vidlake(home, "cut", str(recipe), "--json")
    assert cut.returncode == 0, cut.stderr
    snap = json.loads(cut.stdout)
    assert snap["version"] == 1 and snap["counts"]["samples"] > 0

    listed = json.loads(_vidlake(home, "snapshots", "--json").stdout)
    assert [s["version"] for s in listed] == [1]

    step = json.loads(_vidlake(home, "step", "1", "0", "--json").stdout)
    assert step["step"] == 0 and step["count"] == len(step["samples"]) > 0

    sql = _vidlake(home, "sql", "SELECT count(*) AS n FROM clips", "--json")
    assert sql.returncode == 0, sql.stderr
    assert json.loads(sql.stdout)["rows"][0][0] > 0

    same = _vidlake(home, "cut", str(recipe), "--json")  # same inputs: the same version
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["version"] == 1
    again = _vidlake(home, "cut", str(recipe), "--new-version", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["version"] == 2
    diff = json.loads(_vidlake(home, "diff", "1", "2").stdout)
    assert diff["num_clips_added"] == diff["num_clips_removed"] == 0  # same pin, same cut


def test_cut_refuses_a_pool_smaller_than_its_step_quota(home: Path) -> None:
    """The demo recipe fits the demo's corpus, not a 120-asset one: some pool holds
    fewer samples than a step draws from it, so the cut exits 2 with one message that
    names the phase, stream, bucket, pool size and quota, and registers nothing."""
    before = json.loads(_vidlake(home, "snapshots", "--json").stdout)
    cut = _vidlake(home, "cut", str(RECIPE), "--json")
    assert cut.returncode == 2
    assert "Traceback" not in cut.stderr
    line = " ".join(cut.stderr.split())  # one message, wrapped to the terminal width
    assert "allow_repeats_in_step" in line
    assert "phases[0] (broad-128p): stream '" in line and " samples in bucket " in line
    assert "draws up to " in line
    assert json.loads(_vidlake(home, "snapshots", "--json").stdout) == before


def test_bad_input_is_one_clean_line_and_exit_2(home: Path, tmp_path: Path) -> None:
    missing = _vidlake(home, "cut", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert "no such file" in missing.stderr and "Traceback" not in missing.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nseed: -1\n")
    invalid = _vidlake(home, "cut", str(bad))
    assert invalid.returncode == 2 and "Traceback" not in invalid.stderr
    assert "seed" in invalid.stderr

    hostile = _vidlake(home, "sql", "COPY clips TO '/tmp/x.csv'")
    assert hostile.returncode == 2 and "Traceback" not in hostile.stderr

    unknown = _vidlake(home, "ingest", "nosuchtable", str(RECIPE))
    assert unknown.returncode == 2 and "unknown table" in unknown.stderr

    for name, content in [("g.parquet", b"\x00garbage"), ("g.arrow", b"ARROW1\x00\x00junk")]:
        (tmp_path / name).write_bytes(content)
        corrupt = _vidlake(home, "ingest", "scores", str(tmp_path / name))
        assert corrupt.returncode == 2 and "Traceback" not in corrupt.stderr, corrupt.stderr
        assert "not a readable" in corrupt.stderr
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe[")
    binary = _vidlake(home, "ingest", "scores", str(tmp_path / "binary.json"))
    assert binary.returncode == 2 and "not valid JSON" in binary.stderr, binary.stderr
    directory = _vidlake(home, "ingest", "scores", str(tmp_path))
    assert directory.returncode == 2 and "not a file" in directory.stderr

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = _vidlake(home, "snapshots", "--url", f"http://127.0.0.1:{port}")
    assert down.returncode == 1 and "Traceback" not in down.stderr, down.stderr
    assert "cannot reach" in down.stderr


def test_validate_checks_the_recipe_against_the_catalog(home: Path, tmp_path: Path) -> None:
    ok = _vidlake(home, "validate", str(RECIPE), "--json")
    assert ok.returncode == 0, ok.stderr
    body = json.loads(ok.stdout)
    assert body["valid"] is True and body["pin"]["embeddings/siglip-demo-v1"] >= 1

    typo = tmp_path / "typo.yaml"
    typo.write_text(
        RECIPE.read_text().replace(
            "embedding_model: siglip-demo-v1", "embedding_model: siglip-demo-vl", 1
        )
    )
    bad = _vidlake(home, "validate", str(typo))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "siglip-demo-vl" in bad.stderr and "siglip-demo-v1" in bad.stderr
