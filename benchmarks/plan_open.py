"""Plan access on one node: memory-mapped ranks against ranks that each load the plan.

Publishes a synthetic snapshot whose plan holds ``--rows`` rows (global batch
``--batch``) into a local store, lets one process download it into the node's cache
directory, then starts ``--ranks`` processes at once. Each opens the plan with
``open_plan`` (the files are there: the open is a map), reads ``--steps`` consecutive
steps of its rank slice, computes ``allowed_world_sizes()``, and reports its open time
and VmRSS growth. The baseline: the same number of processes each calling
``pyarrow.parquet.read_table`` on the same plan written as Parquet (run two at a time,
so that a full-size run fits in memory; growth is per process either way).

Prints one JSON line::

    {"plan_rows", "ranks", "batch", "plan_mb", "open_ms", "open_ms_max", "open_cpu_ms",
     "rss_growth_mb_per_rank", "rss_anon_growth_mb_per_rank",
     "baseline_rss_growth_mb_per_rank", "rss_ratio", "baseline_ranks",
     "baseline_read_s", "download_s", "loadavg_1m"}

``open_ms`` is wall time from the barrier, so with more ranks than cores it includes
waiting for a CPU; ``open_cpu_ms`` (the rank's own CPU time for the open) is the
open's cost without that wait.

Goals: ``rss_ratio`` ≤ 0.02 and ``open_ms`` ≤ 10 at full size (``--full``: 100M plan
rows, 8 ranks). The default (10M rows, 4 ranks) runs in about a minute on 2 cores.
VmRSS counts the mapped file pages a rank has touched; the kernel maps them in folios
of up to 2 MiB, so an mmap rank's growth is a few MiB whatever the plan's size, and
those pages are shared page cache (``rss_anon_growth_mb_per_rank`` is the private
part). The baseline's growth is private memory and grows with the plan.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _mapped_rank(
    url: str, cache: str, rank: int, ranks: int, steps: int, start: int, barrier: Any
) -> dict[str, float]:
    from loader.plan import open_plan

    barrier.wait()
    before, anon_before = _rss_mb(), _rss_mb("RssAnon")
    t0, cpu0 = time.perf_counter(), time.process_time()
    plan = open_plan(url, 1, cache)
    open_ms = (time.perf_counter() - t0) * 1000
    open_cpu_ms = (time.process_time() - cpu0) * 1000
    total = 0
    for step in range(start, min(start + steps, plan.num_steps)):
        total += int(plan.rows(step, rank, ranks)[0])
    plan.allowed_world_sizes()
    growth, anon = _rss_mb() - before, _rss_mb("RssAnon") - anon_before
    plan.close()
    return {
        "open_ms": open_ms,
        "open_cpu_ms": open_cpu_ms,
        "rss_growth_mb": growth,
        "anon_mb": anon,
        "checksum": total,
    }


def _parquet_rank(path: str) -> dict[str, float]:
    before = _rss_mb()
    t0 = time.perf_counter()
    table = pq.read_table(path)
    elapsed = time.perf_counter() - t0
    growth = _rss_mb() - before
    del table
    return {"read_s": elapsed, "rss_growth_mb": growth}


def _to_parquet(arrow_path: Path, parquet_path: Path) -> None:
    from manifests.ipc import open_mapped

    with (
        open_mapped(arrow_path) as plan,
        pq.ParquetWriter(str(parquet_path), plan.schema) as writer,
    ):
        for b in range(plan.num_batches):
            writer.write_batch(plan.batch(b))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="plan rows")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1024, help="global batch per step")
    parser.add_argument("--steps", type=int, default=100, help="steps each rank reads")
    parser.add_argument("--full", action="store_true", help="100M plan rows, 8 ranks")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.full:
        args.rows, args.ranks = 100_000_000, 8

    from loader.plan import open_plan
    from manifests.synthetic import write_big_snapshot

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        num_steps = max(1, args.rows // args.batch)
        snap, plan_file = write_big_snapshot(
            work / "store", num_steps=num_steps, batch_size=args.batch, workdir=work
        )
        parquet = work / "plan.parquet"
        _to_parquet(plan_file, parquet)
        plan_file.unlink()  # only the node cache's copy is read from now on
        cache = str(work / "node-cache")
        t0 = time.perf_counter()
        open_plan(snap.url, 1, cache).close()  # the node's one download
        download_s = time.perf_counter() - t0

        # Ranks compile no module they import: an installed package has its bytecode,
        # and a rank that compiled its lazy imports inside the open would time that.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        ctx = mp.get_context("spawn")
        with ctx.Manager() as manager:
            barrier = manager.Barrier(args.ranks)
            with ctx.Pool(args.ranks) as pool:
                starts = [(num_steps // (args.ranks + 1)) * (r + 1) for r in range(args.ranks)]
                mapped = pool.starmap(
                    _mapped_rank,
                    [
                        (snap.url, cache, r, args.ranks, args.steps, starts[r], barrier)
                        for r in range(args.ranks)
                    ],
                )
        with ctx.Pool(min(2, args.ranks), maxtasksperchild=1) as pool:
            baseline = pool.map(_parquet_rank, [str(parquet)] * args.ranks)

    growth = statistics.mean(m["rss_growth_mb"] for m in mapped)
    base_growth = statistics.mean(b["rss_growth_mb"] for b in baseline)
    result = {
        "benchmark": "plan_open",
        "plan_rows": num_steps * args.batch,
        "ranks": args.ranks,
        "batch": args.batch,
        "steps_read_per_rank": args.steps,
        "plan_mb": round(snap.snapshot["artifacts"]["plan.arrow"]["size"] / 2**20, 1),
        "open_ms": round(statistics.median(m["open_ms"] for m in mapped), 3),
        "open_ms_max": round(max(m["open_ms"] for m in mapped), 3),
        "open_cpu_ms": round(statistics.median(m["open_cpu_ms"] for m in mapped), 3),
        "rss_growth_mb_per_rank": round(growth, 2),
        "rss_anon_growth_mb_per_rank": round(statistics.mean(m["anon_mb"] for m in mapped), 2),
        "baseline_rss_growth_mb_per_rank": round(base_growth, 2),
        "rss_ratio": round(growth / base_growth, 5) if base_growth > 0 else None,
        "baseline_ranks": len(baseline),
        "baseline_read_s": round(statistics.mean(b["read_s"] for b in baseline), 3),
        "download_s": round(download_s, 3),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
