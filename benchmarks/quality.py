"""Benchmark: the plan quality report (materializer.quality.quality_report) alone.

A synthetic plan of ``--rows`` plan rows (global batch ``--batch``, so ``rows /
batch`` steps, two phases) drawn uniformly from a manifest of ``rows / 4`` rows in 5
streams, 16 buckets, 50 sources, ``rows / 40`` assets and 1024 clusters: the report
computes shares over sliding windows, epochs, repeats in a step and three keys'
autocorrelation at 256 lags. The baseline, measured in the same run on the same
arrays, is one ``numpy.sort`` of the flattened plan rows (int64), the cheapest
full pass a report over them could make; ``ratio`` is report / baseline.

Prints one JSON line: per size, plan_rows, best-of-``--repeat`` wall seconds of the
report and of the baseline, and the ratio. ``--quick`` measures 1M rows only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from materializer.quality import PhaseTarget, PlanArrays, quality_report

WEIGHTS = {0: 0.5, 1: 0.2, 2: 0.2, 3: 0.08, 4: 0.02}


def _inputs(rows: int, batch: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    manifest = max(rows // 4, 1)
    steps = rows // batch
    phase = (np.arange(steps) >= steps // 2).astype(np.int64)
    plan = PlanArrays(
        phase=phase,
        offsets=np.arange(steps + 1, dtype=np.int64) * batch,
        rows=rng.integers(0, manifest, steps * batch, dtype=np.int64),
    )
    keys = {
        "source": rng.integers(0, 50, manifest, dtype=np.int64),
        "asset_id": rng.integers(0, max(rows // 40, 1), manifest, dtype=np.int64),
        "cluster": rng.integers(0, 1024, manifest, dtype=np.int64),
    }
    return {
        "plan": plan,
        "stream": rng.choice(5, manifest, p=list(WEIGHTS.values())).astype(np.int64),
        "bucket": rng.integers(0, 16, manifest, dtype=np.int64),
        "tokens": np.full(manifest, 256, dtype=np.int64),
        "keys": keys,
        "phases": [PhaseTarget("a", WEIGHTS), PhaseTarget("b", WEIGHTS)],
        "stream_names": [f"s{i}" for i in range(5)],
        "bucket_names": [f"b{i}" for i in range(16)],
        "global_batch": batch,
    }


def _best(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(rows: int, batch: int, repeat: int) -> dict[str, Any]:
    args = _inputs(rows, batch)
    plan = args.pop("plan")
    report_s = _best(lambda: quality_report(plan, **args), repeat)
    sort_s = _best(lambda: np.sort(plan.rows), repeat)
    return {
        "plan_rows": int(plan.rows.size),
        "report_s": round(report_s, 3),
        "baseline_sort_s": round(sort_s, 3),
        "ratio": round(report_s / sort_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M plan rows only")
    parser.add_argument("--batch", type=int, default=1024, help="global batch (samples)")
    parser.add_argument("--repeat", type=int, default=2)
    opts = parser.parse_args()
    sizes = [1_000_000] if opts.quick else [1_000_000, 10_000_000]
    results = {str(n): measure(n, opts.batch, opts.repeat) for n in sizes}
    print(json.dumps({"benchmark": "quality", "batch": opts.batch, "sizes": results}))


if __name__ == "__main__":
    main()
