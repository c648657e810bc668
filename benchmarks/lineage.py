"""Lineage of one sample: ``GET /v1/lineage/clips/{id}``'s work against a DuckDB point query.

Seeds an embedded catalog with ``--clips`` clips (half as many assets) and publishes one
snapshot over every train clip with a ``lineage.arrow`` (the seeding of
``benchmarks/service_load.py``), then, warm (after one call has built the caches),
times ``--queries`` random clips through :func:`service.lineage.clip_lineage`: the
clip, its asset, events, tombstones, scores, captions and latents at the pin, and
every version, manifest row and step that served it.

Baseline, same run: DuckDB reading the clip's row from the same ``clips`` Parquet data
files (``SELECT * FROM read_parquet([...]) WHERE clip_id = ?``, one connection, warm).
Prints one JSON line: ``clips``, ``lineage_ms`` (median), ``lineage_p99_ms``,
``duckdb_ms`` (median), ``ratio`` (``lineage_ms / duckdb_ms``), ``first_ms`` (the
first call: key indexes built), ``seed_s``, ``loadavg_1m``. Goals (issue 16, at 10M
clips): ``lineage_ms`` <= 100 and ``ratio`` <= 2.

Cost: the clip's catalog rows come from cached per-file key indexes (binary search,
one row group read per table), the manifest rows from a cached digest index of
``index.arrow``, and its steps from ``lineage.arrow`` by row: each O(log n) after a
first-use build that is linear in clips. DuckDB's point query prunes row groups by
their min/max statistics, which a random hex key defeats, so it grows linearly with
the file. Default 200k clips (about a minute here); ``--quick``: 50k; the goal's size is
``--clips 10000000``. Above 1M clips the catalog is seeded in bulk
(``benchmarks/bulk_seed.py``: the catalog's schema and row groups, 1M-row appends,
without the ingest checks, which would take longer than the run may); ``--seed``
chooses. The JSON also says ``seed`` and ``clip_row_groups``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _ms(times: list[float], q: float) -> float:
    return round(float(np.quantile(np.array(times) * 1e3, q)), 3)


def run(clips: int, queries: int, home: Path, *, bulk: bool) -> dict[str, Any]:
    import duckdb
    import service_load

    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig
    from manifests.registry import Registry
    from service.lineage import clip_lineage
    from service.snapshot_reader import SnapshotReader
    from service.sql import CatalogViews

    t0 = time.perf_counter()
    seeded = service_load.seed(home, clips, steps=max(16, clips // 256), batch=256, bulk=bulk)
    seed_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    all_ids = seeded["clip_ids"]
    ids = [all_ids[int(i)].as_py() for i in rng.integers(0, len(all_ids), queries)]
    # What the service's dependencies hold (service/deps.py), without the HTTP layer.
    with VidlakeCatalog.open(CatalogConfig.embedded(home)) as catalog:
        views = CatalogViews(catalog)
        reader = SnapshotReader(Registry(catalog.objects), home / "service" / "artifacts")
        pin = catalog.pin()

        def one(clip: str) -> float:
            t = time.perf_counter()
            out = clip_lineage(views, reader, clip, pin=pin, sees_eval=True)
            assert out["clip"]["clip_id"] == clip and out["snapshots"], clip
            return time.perf_counter() - t

        first = one(ids[0])
        ours = [one(c) for c in ids]
    files = [str(p) for p in sorted((home / "warehouse").rglob("*.parquet")) if "/clips/" in str(p)]
    con = duckdb.connect()
    query = "SELECT * FROM read_parquet(?) WHERE clip_id = ?"
    con.execute(query, [files, ids[0]]).fetchall()
    duck = []
    for clip in ids:
        t = time.perf_counter()
        assert con.execute(query, [files, clip]).fetchall(), clip
        duck.append(time.perf_counter() - t)
    return {
        "benchmark": "lineage",
        "clips": clips,
        "queries": queries,
        "lineage_ms": _ms(ours, 0.5),
        "lineage_p99_ms": _ms(ours, 0.99),
        "duckdb_ms": _ms(duck, 0.5),
        "ratio": round(float(np.median(ours) / np.median(duck)), 3),
        "first_ms": round(first * 1e3, 1),
        "clip_files": len(files),
        "clip_row_groups": sum(pq.ParquetFile(f).metadata.num_row_groups for f in files),
        "seed": "bulk" if bulk else "ingest",
        "seed_s": round(seed_s, 1),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="50k clips")
    parser.add_argument("--home", type=Path, default=None, help="keep the catalog here")
    parser.add_argument(
        "--seed",
        choices=("auto", "ingest", "bulk"),
        default="auto",
        help="fill the catalog through its ingest, or bulk (benchmarks/bulk_seed.py); "
        "auto: bulk above 1M clips",
    )
    args = parser.parse_args()
    clips = 50_000 if args.quick else args.clips
    bulk = args.seed == "bulk" or (args.seed == "auto" and clips > 1_000_000)
    if args.home is not None:
        print(json.dumps(run(clips, args.queries, args.home, bulk=bulk)))
        return
    with tempfile.TemporaryDirectory(prefix="vidlake-bench-lineage-") as tmp:
        print(json.dumps(run(clips, args.queries, Path(tmp), bulk=bulk)))


if __name__ == "__main__":
    main()
