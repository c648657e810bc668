"""Benchmark: cutting a snapshot against the floor of a plain DuckDB selection join.

Builds a synthetic embedded catalog of ``--clips`` clips (3 filter scores, 5 streams,
4 frame buckets x 4 aspect ratios, one caption version with two kinds; every latent
row points at one small shared object per frame count, since the cut never reads latent
bytes), then
times in the same run:

* ``cut_s``: :func:`materializer.cut.build_artifacts` — pinned scans, the selection
  query, scatter, a ``--plan-rows`` plan, index, manifest and lineage artifacts;
* ``floor_s``: DuckDB running only the plain selection join over the same pinned
  Arrow scans and writing Parquet.

Prints one JSON line: clips, plan_rows, cut_s, floor_s, ratio (cut_s / floor_s),
cut_cpu_s, floor_cpu_s and cpu_ratio (the same in CPU seconds of the process, steadier
on a shared box), plan_rows_per_s (plan stage alone), peak_rss_mb. Goals at 1M clips: ratio <= 2,
plan >= 10M rows/s, peak RSS <= 4 GB in a process that only cuts (the catalog is
built in a child process; ``--catalog DIR`` keeps it for the next run). Cost grows
linearly in clips (scans, join, sorts are O(n log n) with a small log) and in plan rows.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.rules import clip_ids as make_clip_ids
from materializer.recipe import load_recipe

BATCH = 100_000
TIERS = np.array(["licensed", "crawl", "synthetic"])
ASPECTS = [(16, 9), (4, 3), (1, 1), (9, 16)]


def _recipe(plan_rows: int, batch: int) -> dict[str, Any]:
    return {
        "name": "bench-cut",
        "seed": 11,
        "tokenizer_version": "vae-bench",
        "filters": [
            {"name": "aesthetic", "version": "1", "min": 2.0},
            {"name": "motion", "version": "1", "min": 0.05},
            {"name": "ocr", "version": "1", "max": 0.8},
        ],
        "tiers": {
            "rules": [{"name": "gold", "where": "score_aesthetic >= 7"}],
            "default": "base",
        },
        "streams": [
            {"name": "licensed", "where": "source_tier = 'licensed'"},
            {"name": "synthetic", "where": "source_tier = 'synthetic'"},
            {"name": "web_gold", "where": "source_tier = 'crawl' AND tier = 'gold'"},
            {"name": "web_motion", "where": "source_tier = 'crawl' AND score_motion >= 0.5"},
            {"name": "web", "where": "source_tier = 'crawl'"},
        ],
        "captions": {"version": "1", "kinds": ["dense", "short"]},
        "buckets": {
            "latent_frames": [4, 8, 12, 16],
            "aspect_ratios": ["16:9", "4:3", "1:1", "9:16"],
        },
        "phases": [
            {
                "name": "main",
                "rung": "256p",
                "weights": {
                    "licensed": 0.3,
                    "synthetic": 0.1,
                    "web_gold": 0.2,
                    "web_motion": 0.1,
                    "web": 0.3,
                },
                "steps": max(1, plan_rows // batch),
                "global_batch": batch,
                "rank_multiple": 64,
            }
        ],
    }


def _latent_objects(catalog: VidlakeCatalog) -> dict[int, Any]:
    """One small safetensors object per latent frame count (4..16): the cut never
    reads latent bytes, but ingest checks each header against its row."""
    out = {}
    for t in range(4, 17):
        header = {"latent": {"dtype": "BF16", "shape": [1, t, 1, 1], "data_offsets": [0, 2 * t]}}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        data = len(raw).to_bytes(8, "little") + raw + b"\0" * (2 * t)
        out[t] = catalog.objects.put_bytes(data).info
    return out


def build_catalog(root: Path, n_clips: int, seed: int = 0) -> VidlakeCatalog:
    """An embedded catalog with ``n_clips`` clips, 2 per asset, vectorised batches."""
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_fraction=0.0))
    objs = _latent_objects(catalog)
    rng = np.random.default_rng(seed)
    n_assets = (n_clips + 1) // 2
    now = pa.scalar(0, pa.timestamp("us", tz="UTC"))
    for lo in range(0, n_assets, BATCH // 2):
        hi = min(n_assets, lo + BATCH // 2)
        n = hi - lo
        ids = [hashlib.sha256(f"bench:{seed}:{i}".encode()).hexdigest() for i in range(lo, hi)]
        aspect = rng.integers(0, 4, n)
        height = np.full(n, 720)
        width = np.array([round(720 * ASPECTS[a][0] / ASPECTS[a][1]) for a in aspect])
        catalog.add_assets(
            pa.table(
                {
                    "asset_id": ids,
                    "uri": [f"s3://raw/{i}.mp4" for i in ids],
                    "size": np.full(n, 10_000_000),
                    "source": np.where(rng.random(n) < 0.5, "stock", "web"),
                    "source_tier": TIERS[rng.choice(3, n, p=[0.3, 0.55, 0.15])],
                    "license_id": np.full(n, "lic-1"),
                    "territory": np.full(n, "US"),
                    "probe_width": width.astype(np.int32),
                    "probe_height": height.astype(np.int32),
                    "probe_fps": np.full(n, 30.0),
                    "probe_duration_s": np.full(n, 20.0),
                    "probe_bitrate": np.full(n, 8_000_000),
                }
            )
        )
        asset_rep = np.repeat(np.asarray(ids, dtype=object), 2)[: min(2 * n, n_clips - 2 * lo)]
        m = len(asset_rep)
        starts = np.tile([0.0, 10.0], n)[:m]
        frames = rng.integers(13, 65, m).astype(np.int32)
        split_version = "v1"
        cids = make_clip_ids(asset_rep.tolist(), starts, starts + 10.0, [split_version] * m)
        catalog.add_clips(
            pa.table(
                {
                    "clip_id": cids,
                    "asset_id": asset_rep.tolist(),
                    "t_start_s": starts,
                    "t_end_s": starts + 10.0,
                    "split_version": np.full(m, split_version),
                    "fps": np.full(m, 30.0),
                    "num_frames": frames,
                    "width": np.repeat(width, 2)[:m].astype(np.int32),
                    "height": np.repeat(height, 2)[:m].astype(np.int32),
                }
            )
        )
        latent_frames = (1 + (frames - 1) // 4).astype(np.int32)
        obj = [objs[int(t)] for t in latent_frames]
        catalog.add_latents(
            pa.table(
                {
                    "clip_id": cids,
                    "rung": np.full(m, "256p"),
                    "tokenizer_version": np.full(m, "vae-bench"),
                    "format": np.full(m, "safetensors"),
                    "object_sha256": [o.sha256 for o in obj],
                    "object_size": np.array([o.size for o in obj], dtype=np.int64),
                    "offset": np.zeros(m, dtype=np.int64),
                    "length": np.array([o.size for o in obj], dtype=np.int64),
                    "member_sha256": [o.sha256 for o in obj],
                    "tensor_keys": pa.array([["latent"]] * m, pa.list_(pa.string())),
                    "latent_frames": latent_frames,
                    "tokens": (latent_frames.astype(np.int64) * 32 * 56 // 4),
                }
            )
        )
        for name, values in (
            ("aesthetic", rng.uniform(0, 10, m)),
            ("motion", rng.uniform(0, 1, m)),
            ("ocr", rng.uniform(0, 1, m)),
        ):
            catalog.add_scores(
                pa.table(
                    {
                        "clip_id": cids,
                        "filter_name": np.full(m, name),
                        "filter_version": np.full(m, "1"),
                        "score": values,
                        "computed_at": pa.array([now.value] * m, pa.timestamp("us", tz="UTC")),
                    }
                )
            )
        for kind in ("dense", "short"):
            catalog.add_captions(
                pa.table(
                    {
                        "clip_id": cids,
                        "caption_version": np.full(m, "1"),
                        "kind": np.full(m, kind),
                        "text": np.full(m, f"a {kind} caption"),
                    }
                )
            )
    return catalog


def floor_join(catalog: VidlakeCatalog, out: Path) -> float:
    """The plain selection join (no rules) over the same pinned scans, to Parquet."""
    import duckdb

    t0 = time.perf_counter()
    pin = catalog.pin()
    con = duckdb.connect(":memory:", config={"threads": 2})
    for name in ("assets", "clips", "latents", "scores", "captions"):
        con.register(name, catalog.scan(name, pin=pin, include_eval=True))
    con.sql(
        """
        COPY (
          WITH s AS (
            SELECT clip_id,
              max(score) FILTER (WHERE filter_name = 'aesthetic') AS a,
              max(score) FILTER (WHERE filter_name = 'motion') AS m,
              max(score) FILTER (WHERE filter_name = 'ocr') AS o
            FROM scores GROUP BY clip_id),
          cap AS (SELECT clip_id, list(text) AS captions FROM captions GROUP BY clip_id)
          SELECT c.*, a.source_tier, l.object_sha256, l."offset", l.length, l.tokens,
                 s.a, s.m, s.o, cap.captions
          FROM clips c JOIN assets a USING (asset_id) JOIN latents l USING (clip_id)
          JOIN s USING (clip_id) JOIN cap USING (clip_id)
          WHERE s.a >= 2 AND s.m >= 0.05 AND s.o <= 0.8
          ORDER BY c.clip_id
        ) TO '"""
        + str(out)
        + "' (FORMAT parquet)"
    )
    con.close()
    return time.perf_counter() - t0


