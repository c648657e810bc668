"""kill -9 at random points of the erase job: a rerun always completes it, and the
completed erasure leaves no marker byte anywhere and every other row intact."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.erase import erasure_id, get_erasure
from tests.catalog.test_erase import NO_HITS, Lake, lake_hits

REPO = Path(__file__).resolve().parents[2]
MIN_KILLS = 30
KILLS_PER_TRIAL = 6


class Zygote:
    def __init__(self, root: Path, asset: str, tmp: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests" / "catalog" / "_erase_zygote.py"),
                str(root / "config.json"),
                asset,
                str(tmp / "stage"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )

    def run(self, delay: float) -> tuple[str, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"run {delay}\n")
        self.proc.stdin.flush()
        outcome, stage = self.proc.stdout.readline().split()
        return outcome, stage

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~80 s on an idle 2-core machine; the margin is for load
def test_kill_9_anywhere_then_rerun_completes_the_erase(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    config = CatalogConfig.embedded(root, eval_salt="00" * 16)
    lake = Lake(root, config)
    (root / "config.json").write_text(config.model_dump_json())
    counts = {n: lake.catalog.scan(n, include_eval=True).num_rows for n in ("assets", "clips")}
    lake.catalog.close()
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine, symlinks=True)
    zygote = Zygote(root, lake.asset, tmp_path)
    rng = random.Random(11)
    kills, trials, stages = 0, 0, set()
    started = time.monotonic()
    try:
        # How long an uninterrupted erase takes once warm (the first run pays for cold
        # imports and caches): kills are drawn over half that span, and each rerun
        # resumes where the last one died, so the kills still walk through the job.
        span = float("inf")
        for _ in range(2):
            shutil.rmtree(root)
            shutil.copytree(pristine, root, symlinks=True)
            begin = time.monotonic()
            outcome, _ = zygote.run(-1)
            assert outcome == "done"
            span = min(span, time.monotonic() - begin)
        while kills < MIN_KILLS:
            shutil.rmtree(root)
            shutil.copytree(pristine, root, symlinks=True)
            trials += 1
            # Up to KILLS_PER_TRIAL kills at random points of successive reruns, then a
            # rerun left alone must finish.
            outcome = "killed"
            for _ in range(KILLS_PER_TRIAL):
                outcome, stage = zygote.run(rng.uniform(0.0, 0.5 * span))
                if outcome != "killed":
                    break
                kills += 1
                stages.add(stage)
            if outcome == "killed":
                outcome, stage = zygote.run(-1)
            assert outcome == "done", f"a rerun after a kill in {stage} failed"
            _check_complete(root, config, lake, counts)
    finally:
        zygote.close()
    # The kills landed all over the job, not only at its start.
    assert len(stages) >= 5, stages
    print(f"{kills} kills over {trials} trials in {time.monotonic() - started:.1f}s: {stages}")


def _check_complete(root: Path, config: CatalogConfig, lake: Lake, counts: dict[str, int]) -> None:
    with VidlakeCatalog.open(config) as catalog:
        record = get_erasure(catalog, erasure_id(lake.asset))
        assert record["state"] == "done"
        # Counted once, however many attempts were killed on the way.
        assert record["tables"]["clips"]["rows_dropped"] == len(lake.clips)
        assert record["tables"]["assets"]["rows_dropped"] == 1
        after = {n: catalog.scan(n, include_eval=True).num_rows for n in ("assets", "clips")}
        assert after == {"assets": counts["assets"] - 1, "clips": counts["clips"] - len(lake.clips)}
    assert lake_hits(lake) == NO_HITS
