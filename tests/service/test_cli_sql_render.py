"""``vidlake sql`` in a narrow terminal: cell text is cut, column names never."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from service.cli_render import clip, fit_widths, table_width
from tests.service.test_cli import REPO

HEADERS = ["clip_identifier", "asset_identifier", "caption_text", "aesthetic", "n"]


def test_widths_keep_every_header_and_share_the_rest() -> None:
    cells = [["c" * 64, "a" * 64, "long caption " * 20, "0.5", "1"]]
    widths = fit_widths(HEADERS, cells, 80)
    assert all(w >= len(h) for w, h in zip(widths, HEADERS, strict=True))
    assert table_width(widths) == 80 and widths[3:] == [9, 1]
    assert fit_widths(HEADERS, [["a"] * 5], 80) == [len(h) for h in HEADERS]
    assert fit_widths(HEADERS, cells, 10) == [len(h) for h in HEADERS]  # too narrow
    assert clip("abcdef", 4) == "abc…" and clip("a\nb", 9) == "a b"


def test_a_wide_result_prints_whole_headers_and_cut_cells(tmp_path: Path) -> None:
    query = (
        "SELECT repeat('c', 64) AS clip_identifier, repeat('a', 64) AS asset_identifier, "
        "repeat('long caption ', 20) AS caption_text, 0.5 AS aesthetic, 1 AS n"
    )
    run = subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", "sql", query],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"VIDLAKE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "80"},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = next(line for line in lines if "clip_identifier" in line)
    assert all(f" {h} " in header for h in HEADERS), run.stdout
    assert all(len(line) <= 80 for line in lines), run.stdout
    body = [line for line in lines if "long caption" in line]
    assert len(body) == 1 and body[0].count("…") == 3, run.stdout  # one line per row, cut
