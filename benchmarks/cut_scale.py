"""Benchmark: a partitioned cut's per-worker memory and time as the catalog grows.

Builds one synthetic embedded catalog per size (``--sizes``; default 1M, 2M, 4M clips,
``--quick`` 100k, 200k, 400k, ``--tiny`` 20k, 40k, 80k for a smoke run; the recipe and
corpus of ``benchmarks/cut.py``). Clip-keyed rows are ingested in ``clip_id`` order, the
layout ``vidlake maintain`` leaves (compacted files sorted by key), so a partition's key
range prunes to its own files. Every size is cut with a fixed partition size
(``--partition-clips``, so ``P = clips / partition_clips``), each configuration in a
fresh subprocess (its own peak RSS):

* ``one``: the plain cut (no partitions, in one process): the baseline;
* ``local2``: a pool of 2 worker processes; ``local1``: the same partitions in process;
* ``held``: ``local2`` with the earlier driver, which received every kept column from
  the partitions and held them (``Execution(spill_kept=False)``): the driver's A/B;
* ``ray``: Ray tasks on a 2-CPU cluster started on 127.0.0.1 (smallest size only, and
  only where Ray is installed; the cluster's start is not timed).

The plain cut holds the whole join in one process (about 4 KB per clip): above
``--one-max`` clips (default 1M) it is left out, and ``identical`` compares the
partitioned configurations there.

Prints one JSON line: per size and configuration the wall time, the driver's peak RSS
(its own ``VmHWM``: ``ru_maxrss`` would start at this process's peak, the catalog build)
and (pool) the largest worker's peak RSS, the kept samples, the driver's peak of Arrow
allocations and, per stage, its Arrow bytes and RSS as the stage ends (MB); then
``rss_growth`` (pool worker peak RSS at the largest size / at the smallest: flat when
<= 1.2), ``time_growth`` (pool time at the
largest / smallest, against ``size_growth``: linear when about equal),
``driver_bytes_per_kept`` (the slope per kept sample, between the smallest and the
largest size, of the driver's peak RSS and of its peak of Arrow allocations, for
``local2`` and, when run, ``held``),
``driver_rss_vs_held`` (``local2`` driver peak / ``held`` driver peak, per size),
``speedup_2_procs``
(local1 time / local2 time), ``ray_overhead`` (Ray time / local2 time) and
``identical`` (every configuration gave the same artifact bytes, per size), and the
load average at the start and the end (``load``).

``--asset-inputs`` instead prints what the largest clip partition receives of the asset
side per size (its asset rows and bytes, the broadcast eval sets) against the bytes of
the whole asset side, which every partition received while it was broadcast:
``partition_asset_growth`` stays near 1 while ``asset_side_growth`` follows the catalog.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cut import _latent_objects, _recipe
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.rules import clip_ids as make_clip_ids

TIERS = np.array(["licensed", "crawl", "synthetic"])
CHUNK = 50_000


def build_sorted(root: Path, n_clips: int, seed: int = 0) -> None:
    """An embedded catalog of ``n_clips`` clips (2 per asset); clip-keyed tables are
    ingested in ``clip_id`` order, ``CHUNK`` rows per commit."""
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_fraction=0.0))
    objs = _latent_objects(catalog)
    rng = np.random.default_rng(seed)
    n_assets = (n_clips + 1) // 2
    ids = np.array(
        [hashlib.sha256(f"scale:{seed}:{i}".encode()).hexdigest() for i in range(n_assets)]
    )
    for lo in range(0, n_assets, CHUNK):
        part = ids[lo : lo + CHUNK]
        n = len(part)
        catalog.add_assets(
            pa.table(
                {
                    "asset_id": part,
                    "uri": [f"s3://raw/{i}.mp4" for i in part],
                    "size": np.full(n, 10_000_000),
                    "source": np.where(rng.random(n) < 0.5, "stock", "web"),
                    "source_tier": TIERS[rng.choice(3, n, p=[0.3, 0.55, 0.15])],
                    "license_id": np.full(n, "lic-1"),
                    "territory": np.full(n, "US"),
                    "probe_width": np.full(n, 1280, np.int32),
                    "probe_height": np.full(n, 720, np.int32),
                    "probe_fps": np.full(n, 30.0),
                    "probe_duration_s": np.full(n, 20.0),
                    "probe_bitrate": np.full(n, 8_000_000),
                }
            )
        )
    asset_rep = np.repeat(ids, 2)[:n_clips]
    starts = np.tile([0.0, 10.0], n_assets)[:n_clips]
    cids = np.array(make_clip_ids(asset_rep.tolist(), starts, starts + 10.0, ["v1"] * n_clips))
    order = np.argsort(cids)
    for lo in range(0, n_clips, CHUNK):
        take = order[lo : lo + CHUNK]
        _add_clip_rows(catalog, cids[take], asset_rep[take], starts[take], objs, rng)


def _add_clip_rows(
    catalog: VidlakeCatalog,
    cids: Any,
    assets: Any,
    starts: Any,
    objs: dict[int, Any],
    rng: np.random.Generator,
) -> None:
    m = len(cids)
    frames = rng.integers(13, 65, m).astype(np.int32)
    catalog.add_clips(
        pa.table(
            {
                "clip_id": cids, "asset_id": assets, "t_start_s": starts,
                "t_end_s": starts + 10.0, "split_version": np.full(m, "v1"),
                "fps": np.full(m, 30.0), "num_frames": frames,
                "width": np.full(m, 1280, np.int32), "height": np.full(m, 720, np.int32),
            }
        )
    )  # fmt: skip
    latent_frames = (1 + (frames - 1) // 4).astype(np.int32)
    obj = [objs[int(t)] for t in latent_frames]
    catalog.add_latents(
        pa.table(
            {
                "clip_id": cids, "rung": np.full(m, "256p"),
                "tokenizer_version": np.full(m, "vae-bench"), "format": np.full(m, "safetensors"),
                "object_sha256": [o.sha256 for o in obj],
                "object_size": np.array([o.size for o in obj], dtype=np.int64),
                "offset": np.zeros(m, dtype=np.int64),
                "length": np.array([o.size for o in obj], dtype=np.int64),
                "member_sha256": [o.sha256 for o in obj],
                "tensor_keys": pa.array([["latent"]] * m, pa.list_(pa.string())),
                "latent_frames": latent_frames,
                "tokens": latent_frames.astype(np.int64) * 32 * 56 // 4,
            }
        )
    )  # fmt: skip
    now = pa.array([0] * m, pa.timestamp("us", tz="UTC"))
    for name, values in (
        ("aesthetic", rng.uniform(0, 10, m)),
        ("motion", rng.uniform(0, 1, m)),
        ("ocr", rng.uniform(0, 1, m)),
    ):
        catalog.add_scores(
            pa.table(
                {
                    "clip_id": cids, "filter_name": np.full(m, name),
                    "filter_version": np.full(m, "1"), "score": values, "computed_at": now,
                }
            )
        )  # fmt: skip
    for kind in ("dense", "short"):
        catalog.add_captions(
            pa.table(
                {
                    "clip_id": cids, "caption_version": np.full(m, "1"),
                    "kind": np.full(m, kind), "text": np.full(m, f"a {kind} caption"),
                }
            )
        )  # fmt: skip


def measure(root: Path, config: str, partitions: int, plan_rows: int) -> dict[str, Any]:
    """One configuration's cut of the catalog at ``root`` (run in its own process)."""
    from materializer.cut import build_artifacts
    from materializer.executors import open_executor
    from materializer.recipe import load_recipe
    from materializer.select import Execution

    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root))
    doc = _recipe(plan_rows, 1024)
    doc["phases"][0]["allow_repeats_in_step"] = True  # the smallest sizes' rare buckets
    recipe = load_recipe(doc)
    execution = None
    if config == "ray":
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        execution = Execution(open_executor("auto"), partitions)
    elif config != "one":
        execution = Execution(
            open_executor("local:1" if config == "local1" else "local:2"),
            partitions,
            spill_kept=config != "held",
        )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        stages: dict[str, list[int]] = {}
        artifacts, snap = build_artifacts(
            catalog, recipe, Path(tmp), execution=execution, progress=_stage_memory(stages)
        )
        wall = time.perf_counter() - t0
        shas = {k: _file_sha256(v) for k, v in artifacts.items()}
    # The process's own high-water mark, not ``ru_maxrss``: Linux starts a child's
    # ``ru_maxrss`` at its parent's peak (vfork + exec records the parent's), so every
    # cut measured the catalog build of the process that ran it (~1.25 GB at 1M,
    # ~2.4 GB at 2M clips: round 5's "2 KB a kept sample"). The pool's workers are
    # spawned by this process early in the cut, when its own peak is still low.
    own = _own_peak_mb()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "wall_s": round(wall, 3),
        "driver_rss_mb": round(own),
        "worker_rss_mb": round(children if config in ("local2", "held") else own),
        "kept": snap["counts"]["samples"],
        # The driver's peak of Arrow allocations (tables, not the interpreter or numpy).
        "driver_arrow_peak_mb": round(pa.default_memory_pool().max_memory() / 2**20),
        "driver_stages": stages,
        "artifacts_sha256": hashlib.sha256(json.dumps(shas, sort_keys=True).encode()).hexdigest(),
    }


