"""How fast the filter-drift report and backfill coverage compute; prints one JSON line.

Both run on synthetic in-memory tables (the catalog's scans are measured by
``benchmarks/cut.py`` and ``ingest.py``; this is the instruments' own work):

* ``drift_s``: :func:`service.drift.drift_report` with a threshold (latest score per
  clip and version, slice membership, histograms, quantiles, KS, kill rates per
  source per day) over ``--clips`` clips, each scored at two versions, on an object
  that answers the catalog's ``scan``/``pin``/``reference``;
* ``coverage_s``: :func:`materializer.coverage.backfill_coverage` over ``--clips``
  candidate rows (two scores, captions, two streams, two tiers).

Each is compared with a baseline measured in the same run on the same data: one
DuckDB ``GROUP BY clip_id`` over the score rows (``drift_ratio``) and over the
candidate rows (``coverage_ratio``), the floor of any per-clip aggregation.

    python benchmarks/drift.py --quick        # 100k clips
    python benchmarks/drift.py --clips 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from catalog.reference import ReferenceSlice, derive_salt
from materializer.coverage import backfill_coverage
from materializer.recipe import load_recipe
from service.drift import drift_report

SALT = "ab" * 32


class _Lake:
    """Enough of a catalog for drift_report: scans of in-memory tables."""

    def __init__(self, tables: dict[str, pa.Table], fraction: float) -> None:
        self.tables = tables
        self.reference = ReferenceSlice(fraction, derive_salt(SALT), 0.0, SALT)

    @property
    def catalog(self) -> Any:
        return self

    def pin(self) -> None:
        return None

    def scan(self, name: str, pin: Any = None, columns: Any = None, **_: Any) -> pa.Table:
        return self.tables[name].select(columns)


def _tables(n: int, rng: np.random.Generator) -> dict[str, pa.Table]:
    n_assets = max(1, n // 4)
    asset_ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n_assets)]
    clip_ids = pa.array([f"{i:032x}" for i in range(n)])
    owner = rng.integers(0, n_assets, n)
    days = np.datetime64("2026-11-01T12:00", "us") + rng.integers(0, 30, 2 * n).astype(
        "timedelta64[D]"
    )
    return {
        "assets": pa.table(
            {"asset_id": asset_ids, "source": [f"s{i % 8}" for i in range(n_assets)]}
        ),
        "clips": pa.table({"clip_id": clip_ids, "asset_id": pa.array(asset_ids).take(owner)}),
        "scores": pa.table(
            {
                "clip_id": pa.concat_arrays([clip_ids, clip_ids]),
                "filter_version": ["1"] * n + ["2"] * n,
                "score": np.concatenate([rng.random(n), rng.random(n) + 0.1]),
                "computed_at": pa.array(days).cast(pa.timestamp("us", tz="UTC")),
            }
        ),
    }


def _candidates(n: int, rng: np.random.Generator) -> pa.Table:
    reasons = np.array([None, "missing_score:motion@2", "filter:aesthetic", "no_latent"])
    nan = np.nan
    return pa.table(
        {
            "clip_id": [f"{i:032x}" for i in range(n)],
            "drop_reason": pa.array(reasons[rng.integers(0, 4, n)].tolist(), pa.string()),
            "tier": np.where(rng.random(n) < 0.5, "hq", "default"),
            "_match_0": rng.random(n) < 0.5,
            "_match_1": np.ones(n, dtype=bool),
            "score_aesthetic": pa.array(np.where(rng.random(n) < 0.9, rng.random(n), nan)),
            "score_motion": pa.array(np.where(rng.random(n) < 0.6, rng.random(n), nan)),
            "caption_count": rng.integers(0, 2, n).astype(np.int32),
        }
    )


def _recipe() -> Any:
    return load_recipe(
        {
            "name": "bench", "seed": 1, "tokenizer_version": "vae-v1",
            "filters": [{"name": "aesthetic", "version": "2", "min": 0.5},
                        {"name": "motion", "version": "2", "min": 0.5}],
            "streams": [{"name": "a", "where": "source = 'x'"}, {"name": "b", "where": "TRUE"}],
            "captions": {"version": "1", "kinds": ["dense"]},
            "buckets": {"latent_frames": [12], "aspect_ratios": ["16:9"]},
            "phases": [{"name": "p", "rung": "256p", "weights": {"a": 0.5, "b": 0.5},
                        "steps": 5, "global_batch": 4, "rank_multiple": 1}],
        }
    )  # fmt: skip


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _baseline(table: pa.Table, sql: str) -> float:
    con = duckdb.connect(":memory:", config={"threads": 2})
    con.register("t", table)
    seconds, _ = _timed(lambda: con.sql(sql).fetchall())
    con.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="100k clips")
    args = parser.parse_args()
    n = 100_000 if args.quick else args.clips
    rng = np.random.default_rng(0)
    lake = _Lake(_tables(n, rng), fraction=0.01)
    drift_s, report = _timed(lambda: drift_report(lake, "x", "1", "2", threshold=0.5))
    drift_base = _baseline(
        lake.tables["scores"], "SELECT clip_id, max(score) FROM t GROUP BY clip_id"
    )
    cand = _candidates(n, rng)
    coverage_s, found = _timed(lambda: backfill_coverage(_recipe(), cand))
    coverage_base = _baseline(cand, "SELECT clip_id, count(*) FROM t GROUP BY clip_id")
    print(
        json.dumps(
            {
                "benchmark": "drift",
                "clips": n,
                "drift_s": round(drift_s, 3),
                "drift_baseline_s": round(drift_base, 3),
                "drift_ratio": round(drift_s / drift_base, 2),
                "slice_clips": report["slice"]["clips"],
                "coverage_s": round(coverage_s, 3),
                "coverage_baseline_s": round(coverage_base, 3),
                "coverage_ratio": round(coverage_s / coverage_base, 2),
                "candidate_clips": found.clips,
            }
        )
    )


if __name__ == "__main__":
    main()
