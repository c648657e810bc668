"""Synthetic snapshot cuts for the registry tests, and the child process of the race test.

``make_cut`` writes tiny ``manifest.parquet``/``plan.arrow``/``index.arrow`` files with
the schemas of :mod:`manifests.format` and the ``snapshot.json`` metadata a cut would
publish. Run as ``python -m tests.manifests._cutter CONFIG_JSON``, it waits for a go
file and then publishes cuts as fast as it can, printing one JSON line per attempt.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from catalog.errors import Conflict
from catalog.objects import open_store
from manifests.format import FORMAT_VERSION, INDEX_SCHEMA, PLAN_SCHEMA
from manifests.ipc import write_table
from manifests.registry import Registry, canonical_json

STREAMS = ["main", "aux"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_index(path: Path, clip_ids: Sequence[str], asset_ids: Sequence[str]) -> pa.Table:
    n = len(clip_ids)
    rows = np.arange(n, dtype=np.int64)
    table = pa.table(
        {
            "row": rows,
            "clip_id": pa.array(clip_ids, pa.string()),
            "asset_id": pa.array(asset_ids, pa.string()),
            "stream": (rows % len(STREAMS)).astype(np.int32),
            "bucket": np.zeros(n, np.int32),
            "num_frames": np.full(n, 16, np.int32),
            "tokens": np.full(n, 1024, np.int64),
            "object_sha256": [sha(f"latent-{c}") for c in clip_ids],
            "offset": np.zeros(n, np.int64),
            "length": np.full(n, 100, np.int64),
            "member_sha256": [sha(f"latent-{c}") for c in clip_ids],
            "format": ["safetensors"] * n,
            "tensor_keys": [["latent"]] * n,
            "captions": [[f"a video of {c}", f"{c}"] for c in clip_ids],
            "text_embedding_sha256": [[sha(f"te-{c}-0"), sha(f"te-{c}-1")] for c in clip_ids],
        },
        schema=INDEX_SCHEMA,
    )
    # Two batches, so that readers must walk batches.
    write_table(path, table, max_chunksize=max(1, (n + 1) // 2))
    return table


def write_plan(
    path: Path,
    steps: Sequence[Sequence[int]],
    *,
    skipped: Sequence[int] | None = None,
    batch_steps: int = 3,
) -> None:
    """A plan with one step per entry of ``steps`` (phase = step % 2, bucket = step % 3)."""
    s = len(steps)
    table = pa.table(
        {
            "step": np.arange(s, dtype=np.int64),
            "phase": (np.arange(s) % 2).astype(np.int32),
            "bucket": (np.arange(s) % 3).astype(np.int32),
            "stream_epochs": pa.array([[i // 4, i // 2] for i in range(s)], pa.list_(pa.int32())),
            "rows": pa.array([list(r) for r in steps], pa.list_(pa.int64())),
            "skipped": np.asarray(skipped if skipped is not None else [0] * s, np.int32),
        },
        schema=PLAN_SCHEMA,
    )
    write_table(path, table, max_chunksize=batch_steps)


def random_steps(num_rows: int, num_steps: int, batch: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.choice(num_rows, size=batch, replace=False).tolist() for _ in range(num_steps)]


def make_cut(
    directory: Path,
    clip_ids: Sequence[str],
    *,
    asset_ids: Sequence[str] | None = None,
    steps: Sequence[Sequence[int]] | None = None,
    seed: int = 0,
    stream_shares: dict[str, float] | None = None,
) -> tuple[dict[str, Path], dict[str, Any]]:
    """Write a synthetic cut into ``directory``; return (artifact paths, snapshot meta)."""
    directory.mkdir(parents=True, exist_ok=True)
    assets = list(asset_ids) if asset_ids is not None else [f"asset-{c}" for c in clip_ids]
    if steps is None:
        steps = random_steps(len(clip_ids), 6, min(4, len(clip_ids)), seed)
    index = write_index(directory / "index.arrow", clip_ids, assets)
    write_plan(directory / "plan.arrow", steps)
    pq.write_table(index, str(directory / "manifest.parquet"))
    recipe = {"seed": seed, "streams": STREAMS}
    snapshot = {
        "format": FORMAT_VERSION,
        "recipe": recipe,
        "recipe_sha256": hashlib.sha256(canonical_json(recipe)).hexdigest(),
        "catalog_snapshot_ids": {"clips": 1000 + seed},
        "seed": seed,
        "code_version": "test",
        "counts": {"clips": len(clip_ids), "samples": len(clip_ids)},
        "drops": {"tombstoned": seed % 3},
        "stream_shares": stream_shares or {"main": 0.5, "aux": 0.5},
        "bucket_histogram": {"0": len(clip_ids)},
        "streams": STREAMS,
        "buckets": [{"id": 0, "num_frames": 16, "aspect": "16:9"}],
        "phases": [
            {
                "name": "p0",
                "rung": "256p",
                "first_step": 0,
                "num_steps": len(steps),
                "rank_multiple": 1,
            }
        ],
        "num_steps": len(steps),
        "plan_rows": sum(len(r) for r in steps),
    }
    paths = {n: directory / n for n in ("manifest.parquet", "plan.arrow", "index.arrow")}
    return paths, snapshot


def main(config_json: str) -> None:
    """Publish ``attempts`` cuts after the go file appears; one JSON line per attempt."""
    config = json.loads(config_json)
    store = open_store(
        config["url"], endpoint_url=config.get("endpoint_url"), path_style=config.get("path_style")
    )
    registry = Registry(store)
    worker = config["worker"]
    work = Path(config["workdir"])
    cuts = [
        make_cut(
            work / f"cut{a}", [f"w{worker}-a{a}-c{i}" for i in range(6)], seed=worker * 100 + a
        )
        for a in range(config["attempts"])
    ]
    go = Path(config["go_file"])
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit("no go file")
        time.sleep(0.005)
    for attempt, (paths, snapshot) in enumerate(cuts):
        parent = registry.next_parent()
        try:
            record = registry.publish(paths, snapshot, parent=parent)
        except Conflict as exc:
            out = {
                "attempt": attempt,
                "outcome": "conflict",
                "version": exc.details.get("version"),
                "latest": exc.details.get("latest"),
                "parent": parent,
            }
        else:
            out = {
                "attempt": attempt,
                "outcome": "ok",
                "version": record.version,
                "parent": parent,
                "seed": snapshot["seed"],
                "snapshot_sha256": record.entry.snapshot_sha256,
            }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