def _own_peak_mb() -> float:
    """This process's peak resident set (``VmHWM``), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


def _file_sha256(path: Path) -> str:
    """The file's SHA-256, read in pieces: reading a whole artifact at once (index.arrow
    is ~350 B a kept sample) added its size to the driver's measured peak RSS."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stage_memory(stages: dict[str, list[int]]) -> Any:
    """A progress callback recording, as each stage ends, the driver's Arrow bytes
    allocated then and its resident set (MB): what each stage leaves held."""

    def report(stage: str, fraction: float) -> None:
        if fraction >= 1.0:
            arrow = pa.total_allocated_bytes() >> 20
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
            stages[stage] = [arrow, rss]

    return report


def _run(root: Path, config: str, partitions: int, plan_rows: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--measure",
        str(root),
        config,
        str(partitions),
        str(plan_rows),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{config} at {root.name} failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 2_000_000, 4_000_000])
    parser.add_argument("--quick", action="store_true", help="100k, 200k and 400k clips")
    parser.add_argument("--tiny", action="store_true", help="20k, 40k and 80k clips (smoke)")
    parser.add_argument("--partition-clips", type=int, default=None)
    parser.add_argument("--plan-rows", type=int, default=1 << 20)
    parser.add_argument(
        "--one-max", type=int, default=1_000_000, help="largest size cut by the plain cut too"
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["one", "local1", "local2", "ray"],
        choices=["one", "local1", "local2", "held", "ray"],
        help="the configurations to run (local2 always runs: the ratios need it)",
    )
    parser.add_argument(
        "--asset-inputs",
        action="store_true",
        help="only what a clip partition receives of the asset side, per size (in process)",
    )
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        root, config, partitions, plan_rows = args.measure
        print(json.dumps(measure(Path(root), config, int(partitions), int(plan_rows))))
        return
    sizes = [20_000, 40_000, 80_000] if args.tiny else args.sizes
    sizes = [100_000, 200_000, 400_000] if args.quick else sizes
    per = args.partition_clips or max(10_000, sizes[0] // 4)
    if args.asset_inputs:
        print(json.dumps(asset_inputs(sizes, args.partition_clips or 10_000)))
        return
    configs = set(args.configs) | {"local2"}
    print(json.dumps(run(sizes, per, args.plan_rows, args.one_max, configs)))


def run(
    sizes: list[int], per: int, plan_rows: int, one_max: int, wanted: set[str]
) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    identical = True
    load = [round(os.getloadavg()[0], 1)]
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            root = Path(tmp) / f"c{n}"
            t0 = time.perf_counter()
            build_sorted(root, n)
            parts = max(1, n // per)
            row: dict[str, Any] = {
                "partitions": parts,
                "build_s": round(time.perf_counter() - t0, 1),
            }
            configs = ["one"] if n <= one_max else []
            configs += ["local1", "local2", "held"]
            configs += ["ray"] if n == sizes[0] and _has_ray() else []
            configs = [c for c in configs if c in wanted]
            for config in configs:
                row[config] = _run(root, config, parts, plan_rows)
            identical &= len({row[c]["artifacts_sha256"] for c in configs}) == 1
            results[str(n)] = row
            print(json.dumps({"progress": n, **row}), file=sys.stderr, flush=True)
    load.append(round(os.getloadavg()[0], 1))
    first, last = results[str(sizes[0])], results[str(sizes[-1])]
    one = [results[str(n)]["one"] for n in sizes if "one" in results[str(n)]]
    ray = first.get("ray")
    return {
        "benchmark": "cut_scale",
        "sizes": sizes,
        "partition_clips": per,
        "results": results,
        "size_growth": sizes[-1] / sizes[0],
        "rss_growth": round(last["local2"]["worker_rss_mb"] / first["local2"]["worker_rss_mb"], 3),
        "one_process_rss_growth": (
            round(one[-1]["driver_rss_mb"] / one[0]["driver_rss_mb"], 3) if len(one) > 1 else None
        ),
        "time_growth": round(last["local2"]["wall_s"] / first["local2"]["wall_s"], 3),
        "driver_bytes_per_kept": {
            f"{c}_{k}": _slope(first[c], last[c], f"driver_{k}_mb")
            for c in ("local2", "held")
            if c in first and c in last
            for k in ("rss", "arrow_peak")
        },
        "driver_rss_vs_held": {
            str(n): round(r["local2"]["driver_rss_mb"] / r["held"]["driver_rss_mb"], 3)
            for n in sizes
            if "held" in (r := results[str(n)])
        },
        "speedup_2_procs": (
            round(last["local1"]["wall_s"] / last["local2"]["wall_s"], 3)
            if "local1" in last
            else None
        ),
        "ray_overhead": round(ray["wall_s"] / first["local2"]["wall_s"], 3) if ray else None,
        "identical": identical,
        "load": load,
    }


def _slope(first: dict[str, Any], last: dict[str, Any], key: str) -> int | None:
    """Driver peak bytes (``key``: RSS or Arrow) per kept sample between two runs."""
    kept = last["kept"] - first["kept"]
    return round((last[key] - first[key]) * 2**20 / kept) if kept else None


class _Inputs:
    """An executor that runs every map in this process and records, per clip
    partition, the asset rows it receives (while the cut's shards exist)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []
        self.eval_bytes = 0

    def map(self, fn: Any, shared: Any, tasks: Any, *, label: str = "partition") -> list[Any]:
        from materializer.executors import LocalExecutor
        from materializer.partition import partition_inputs, run_partition

        if fn is run_partition:
            self.eval_bytes = shared.evals.eval_ids.nbytes + shared.evals.eval_targets.nbytes
            for task in tasks:
                got = partition_inputs(shared, task)
                assets = got["asset_rows"]
                self.rows.append((got["clips"].num_rows, assets.num_rows, assets.nbytes))
        return LocalExecutor(1).map(fn, shared, tasks, label=label)


def asset_inputs(sizes: list[int], per: int) -> dict[str, Any]:
    """What a clip partition receives of the asset side, per size: the largest
    partition's asset rows and bytes and the eval sets' bytes, against the bytes of
    the whole asset side (what every partition received when it was broadcast)."""
    from materializer.partition import SCAN_COLUMNS
    from materializer.recipe import load_recipe
    from materializer.select import Execution, select

    out: dict[str, Any] = {"benchmark": "cut_scale_asset_inputs", "partition_clips": per}
    load = [round(os.getloadavg()[0], 1)]
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            build_sorted(Path(tmp), n)
            catalog = VidlakeCatalog.open(CatalogConfig.embedded(Path(tmp)))
            doc = _recipe(1 << 16, 1024)
            doc["phases"][0]["allow_repeats_in_step"] = True
            whole = sum(
                catalog.scan(t, columns=SCAN_COLUMNS[t], include_eval=True).nbytes
                for t in ("assets", "tombstones", "asset_events")
            )
            seen = _Inputs()
            execution = Execution(seen, max(1, n // per))  # type: ignore[arg-type]
            pin = catalog.pin()
            select(catalog, load_recipe(doc), pin, execution=execution, coverage=False).close()
            out[str(n)] = {
                "partitions": max(1, n // per),
                "asset_side_bytes": whole,
                "max_partition_clips": max(r[0] for r in seen.rows),
                "max_partition_asset_rows": max(r[1] for r in seen.rows),
                "max_partition_asset_bytes": max(r[2] for r in seen.rows),
                "eval_set_bytes": seen.eval_bytes,
            }
    first, last = out[str(sizes[0])], out[str(sizes[-1])]
    out["asset_side_growth"] = round(last["asset_side_bytes"] / first["asset_side_bytes"], 3)
    out["partition_asset_growth"] = round(
        last["max_partition_asset_bytes"] / first["max_partition_asset_bytes"], 3
    )
    out["load"] = [*load, round(os.getloadavg()[0], 1)]
    return out


def _has_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
