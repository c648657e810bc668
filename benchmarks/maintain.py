"""Benchmark: ``vidlake maintain`` on a catalog after many small ingest commits.

Builds a small corpus (``generate_corpus``), registers one cut of the demo recipe,
then feeds ``--commits`` one-row score batches (one Iceberg commit, one data file and
one manifest each: a producer feeding daily for years). Measures, on the ``scores``
table, the full-scan planning time (best of ``--repeats``, each on a freshly loaded
table) and the data-file count before and after
:func:`service.maintenance.run_maintenance` (retention and orphan age 0), and re-cuts
the registered version at its pin after maintenance.

Prints one JSON line: commits, files_before, files_after, manifests_before,
manifests_after, planning_s_before, planning_s_after, planning_speedup (goal >= 10),
file_ratio (after / before; goal <= 0.05), recut_identical, ingest_s, maintain_s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _demo_recipe() -> dict[str, Any]:
    """The demo recipe, allowing repeats in a step (a 60-asset corpus is small)."""
    import yaml

    path = Path(__file__).resolve().parents[1] / "docs" / "recipes" / "demo.yaml"
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    data["phases"] = [{**p, "allow_repeats_in_step": True} for p in data["phases"]]
    return data


def _planning_s(catalog: Any, table: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        tbl = catalog.iceberg_table(table)
        started = time.perf_counter()
        list(tbl.scan().plan_files())
        best = min(best, time.perf_counter() - started)
    return best


def _counts(catalog: Any, table: str) -> tuple[int, int]:
    tbl = catalog.iceberg_table(table)
    snap = tbl.current_snapshot()
    return len(list(tbl.scan().plan_files())), len(snap.manifests(io=tbl.io))


def _feed(catalog: Any, commits: int) -> None:
    clips = catalog.scan("clips", columns=["clip_id"])["clip_id"].to_pylist()
    for i in range(commits):
        row = {
            "clip_id": clips[i % len(clips)],
            "filter_name": ("aesthetic", "motion")[i % 2],
            "filter_version": "1",
            "score": float(i),  # distinct rows: an identical batch is a replay
        }
        catalog.add_scores([row])


def run(root: Path, commits: int, repeats: int) -> dict[str, Any]:
    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig
    from catalog.maintenance import MaintainOptions
    from catalog.pins import Pin
    from manifests.registry import Registry
    from materializer.cut import cut_snapshot
    from materializer.recipe import load_recipe
    from service.demo.corpus import generate_corpus
    from service.maintenance import run_maintenance

    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16))
    generate_corpus(catalog, assets=60, seed=5)
    registry = Registry(catalog.objects)
    recipe = load_recipe(_demo_recipe())
    started = time.perf_counter()
    _feed(catalog, commits)
    ingest_s = time.perf_counter() - started
    first = cut_snapshot(catalog, registry, recipe)
    files_before, manifests_before = _counts(catalog, "scores")
    plan_before = _planning_s(catalog, "scores", repeats)
    started = time.perf_counter()
    run_maintenance(catalog, registry, MaintainOptions(retention_s=0, orphan_age_s=0))
    maintain_s = time.perf_counter() - started
    files_after, manifests_after = _counts(catalog, "scores")
    plan_after = _planning_s(catalog, "scores", repeats)
    pin = Pin.from_dict(first.snapshot["catalog_snapshot_ids"])
    again = cut_snapshot(catalog, registry, recipe, pin=pin)
    names = ("plan.arrow", "index.arrow", "manifest.parquet")
    identical = all(again.artifacts[n].sha256 == first.artifacts[n].sha256 for n in names)
    return {
        "commits": commits,
        "files_before": files_before,
        "files_after": files_after,
        "manifests_before": manifests_before,
        "manifests_after": manifests_after,
        "planning_s_before": round(plan_before, 6),
        "planning_s_after": round(plan_after, 6),
        "planning_speedup": round(plan_before / max(plan_after, 1e-9), 2),
        "file_ratio": round(files_after / max(files_before, 1), 5),
        "recut_identical": identical,
        "ingest_s": round(ingest_s, 2),
        "maintain_s": round(maintain_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000, help="Small ingest commits.")
    parser.add_argument("--repeats", type=int, default=3, help="Planning runs (best of).")
    args = parser.parse_args()
    if args.commits < 1 or args.repeats < 1:
        parser.error("--commits and --repeats must be at least 1")
    with tempfile.TemporaryDirectory(prefix="vidlake-bench-maintain-") as tmp:
        print(json.dumps(run(Path(tmp), args.commits, args.repeats)))


if __name__ == "__main__":
    main()
