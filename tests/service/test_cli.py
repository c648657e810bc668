"""The ``vidlake`` CLI in embedded mode: a real catalog under a temporary home."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    from catalog.catalog import CatalogConfig, VidlakeCatalog
    from catalog.synthetic import generate_corpus

    root = tmp_path_factory.mktemp("home")
    with VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="03" * 16)) as catalog:
        generate_corpus(catalog, assets=120, seed=1)
    return root


def test_cut_then_list_show_step_sql_and_diff(home: Path) -> None:
    cut = _vidlake(home, "cut", str(RECIPE), "--json")
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

    same = _vidlake(home, "cut", str(RECIPE), "--json")  # same inputs: the same version
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["version"] == 1
    again = _vidlake(home, "cut", str(RECIPE), "--new-version", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["version"] == 2
    diff = json.loads(_vidlake(home, "diff", "1", "2").stdout)
    assert diff["num_clips_added"] == diff["num_clips_removed"] == 0  # same pin, same cut


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
