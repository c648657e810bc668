"""Benchmark: writing the global step plan (materializer.plan.write_plan) alone.

Two shapes of pool, 5 streams (50/20/20/8/2 %) over ``--buckets`` buckets:

* ``large``: ``--candidates`` rows in random (stream, bucket) pools, far larger than
  a step's draw (epoch boundaries are rare; the usual cut);
* ``small``: every (stream, bucket) pool about 1.5x its per-step quota, so an epoch
  ends inside most steps and the deferral of repeated rows runs boundary by boundary
  (its worst case).

Prints one JSON line: per shape, plan_rows, best-of-``--repeat`` CPU seconds
(phase setup, IPC write and SHA-256 included) and plan rows per second. With
``--workers N`` (N > 1) the ``large`` plan is also written per step range on a local
pool of N processes (:mod:`materializer.plan.parallel`): ``parallel`` holds the best
wall seconds of one process and of the pool (pool start-up included), their ratio
``speedup``, and ``identical`` (the two files' bytes are equal).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from materializer.plan import PhaseSpec, Pool, write_plan

WEIGHTS = {0: 0.5, 1: 0.2, 2: 0.2, 3: 0.08, 4: 0.02}


def _large(candidates: int, buckets: int, batch: int, steps: int) -> PhaseSpec:
    rng = np.random.default_rng(0)
    stream = rng.choice(5, candidates, p=list(WEIGHTS.values()))
    pool = Pool(
        row=rng.permutation(candidates),
        stream=stream,
        bucket=rng.integers(0, buckets, candidates),
        tokens=np.full(candidates, 256),
    )
    return PhaseSpec(0, pool, dict.fromkeys(range(buckets), batch), WEIGHTS, num_steps=steps)


def _small(buckets: int, batch: int, steps: int) -> PhaseSpec:
    # Pools proportional to the weights, so a pool's quota is about w_k * batch.
    sizes = [max(2, round(1.5 * w * batch) + 2) for w in WEIGHTS.values()]
    per_bucket = sum(sizes)
    stream = np.tile(np.repeat(np.arange(5), sizes), buckets)
    bucket = np.repeat(np.arange(buckets), per_bucket)
    n = stream.size
    pool = Pool(row=np.arange(n), stream=stream, bucket=bucket, tokens=np.full(n, 256))
    return PhaseSpec(0, pool, dict.fromkeys(range(buckets), batch), WEIGHTS, num_steps=steps)


def _time(spec: PhaseSpec, repeat: int) -> dict[str, Any]:
    best = float("inf")
    with tempfile.TemporaryDirectory(prefix="vidlake-bench-plan-") as tmp:
        for _ in range(repeat):
            start = time.process_time()
            summary = write_plan(Path(tmp) / "plan.arrow", [spec], seed=11)
            best = min(best, time.process_time() - start)
    return {
        "plan_rows": summary.plan_rows,
        "cpu_s": round(best, 3),
        "plan_rows_per_s": round(summary.plan_rows / best),
    }


def _parallel(spec: PhaseSpec, workers: int, repeat: int) -> dict[str, Any]:
    """Best wall seconds of a one-process and a ``workers``-process plan; same bytes?"""
    from materializer.executors import LocalExecutor

    walls: dict[str, float] = {"serial": float("inf"), "pool": float("inf")}
    digests = {}
    with tempfile.TemporaryDirectory(prefix="vidlake-bench-plan-") as tmp:
        for _ in range(repeat):
            for name, executor in (("serial", None), ("pool", LocalExecutor(workers))):
                path = Path(tmp) / f"{name}.arrow"
                start = time.perf_counter()
                write_plan(path, [spec], seed=11, executor=executor, workers=workers)
                walls[name] = min(walls[name], time.perf_counter() - start)
                digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        "workers": workers,
        "serial_wall_s": round(walls["serial"], 3),
        "pool_wall_s": round(walls["pool"], 3),
        "speedup": round(walls["serial"] / walls["pool"], 3),
        "identical": digests["serial"] == digests["pool"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=200_000)
    parser.add_argument("--plan-rows", type=int, default=4_000_000)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="also time a pool of N")
    args = parser.parse_args()
    steps = max(1, args.plan_rows // args.batch)
    result = {
        "candidates": args.candidates,
        "buckets": args.buckets,
        "batch": args.batch,
        "large": _time(_large(args.candidates, args.buckets, args.batch, steps), args.repeat),
        "small": _time(_small(args.buckets, args.batch, steps), args.repeat),
    }
    if args.workers > 1:
        spec = _large(args.candidates, args.buckets, args.batch, steps)
        result["parallel"] = _parallel(spec, args.workers, args.repeat)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