def _build_in_child(root: Path, n_clips: int) -> float:
    """Build the catalog in a fresh process (so its memory is not the cut's); seconds."""
    t0 = time.perf_counter()
    cmd = [sys.executable, __file__, "--clips", str(n_clips), "--build-only", str(root)]
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def _open_or_build(root: Path, n_clips: int) -> tuple[VidlakeCatalog, float]:
    """The catalog at ``root``: reused when a marker says it holds ``n_clips`` clips,
    else built there in a child process."""
    marker = root / "bench-cut-clips"
    if marker.exists() and marker.read_text() == str(n_clips):
        return VidlakeCatalog.open(CatalogConfig.embedded(root / "lake", eval_fraction=0.0)), 0.0
    shutil.rmtree(root / "lake", ignore_errors=True)
    build_s = _build_in_child(root, n_clips)
    marker.write_text(str(n_clips))
    return VidlakeCatalog.open(CatalogConfig.embedded(root / "lake", eval_fraction=0.0)), build_s


def _cpu_s() -> float:
    """User + system CPU seconds of this process so far (all threads; not children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _stage_clock(stages: dict[str, float]) -> Callable[[str, float], None]:
    """A cut ``progress`` callback that adds each stage's wall time to ``stages``
    (stages may overlap: the plan and lineage run beside the index and manifest)."""
    started: dict[str, float] = {}

    def progress(stage: str, fraction: float) -> None:
        now = time.perf_counter()
        if fraction == 0.0:
            started[stage] = now
        elif fraction >= 1.0 and stage in started:
            stages[stage] = stages.get(stage, 0.0) + now - started.pop(stage)

    return progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=1_000_000)
    parser.add_argument("--plan-rows", type=int, default=10_000_000)
    # A step draws ~batch * share from each (stream, bucket) pool; below ~100k clips
    # some pools hold fewer samples than that and the cut refuses them: lower it.
    parser.add_argument("--batch", type=int, default=1024, help="global batch (multiple of 64)")
    parser.add_argument(
        "--catalog",
        type=Path,
        help="keep the built catalog in this directory and reuse it on the next run",
    )
    parser.add_argument(
        "--executor",
        help="run the selection and the plan on this executor (local:N; default: in process)",
    )
    parser.add_argument("--build-only", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", type=Path, help="write a cProfile of the cut here")
    args = parser.parse_args()
    if args.build_only is not None:
        build_catalog(args.build_only / "lake", args.clips)
        return
    from materializer.cut import build_artifacts
    from materializer.executors import open_executor
    from materializer.select import Execution

    with tempfile.TemporaryDirectory(prefix="vidlake-bench-cut-") as tmp:
        root = args.catalog or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        catalog, build_s = _open_or_build(root, args.clips)
        cpu0 = _cpu_s()
        floor_s = floor_join(catalog, Path(tmp) / "floor.parquet")
        floor_cpu_s = _cpu_s() - cpu0
        stages: dict[str, float] = {}
        out = Path(tmp) / "cut"
        out.mkdir()
        recipe = load_recipe(_recipe(args.plan_rows, args.batch))
        execution = None
        if args.executor:
            execution = Execution(open_executor(args.executor))
        profiler = cProfile.Profile() if args.cprofile else None
        t0, cpu0 = time.perf_counter(), _cpu_s()
        if profiler is not None:
            profiler.enable()
        _, snap = build_artifacts(
            catalog, recipe, out, progress=_stage_clock(stages), execution=execution
        )
        cut_s, cut_cpu_s = time.perf_counter() - t0, _cpu_s() - cpu0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(args.cprofile))
    # This process only opened the catalog, ran the floor join and cut: the build ran
    # in a child, so this is the cut's peak (the floor's is smaller).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "clips": args.clips,
                "samples": snap["counts"]["samples"],
                "plan_rows": snap["plan_rows"],
                "cut_s": round(cut_s, 3),
                "floor_s": round(floor_s, 3),
                "ratio": round(cut_s / floor_s, 3),
                # CPU seconds of this process (every thread): steadier than wall time
                # on a shared box, where other jobs take the cores in turn.
                "cut_cpu_s": round(cut_cpu_s, 3),
                "floor_cpu_s": round(floor_cpu_s, 3),
                "cpu_ratio": round(cut_cpu_s / max(floor_cpu_s, 1e-9), 3),
                "plan_rows_per_s": round(snap["plan_rows"] / max(stages.get("plan", 1e-9), 1e-9)),
                "stages_s": {k: round(v, 3) for k, v in stages.items()},
                # Everything after the selection (scatter, plan, quality, index,
                # manifest, lineage, snapshot.json): the stages the selection join,
                # which the floor matches, does not explain.
                "after_selection_s": round(
                    cut_s - sum(stages.get(k, 0.0) for k in ("pin", "scan", "join", "embeddings")),
                    3,
                ),
                "build_catalog_s": round(build_s, 1),
                "peak_rss_mb": round(peak),
                "executor": args.executor or "in-process",
            }
        )
    )


if __name__ == "__main__":
    main()
