"""kill -9 at random points of ``maintain``: the tables always read the same rows, at
the current snapshot and at every kept pin, and a rerun finishes the job (no orphan
file left, few files, few manifests)."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.maintenance.orphans import unreferenced_files
from catalog.pins import Pin
from service.demo.corpus import generate_corpus
from tests.catalog.test_maintenance import small_commits

REPO = Path(__file__).resolve().parents[2]
TRIALS = 6
TABLES = ("scores", "clips", "latents", "assets")


def _rows(catalog: VidlakeCatalog, table: str, pin: Pin | None = None) -> pa.Table:
    t = catalog.scan(table, pin=pin, include_eval=True)
    keys = [c for c in t.column_names if not pa.types.is_nested(t.schema.field(c).type)]
    return t.sort_by([(c, "ascending") for c in keys])


def _child(config: Path, pin: Pin) -> subprocess.Popen[str]:
    keep = [f"{t}={sid}" for t, sid in pin.to_dict().items() if sid is not None and "/" not in t]
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "catalog" / "_maintain_child.py"),
            str(config),
            *keep,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill_9_during_maintain_never_changes_a_read(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    config = CatalogConfig.embedded(root, eval_salt="00" * 16)
    (tmp_path / "config.json").write_text(config.model_dump_json())
    catalog = VidlakeCatalog.open(config)
    generate_corpus(catalog, assets=10, seed=1)
    pin = catalog.pin()
    pinned = {t: _rows(catalog, t, pin) for t in TABLES}
    rng = random.Random(14)
    killed = 0
    for trial in range(TRIALS):
        small_commits(catalog, 6, start=trial * 6)
        expected = {t: _rows(catalog, t) for t in TABLES}
        proc = _child(tmp_path / "config.json", pin)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.5))  # a run takes ~1 s once ready
        proc.kill()
        killed += proc.wait() == -9
        for t in TABLES:
            assert _rows(catalog, t).equals(expected[t]), (trial, t)
            assert _rows(catalog, t, pin).equals(pinned[t]), (trial, t)
    assert killed >= TRIALS // 2, killed
    final = _child(tmp_path / "config.json", pin)
    out, _ = final.communicate(timeout=300)
    assert final.returncode == 0 and out.split() == ["ready", "done"]
    for t in TABLES:
        assert _rows(catalog, t).equals(expected[t]) and _rows(catalog, t, pin).equals(pinned[t])
        leftovers = unreferenced_files(catalog.iceberg_table(t))
        assert leftovers == [], (t, leftovers[:3])
    tbl = catalog.iceberg_table("scores")
    assert len(tbl.current_snapshot().manifests(io=tbl.io)) <= 3  # type: ignore[union-attr]
