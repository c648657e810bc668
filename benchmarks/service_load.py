"""Load test of the REST service; prints one JSON line.

Seeds an embedded catalog (``--clips`` clips, one snapshot published through the
registry with a ``lineage.arrow``), starts ``uvicorn service.app:app`` on loopback in
a subprocess, then drives it with bounded client threads (httpx, keep-alive):

* ``metadata``: ``GET /v1/snapshots``, ``GET /v1/snapshots/{v}``, ``GET /v1/jobs``,
  ``GET /v1/snapshots/{v}/steps/{s}``, paced open-loop at ``--rate`` requests/s in
  total for ``--duration`` seconds;
* ``lineage``: ``GET /v1/lineage/clips/{id}``, then a SQL lineage query (which
  versions and steps served a clip, joining the ``manifests`` and ``plans`` views),
  each at ``--lineage-rate`` for ``--duration`` seconds;
* ``ingest``: ``--ingests`` Arrow IPC batches of ``--ingest-rows`` score rows.

Baseline, same run: ``GET /static/dashboard.css`` through the same stack (the floor
of one request). Output keys: ``endpoints`` (per endpoint: requests, rps, p50_ms,
p99_ms, errors), ``p99_ms`` (the worst p99 among metadata GETs), ``floor_p99_ms``,
``ratio`` (``p99_ms / floor_p99_ms``), ``errors`` (non-2xx or failed requests), and
the goals' verdicts. Goals (issue 5): metadata p99 < 100 ms at 200 rps with 0
errors; lineage of one clip at 1M clips < 100 ms.

    python benchmarks/service_load.py                      # small: ~1 minute
    python benchmarks/service_load.py --clips 1000000 --duration 30 --rate 200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARROW = "application/vnd.apache.arrow.stream"


# -- seeding ---------------------------------------------------------------------------
def _hex(prefix: str, n: int, width: int) -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest()[:width] for i in range(n)]


def _ingest(catalog: Any, clips: int) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Fill the catalog through its ingest (every check); the train clips' ids and
    assets, and every asset id."""
    n_assets = max(1, clips // 2)
    asset_ids = _hex("asset", n_assets, 64)
    catalog.add_assets(
        pa.table(
            {
                "asset_id": asset_ids,
                "uri": [f"s3://raw/{a[:12]}.mp4" for a in asset_ids],
                "size": np.full(n_assets, 10_000_000, np.int64),
                "source": [f"src-{i % 7}" for i in range(n_assets)],
                "source_tier": ["licensed"] * n_assets,
                "license_id": [f"lic-{i % 5}" for i in range(n_assets)],
            }
        )
    )
    owner = np.arange(clips) % n_assets
    starts = (np.arange(clips) // n_assets).astype(np.float64) * 4.0
    catalog.add_clips(
        pa.table(
            {
                "asset_id": pc.take(pa.array(asset_ids), pa.array(owner)),
                "t_start_s": starts,
                "t_end_s": starts + 4.0,
                "split_version": ["v1"] * clips,
                "num_frames": np.full(clips, 96, np.int32),
                "width": np.full(clips, 1280, np.int32),
                "height": np.full(clips, 720, np.int32),
            }
        )
    )
    table = catalog.scan("clips", columns=["clip_id", "asset_id"])  # train only
    ids = table["clip_id"].combine_chunks()
    return ids, table["asset_id"].combine_chunks(), pa.array(asset_ids)


def seed(home: Path, clips: int, steps: int, batch: int, *, bulk: bool = False) -> dict[str, Any]:
    """Fill an embedded catalog and publish one snapshot over every train clip.

    ``bulk``: through :func:`bulk_seed.bulk_fill` (the catalog's writer without its
    ingest checks; nothing may be ingested into the catalog afterwards) instead of
    ``add_assets`` / ``add_clips``. Returns ``version``, ``clip_ids`` (an Arrow array)
    and ``num_steps``.
    """
    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig
    from manifests.format import FORMAT_VERSION, INDEX_SCHEMA, PLAN_SCHEMA
    from manifests.ipc import write_table
    from manifests.registry import Registry, canonical_json

    catalog = VidlakeCatalog.open(CatalogConfig.embedded(home))
    if bulk:
        from bulk_seed import bulk_fill

        filled = bulk_fill(catalog, clips)
        clip_ids, assets, asset_ids = filled.clip_ids, filled.clip_assets, filled.asset_ids
    else:
        clip_ids, assets, asset_ids = _ingest(catalog, clips)
    n = len(clip_ids)
    rng = np.random.default_rng(0)
    work = home / "bench-cut"
    work.mkdir(parents=True, exist_ok=True)
    rows = np.arange(n, dtype=np.int64)
    latent = _hex("latent", 1, 64)[0]
    index = pa.table(
        {
            "row": rows,
            "clip_id": clip_ids,
            "asset_id": assets,
            "stream": (rows % 3).astype(np.int32),
            "bucket": np.zeros(n, np.int32),
            "num_frames": np.full(n, 96, np.int32),
            "tokens": np.full(n, 4096, np.int64),
            "object_sha256": _repeat(latent, n),
            "offset": np.zeros(n, np.int64),
            "length": np.full(n, 1000, np.int64),
            "member_sha256": _repeat(latent, n),
            "format": _repeat("safetensors", n),
            "tensor_keys": _lists("latent", n, 1),
            "captions": _lists("a clip", n, 1),
            "text_embedding_sha256": _lists("", n, 0),
        },
        schema=INDEX_SCHEMA,
    )
    write_table(work / "index.arrow", index)
    plan_rows = np.concatenate([rng.permutation(n) for _ in range(steps * batch // n + 1)])
    plan_rows = plan_rows[: steps * batch].reshape(steps, batch)
    offsets = np.arange(0, steps * batch + 1, batch, dtype=np.int32)
    plan = pa.table(
        {
            "step": np.arange(steps, dtype=np.int64),
            "phase": np.zeros(steps, np.int32),
            "bucket": np.zeros(steps, np.int32),
            "stream_epochs": pa.array([[0, 0, 0]] * steps, pa.list_(pa.int32())),
            "rows": pa.ListArray.from_arrays(pa.array(offsets), pa.array(plan_rows.ravel())),
            "skipped": np.zeros(steps, np.int32),
        },
        schema=PLAN_SCHEMA,
    )
    write_table(work / "plan.arrow", plan)
    flat = plan_rows.ravel()
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=n)
    lin_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=lin_offsets[1:])
    step_of = np.repeat(np.arange(steps, dtype=np.int64), batch)[order]
    lineage = pa.table(
        {
            "row": rows,
            "steps": pa.LargeListArray.from_arrays(pa.array(lin_offsets), pa.array(step_of)),
        }
    )
    write_table(work / "lineage.arrow", lineage)
    # The columns a real cut's manifest carries for step summaries: the catalog's
    # source and license of each clip's asset (the i-th asset has src-{i % 7}).
    source_i = pc.index_in(assets, value_set=asset_ids).to_numpy() % 7
    manifest = (
        index.append_column("tier", _repeat("gold", n))
        .append_column("source", pc.take(pa.array([f"src-{i}" for i in range(7)]), source_i))
        .append_column("source_tier", _repeat("licensed", n))
        .append_column(
            "license_id", pc.take(pa.array([f"lic-{i}" for i in range(5)]), source_i % 5)
        )
        .append_column("score_aesthetic", pa.array(rng.random(n)))
    )
    pq.write_table(manifest, str(work / "manifest.parquet"), row_group_size=64 * 1024)
    recipe = {"name": "bench", "seed": 0}
    meta = {
        "format": FORMAT_VERSION,
        "recipe": recipe,
        "recipe_sha256": hashlib.sha256(canonical_json(recipe)).hexdigest(),
        "catalog_snapshot_ids": catalog.pin().to_dict(),
        "seed": 0,
        "code_version": "bench",
        "counts": {"samples": n},
        "drops": {},
        "stream_shares": {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
        "bucket_histogram": {"0": n},
        "streams": ["a", "b", "c"],
        "buckets": [{"id": 0, "num_frames": 96, "aspect": "16:9"}],
        "phases": [
            {"name": "p", "rung": "256p", "first_step": 0, "num_steps": steps, "rank_multiple": 1}
        ],
        "num_steps": steps,
        "plan_rows": steps * batch,
    }
    names = ("manifest.parquet", "plan.arrow", "index.arrow", "lineage.arrow")
    record = Registry(catalog.objects).publish(
        {name: work / name for name in names}, meta, parent=None
    )
    catalog.close()
    return {"version": record.version, "clip_ids": clip_ids, "num_steps": steps}


def _repeat(value: str, n: int) -> pa.Array:
    return pc.take(pa.array([value]), pa.array(np.zeros(n, np.int32)))


def _lists(value: str, n: int, per_row: int) -> pa.Array:
    """``n`` lists of ``per_row`` copies of ``value`` (no Python list per row)."""
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * per_row, pa.int32())
    return pa.ListArray.from_arrays(offsets, _repeat(value, n * per_row))


# -- server ----------------------------------------------------------------------------
def start_server(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "VIDLAKE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "service.app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
        cwd=str(ROOT),
    )
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not come up")


# -- load ------------------------------------------------------------------------------
Request = Callable[[Any, int], Any]


def drive(
    url: str, requests: dict[str, Request], *, rate: float, duration: float, clients: int
) -> dict[str, list[tuple[float, bool]]]:
    """Open-loop load: ``clients`` threads share ``rate`` requests/s for ``duration``
    seconds, cycling through ``requests``; returns (latency s, ok) per endpoint."""
    import httpx

    names = list(requests)
    results: dict[str, list[tuple[float, bool]]] = {n: [] for n in names}
    lock = threading.Lock()
    interval = clients / rate
    start = time.perf_counter() + 0.2

    def worker(w: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            k = 0
            while True:
                due = start + (k + w / clients) * interval
                if due - start > duration:
                    return
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                name = names[(k * clients + w) % len(names)]
                t0 = time.perf_counter()
                try:
                    r = requests[name](client, k)
                    ok = 200 <= r.status_code < 300
                except httpx.HTTPError:
                    ok = False
                with lock:
                    results[name].append((time.perf_counter() - t0, ok))
                k += 1

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def summarise(samples: list[tuple[float, bool]], wall: float) -> dict[str, Any]:
    lat = np.array([s for s, _ in samples]) * 1000 if samples else np.zeros(1)
    return {
        "requests": len(samples),
        "rps": round(len(samples) / wall, 1) if wall > 0 else 0.0,
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "errors": sum(1 for _, ok in samples if not ok),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rate", type=float, default=200.0, help="metadata requests/s")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--lineage-rate", type=float, default=5.0, help="lineage requests/s")
    parser.add_argument("--ingests", type=int, default=3)
    parser.add_argument("--ingest-rows", type=int, default=100_000)
    parser.add_argument("--home", type=Path, default=None, help="keep the catalog here")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="vidlake-bench-")
    home = args.home or Path(tmp.name)
    t0 = time.perf_counter()
    seeded = seed(home, args.clips, args.steps, args.batch)
    seed_s = time.perf_counter() - t0
    clip_list = seeded["clip_ids"].to_pylist()
    proc, url = start_server(home)
    try:
        import httpx

        v, clips, num_steps = seeded["version"], clip_list, seeded["num_steps"]
        with httpx.Client(base_url=url, timeout=60) as warm:  # first use opens everything
            warm.get(f"/v1/snapshots/{v}/steps/0")
            warm.get(f"/v1/lineage/clips/{clips[0]}")
        floor = drive(
            url,
            {"static": lambda c, k: c.get("/static/dashboard.css")},
            rate=args.rate,
            duration=min(5.0, args.duration),
            clients=args.clients,
        )
        metadata = drive(
            url,
            {
                "GET /v1/snapshots": lambda c, k: c.get("/v1/snapshots"),
                "GET /v1/snapshots/{v}": lambda c, k: c.get(f"/v1/snapshots/{v}"),
                "GET /v1/jobs": lambda c, k: c.get("/v1/jobs"),
                "GET /v1/snapshots/{v}/steps/{s}": lambda c, k: c.get(
                    f"/v1/snapshots/{v}/steps/{(k * 7919) % num_steps}"
                ),
            },
            rate=args.rate,
            duration=args.duration,
            clients=args.clients,
        )

        def sql_lineage(c: Any, k: int) -> Any:
            clip = clips[(k * 104729) % len(clips)]
            query = (
                "SELECT DISTINCT p.version, p.step FROM plans p, unnest(p.rows) AS t(r) "
                "JOIN manifests m ON m.version = p.version AND m.row = t.r "
                f"WHERE m.clip_id = '{clip}'"
            )
            return c.post("/v1/sql", json={"query": query})

        # Each lineage path alone, so that neither's latency includes the other's CPU.
        lineage = drive(
            url,
            {
                "GET /v1/lineage/clips/{id}": lambda c, k: c.get(
                    f"/v1/lineage/clips/{clips[(k * 7907) % len(clips)]}"
                ),
            },
            rate=args.lineage_rate,
            duration=args.duration,
            clients=min(args.clients, 4),
        )
        lineage |= drive(
            url,
            {"POST /v1/sql (lineage)": sql_lineage},
            rate=args.lineage_rate,
            duration=args.duration,
            clients=min(args.clients, 4),
        )
        ingest: dict[str, list[tuple[float, bool]]] = {"POST /v1/scores (arrow)": []}
        with httpx.Client(base_url=url, timeout=300) as client:
            for i in range(args.ingests):
                batch = pa.table(
                    {
                        "clip_id": [clips[j % len(clips)] for j in range(args.ingest_rows)],
                        "filter_name": ["aesthetic"] * args.ingest_rows,
                        "filter_version": [f"bench-{i}"] * args.ingest_rows,
                        "score": np.random.default_rng(i).random(args.ingest_rows),
                    }
                )
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_table(batch)
                body = sink.getvalue().to_pybytes()
                start = time.perf_counter()
                try:
                    r = client.post("/v1/scores", content=body, headers={"Content-Type": ARROW})
                    ok = r.status_code == 200 and r.json()["inserted"] == args.ingest_rows
                except httpx.HTTPError:
                    ok = False
                ingest["POST /v1/scores (arrow)"].append((time.perf_counter() - start, ok))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        tmp.cleanup()

    endpoints: dict[str, Any] = {}
    for group, wall in ((metadata, args.duration), (lineage, args.duration)):
        for name, samples in group.items():
            endpoints[name] = summarise(samples, wall)
    for name, samples in ingest.items():
        endpoints[name] = summarise(samples, sum(s for s, _ in samples))
        endpoints[name]["rows_per_s"] = round(
            args.ingest_rows * len(samples) / max(1e-9, sum(s for s, _ in samples))
        )
    floor_stats = summarise(floor["static"], min(5.0, args.duration))
    p99 = max(endpoints[name]["p99_ms"] for name in metadata)
    errors = sum(e["errors"] for e in endpoints.values()) + floor_stats["errors"]
    lineage_p99 = endpoints["GET /v1/lineage/clips/{id}"]["p99_ms"]
    out = {
        "benchmark": "service_load",
        "clips": len(clip_list),
        "plan_rows": args.steps * args.batch,
        "rate": args.rate,
        "clients": args.clients,
        "duration_s": args.duration,
        "seed_s": round(seed_s, 2),
        "endpoints": endpoints,
        "floor_p99_ms": floor_stats["p99_ms"],
        "floor_rps": floor_stats["rps"],
        "p99_ms": p99,
        "ratio": round(p99 / max(floor_stats["p99_ms"], 1e-3), 2),
        "lineage_p99_ms": lineage_p99,
        "errors": errors,
        "goal_metadata_p99_ms_lt_100": p99 < 100 and errors == 0,
        "goal_lineage_p99_ms_lt_100": lineage_p99 < 100,
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
