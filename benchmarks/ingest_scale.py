"""Ingest at scale: rows/s and memory of a new ingest process as the catalog grows.

One embedded catalog (SQLite + local warehouse in a temp dir) is grown to each size
in ``--sizes`` (clips already in the catalog; ``--quick``: 50k, 200k, 800k; default 1M,
4M, 16M). At each size (and into an empty catalog) a fresh process opens the catalog
and ingests ``--batches`` batches of ``--batch`` new clips (every rule on: asset
references, the duplicate check, clip ids re-derived), as a curation worker joining a
running fleet would; it reports its rows/s (of its median batch; ``rows_per_s_all``:
all its rows over all its batches plus closing the catalog, which writes the index
keys still pending), its peak RSS, and two ways of answering one batch's duplicate
check: the key index (:mod:`catalog.key_index`) and a pyiceberg scan pruned by an
``In`` row filter over files sorted by ``clip_id`` (compacted first; ``--skip-scan``
leaves it out).

The catalog is grown through ``add_clips`` (every check on) in batches of 100k clips.
``--seed-flush-keys N`` lets the growing process hold up to N clip keys back before it
writes them to the key index (default: the index's own bound, 2^20): the same catalog
and the same index content and state, written as fewer, larger sorted runs (a faster
seed for large sizes; the same keys, in runs merged by the same rule, though their
number may differ: ``index_runs`` says).
Prints one JSON line::

    {"sizes", "batch", "batches", "pairs", "seed", "seed_flush_keys", "load": [start,
     end], "runs": [{"existing", "rows_per_s", "rows_per_s_all", "rows_per_cpu_s",
     "close_s", "rss_mb", "index_lookup_s", "index_lookup_clip_s", "index_runs",
     "manifests", "pruned_scan_s", "seed_s", "empty": {"rows_per_s", "rows_per_s_all",
     "rows_per_cpu_s", "rss_mb"}}, ...], "rss_growth",
     "rate_ratio", "rate_ratio_all", "cpu_ratio"}

``index_lookup_s``: one 10k-key duplicate check of new clips in the fresh process, as
ingest makes it (:meth:`catalog.key_index.KeyStore.has` with the clips' assets: the
asset-keyed digests, about one block read per asset and run);
``index_lookup_clip_s``: the same keys by clip id alone (one block per clip and run,
as the duplicate check read them before, and as a reference check still does);
``manifests``: the clips table's manifests at the end (what each commit's manifest
list holds, :mod:`catalog.manifest_merge`); ``index_runs``: the clip keys' run files
then (:mod:`catalog.key_runs`, both widths).

Each sized run is paired with a run of the same kind into a fresh catalog that holds
only the assets (``empty``), measured just before it, so a shared box's load shifts
both alike; ``--pairs N`` measures N such pairs per size.

``rss_growth`` = peak RSS at the largest catalog / at the smallest (medians; goal:
flat, ≤ 1.2); ``rate_ratio`` = rows/s at the largest catalog / with no clips (the
median over its pairs of sized / empty; goal ≥ 0.7); ``rate_ratio_all`` the same of
``rows_per_s_all``; ``cpu_ratio`` the same of ``rows_per_cpu_s`` (clips per second of
the process's CPU time, all threads, in its median batch: on a shared box other jobs
stretch wall time far more than CPU time; waits such as the commit's fsync are not in
it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.rules import clip_ids

CLIPS_PER_ASSET = 20
ASSET_BATCH = 50_000
FILL_BATCH = 100_000


def _asset_id(i: int) -> str:
    return hashlib.sha256(f"bench-asset-{i}".encode()).hexdigest()


def _assets(lo: int, hi: int) -> pa.Table:
    ids = [_asset_id(i) for i in range(lo, hi)]
    n = len(ids)
    return pa.table(
        {
            "asset_id": ids,
            "uri": [f"s3://raw/{i}.mp4" for i in range(lo, hi)],
            "size": pa.array(np.full(n, 1000), pa.int64()),
            "source_tier": ["crawl"] * n,
            "split": ["train"] * n,
        }
    )


def _clips(first: int, n: int, shift: float = 0.0) -> pa.Table:
    """Clips ``first .. first + n``: clip ``c`` is clip ``c % 20`` of asset ``c // 20``,
    starting ``shift`` seconds later than the catalog's own (new clips of old assets)."""
    c = np.arange(first, first + n)
    assets = pa.array([_asset_id(int(a)) for a in c // CLIPS_PER_ASSET])
    start = (c % CLIPS_PER_ASSET).astype(np.float64) * 2.0 + shift
    version = pa.array(["scenes-v1"] * n)
    return pa.table(
        {
            "clip_id": clip_ids(assets, start, start + 1.5, version),
            "asset_id": assets,
            "t_start_s": start,
            "t_end_s": start + 1.5,
            "split_version": version,
            "num_frames": pa.array(np.full(n, 36), pa.int32()),
            "width": pa.array(np.full(n, 1280), pa.int32()),
            "height": pa.array(np.full(n, 720), pa.int32()),
            "fps": np.full(n, 24.0),
        }
    )


def _grow(
    config: CatalogConfig, have: int, want: int, assets: int, floor: int = 0, flush: int = 0
) -> int:
    """Clips ``have .. want`` and their assets (at least ``floor``), given ``assets``
    present (``flush``: index keys held back, 0: the default); returns the assets now
    present."""
    with VidlakeCatalog.open(config) as cat:
        if flush:
            cat._keys.flush_keys = flush
        need = max(-(-want // CLIPS_PER_ASSET), floor)
        for lo in range(assets, need, ASSET_BATCH):
            cat.add_assets(_assets(lo, min(lo + ASSET_BATCH, need)))
        for lo in range(have, want, FILL_BATCH):
            cat.add_clips(_clips(lo, min(FILL_BATCH, want - lo)))
    return max(assets, need)


def _child(config_json: str, shift: float, batch: int, batches: int, scan: bool) -> dict[str, Any]:
    """One fresh ingest process: ``batches`` batches of new clips (``shift``)."""
    from catalog.maintenance.compact import compact_table
    from catalog.reads import one_of

    config = CatalogConfig.model_validate_json(config_json)
    new = [_clips(k * batch, batch, shift) for k in range(batches)]
    with VidlakeCatalog.open(config) as cat:
        took, cpu = [], []
        for rows in new:
            t0, c0 = time.perf_counter(), time.process_time()
            assert cat.add_clips(rows).inserted == batch
            took.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        rate = batch / float(np.median(took))  # the median batch: a shared box's noise
        probe_rows = _clips(batches * batch, batch, shift)
        probe = probe_rows["clip_id"]
        t0 = time.perf_counter()
        cat._keys.has("clips", probe, assets=probe_rows["asset_id"])  # as ingest asks
        index_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cat._keys.has("clips", probe)  # by clip id alone (a reference check's way)
        index_clip_s = time.perf_counter() - t0
        runs = len(cat._keys._runs.listed(cat._keys._db(), "clips"))
        clips = cat.iceberg_table("clips")
        head = clips.current_snapshot()
        manifests = len(head.manifests(clips.io)) if head is not None else 0
        t0 = time.perf_counter()
        cat._keys.close()  # writes the keys still pending: part of the ingest's cost
        close_s = time.perf_counter() - t0
        rss = _peak_rss_mb()
        out = {
            "rows_per_s": round(rate),
            "rows_per_s_all": round(batch * batches / (sum(took) + close_s)),
            "rows_per_cpu_s": round(batch / float(np.median(cpu))),
            "close_s": round(close_s, 3),
            "rss_mb": round(rss, 1),
            "index_lookup_s": round(index_s, 4),
            "index_lookup_clip_s": round(index_clip_s, 4),
            "index_runs": runs,
            "manifests": manifests,
        }
        if not scan:
            return out
        tbl = cat.iceberg_table("clips")
        compact_table(tbl, sort_by=("clip_id",), target_bytes=64 << 20)
        tbl = cat.iceberg_table("clips")
        t0 = time.perf_counter()
        tbl.scan(
            row_filter=one_of("clip_id", probe.to_pylist()), selected_fields=("clip_id",)
        ).to_arrow()
        scan_s = time.perf_counter() - t0
    return {**out, "pruned_scan_s": round(scan_s, 4)}


def _peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss``, which Linux carries
    across ``exec``, it starts afresh in the child, not at the parent's size)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(
    config: CatalogConfig, existing: int, batch: int, batches: int, scan: bool, turn: int = 0
) -> dict[str, Any]:
    shift = 1000.0 * (1 + existing) + 100.0 * turn  # each run's clips are new
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            config.model_dump_json(),
            str(shift),
            "--batch",
            str(batch),
            "--batches",
            str(batches),
            *([] if scan else ["--skip-scan"]),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return {"existing": existing, **json.loads(out.stdout.strip().splitlines()[-1])}


def _empty(root: Path, floor: int, batch: int, batches: int, scan: bool) -> dict[str, Any]:
    """One fresh ingest process into a fresh catalog holding only the assets."""
    config = CatalogConfig.embedded(root, eval_fraction=0.0)
    _grow(config, 0, 0, 0, floor)
    try:
        return _measure(config, 0, batch, batches, scan)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(
    root: Path,
    sizes: list[int],
    batch: int,
    batches: int,
    flush: int = 0,
    scan: bool = True,
    pairs: int = 1,
) -> dict[str, Any]:
    load = [round(os.getloadavg()[0], 2)]
    config = CatalogConfig.embedded(root / "lake", eval_fraction=0.0)
    VidlakeCatalog.open(config).close()
    floor = -(-(batches + 1) * batch // CLIPS_PER_ASSET)  # the assets new clips need
    assets = _grow(config, 0, 0, 0, floor)
    runs, have = [], 0
    for size in sizes:
        t0 = time.perf_counter()
        assets = _grow(config, have, size, assets, flush=flush)
        seed_s = round(time.perf_counter() - t0, 1)
        have = size
        for turn in range(pairs):  # each sized run next to an empty-catalog run
            empty = _empty(root / f"empty-{size}-{turn}", floor, batch, batches, scan)
            runs.append({**_measure(config, size, batch, batches, scan, turn), "seed_s": seed_s})
            keep = ("rows_per_s", "rows_per_s_all", "rows_per_cpu_s", "rss_mb")
            runs[-1]["empty"] = {k: empty[k] for k in keep}
    load.append(round(os.getloadavg()[0], 2))
    last = [r for r in runs if r["existing"] == sizes[-1]]
    first = [r for r in runs if r["existing"] == sizes[0]]
    return {
        "sizes": sizes,
        "batch": batch,
        "batches": batches,
        "pairs": pairs,
        "seed": f"add_clips, {FILL_BATCH} clips a batch",
        "seed_flush_keys": flush or None,
        "load": load,
        "runs": runs,
        "rss_growth": round(_median(last, "rss_mb") / _median(first, "rss_mb"), 3),
        "rate_ratio": _ratio(last, "rows_per_s"),
        "rate_ratio_all": _ratio(last, "rows_per_s_all"),
        "cpu_ratio": _ratio(last, "rows_per_cpu_s"),
    }


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def _ratio(runs: list[dict[str, Any]], key: str) -> float:
    """The median over pairs of (sized run / its empty-catalog run)."""
    return round(float(np.median([r[key] / r["empty"][key] for r in runs])), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50k, 200k, 800k clips")
    parser.add_argument("--sizes", default="1000000,4000000,16000000")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per measured batch")
    parser.add_argument("--batches", type=int, default=5, help="measured batches per size")
    parser.add_argument(
        "--seed-flush-keys", type=int, default=0, help="index keys the seed holds back"
    )
    parser.add_argument("--skip-scan", action="store_true", help="no pruned-scan comparison")
    parser.add_argument(
        "--pairs", type=int, default=1, help="(empty, sized) run pairs per size (a noisy box)"
    )
    parser.add_argument("--tmp", help="parent directory of the catalog (default: the system's)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child = _child(
            args.child[0], float(args.child[1]), args.batch, args.batches, not args.skip_scan
        )
        print(json.dumps(child))
        return
    sizes = [50_000, 200_000, 800_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        result = run(
            Path(tmp),
            sizes,
            args.batch,
            args.batches,
            args.seed_flush_keys,
            not args.skip_scan,
            args.pairs,
        )
        print(json.dumps(result))


if __name__ == "__main__":
    main()
