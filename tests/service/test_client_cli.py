"""What a new user saw running the quickstart's own-corpus path by hand: a rerun of a
committed ingest said "ingested 4 rows" (it wrote nothing), and a cut or dry run that
dropped nothing drew an empty "dropped" table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.cli_catalog import _ingest_summary
from service.cli_plan import render_breakdown

REPO = Path(__file__).resolve().parents[2]


def test_a_replayed_ingest_says_nothing_was_written(tmp_path: Path) -> None:
    batch = tmp_path / "assets.parquet"
    row = {
        "asset_id": "1" * 64,
        "uri": "s3://raw/a.mp4",
        "size": 10,
        "source": "stock-a",
        "source_tier": "licensed",
        "license_id": "lic-1",
    }
    pq.write_table(pa.Table.from_pylist([row]), batch)
    argv = [sys.executable, "-c", "from service.cli import main; main()", "ingest", "assets"]
    env = {"VIDLAKE_HOME": str(tmp_path / "lake"), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    env["PYTHONPATH"] = str(REPO)
    runs = [
        subprocess.run(
            [*argv, str(batch), "--idempotency-key", "a-1"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr[-2000:]
    assert runs[0].stderr.startswith("ingested 1 row")
    assert runs[1].stderr.startswith("already ingested: 1 row"), runs[1].stderr
    assert "under key a-1; nothing was written" in " ".join(runs[1].stderr.split())


def test_the_summary_line_of_a_fresh_ingest_keeps_its_rate() -> None:
    line = _ingest_summary({"replayed": False}, "2 rows (0.0 MB) into clips", 2.0, 2, 1000)
    assert line == "ingested 2 rows (0.0 MB) into clips in 2.0 s: 1 rows/s, 0.0 MB/s"


def test_no_drops_print_one_line_not_an_empty_table(capsys: pytest.CaptureFixture[str]) -> None:
    render_breakdown(8, {}, {"samples": 8, "clips": 8, "assets": 4})
    shown = capsys.readouterr().out
    assert "dropped: none" in shown and "reason" not in shown
    render_breakdown(8, {"filter:aesthetic": 2}, {"samples": 6})
    shown = capsys.readouterr().out
    assert "reason" in shown and "filter:aesthetic" in shown


def test_a_cut_without_drops_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli_snapshots import _render_snapshot

    phase: dict[str, Any] = {"name": "p", "targets": {"a": 1.0}, "realized": {"a": 1.0}}
    phase |= {"share_bound": {"a": 0.5}, "unit": "samples"}
    snap: dict[str, Any] = {"version": 1, "parent": None, "num_steps": 4, "counts": {"samples": 8}}
    snap |= {"plan_rows": 8, "phases": [phase], "drops": {}}
    _render_snapshot(snap)
    shown = capsys.readouterr().out
    assert "dropped: none" in shown and "reason" not in shown
    _render_snapshot({**snap, "drops": {"tombstoned": 3}})
    assert "tombstoned" in capsys.readouterr().out


def test_a_patch_says_what_it_skips(capsys: pytest.CaptureFixture[str]) -> None:
    """A patch's ``drops`` are its parent cut's: "dropped: none" alone hid the skip."""
    from service.cli_snapshots import _render_snapshot

    phase: dict[str, Any] = {"name": "p", "targets": {"a": 1.0}, "realized": {"a": 1.0}}
    phase |= {"share_bound": {"a": 0.5}, "unit": "samples"}
    patch: dict[str, Any] = {
        "reason": "bad clip",
        "excluded": {"clip_ids": 1, "asset_ids": 0, "rows": 0},
    }
    patch |= {"skipped_by_stream": {"a": 2}, "skipped_plan_rows_total": 2}
    snap: dict[str, Any] = {"version": 2, "parent": 1, "num_steps": 4, "counts": {"samples": 8}}
    snap |= {"plan_rows": 6, "phases": [phase], "drops": {}, "patch_of": 1, "patch": patch}
    _render_snapshot(snap)
    shown = " ".join(capsys.readouterr().out.split())
    assert "patch of v1 (bad clip): skips 2 plan rows (named: 1 clips" in shown
    assert "per stream: a 2" in shown
