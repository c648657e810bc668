"""Ingest throughput: the catalog's checked appends against plain Parquet writes.

Appends ``--clips`` clips and three scores per clip (three filters) in ``--batch``-row
batches into a fresh embedded catalog (SQLite + local warehouse in a temp dir), with
every ingest rule on (every given clip id re-derived and checked, asset references,
duplicate checks, one Iceberg commit per batch). The baseline writes the same rows,
batch for batch, with ``pyarrow.parquet.write_table``, interleaved with the catalog's
appends (batch i into the catalog, then batch i to Parquet) so that both sides see the
same moments of a shared machine's load; ``--repeat`` runs it again and keeps the
median ratio. Prints one JSON line::

    {"rows", "clips", "scores", "batch", "catalog_s", "parquet_s",
     "catalog_rows_per_s", "parquet_rows_per_s", "ratio", "ratios",
     "clip_id_s", "bare_iceberg_s", "bare_iceberg_ratio"}

``ratio = catalog_rows_per_s / parquet_rows_per_s`` (goal ≥ 0.5). ``clip_id_s`` is the
time :func:`catalog.rules.clip_id` re-derivation alone takes over every clip batch
(one SHA-256 per clip in Python, ~1.5 µs a clip with its text on this box, more than
the Parquet write of a clip batch): the part of ``catalog_s`` no storage trick removes.
``--stages`` adds ``stages_cpu_s``: the catalog's thread CPU per stage (the key
index, clip-id re-derivation, data-file writes, manifests, the commit, batch SHA-256,
coercion, table loads), summed over the threads each runs in, per run; and
``stages_wall_s``, the same stages' wall time (the clip ids and the data files run
beside the main thread, so the wall figures overlap; a stage's wall beyond its CPU is
waiting: fsync, I/O, the GIL).
``bare_iceberg_*`` times pyiceberg's own ``Table.append`` of the same rows, already
conformed, with no checks, in a phase of its own (noisier): the catalog writes its data
files and commits its snapshots itself (``catalog/_append.py``), so it may beat that.

Where the time goes (py-spy, 200k clips, 2 shared cores at load 4-7, 1 Dec 2026): the
key index's look-ups were 53 % of the run, one SQLite B-tree probe per row sent as
``IN`` lists of 8,192 keys (a score batch's reference check of 100k clips: 0.3-0.5 s
against a 20-40 ms Parquet write). A batch is now one statement over packed digests,
and clips this process just committed are answered from memory
(:mod:`catalog.key_index_recent`); what is left is the Parquet write (~30 % of a score
batch), the SQL catalog's commit (~15 %), the clip-id hashing (overlapped with the
write) and, for clips, the index's B-tree inserts and duplicate probes.

Round 4 (thread CPU of each stage, 200k clips, load 8, 1.49 s in all): the key index
44 % (its look-ups, the closing write of held keys, ``advance``), the data-file writes
20 % (about what ``write_table`` of the same batches costs), clip-id re-derivation 19 %
(beside the clip writes), batch SHA-256, coercion, table loads and manifests 4 % each
or less. cProfile overstates the commit's share (deep copies are many small Python
calls): measure stages with ``time.thread_time`` instead.

Round 5 (py-spy with idle samples, the main thread's wall time, 1M clips, load 5): the
key index 48 % (its look-ups 36 %), clip-id re-derivation 20 %, the score batches'
data-file writes 14 %, coercion 6 %, the SQL commit 5 % (most of it SQLite's fsync),
manifests 3 %, batch SHA-256 2 %. At 3M the key index is 65 % and its CPU grows 4.5x
for 3x the rows (every other stage grows linearly): the score batches' reference checks
search the index's in-memory runs. Since then a score batch's reference check runs
beside its data file's write, and the clip-id re-derivation beside the planning
(decision 049).

Round 6 (thread CPU of the wrapped functions, split by table, 1M clips, load ~7): a clip
batch costs ~270 ms of CPU against ~41 ms for Parquet's write of the same rows (clip-id
re-derivation 87, the key index's ``advance`` 60, the data file 41, the duplicate check
29, the assets' splits 15, batch SHA-256 13, coercion 11); a score batch ~88 ms against
~38 (the data file 38, its reference check 26 beside it, coercion 6, batch SHA-256 6,
manifests 4.5, the commit 2.7). The data files cost what Parquet's own writes cost (33.6
vs 30.6 ms CPU a clip batch, 23.0 vs 23.9 a score batch): the gap is the checks, and two
thirds of the catalog's time is the clip batches, at ~8x their Parquet write. Since then
a keyed batch's sorted index digests are made beside its data file's write
(``KeyStore.prepare``, decision 056), and a duplicate check of new clips no longer copies
their digests. Hashing the clip ids in DuckDB (partly off the GIL, 10 % less CPU) was
tried a third time and dropped: its heavy-lock runs were slower than base.

Round 7 (issue 16, decision 062): a clip batch's id SHA-256s are computed in a worker
process (``catalog.hash_worker``; ``clip_id_s`` includes it), the duplicate check's
digests are reused for ``advance``, and ``advance`` merges its held runs by their
heads. A clip batch at 1M (load ~1.5): wall 275 -> 173 ms; CPU 345 ms -> 203 in the
catalog's process plus ~72 in the worker (total -20 %); ``ratio`` 0.264 -> 0.305
(median of 3 pairs). A score batch is unchanged (~57 ms wall, ~82 ms CPU against
Parquet's ~25 ms): its reference check (27) beside its data file (32) is what is left
there, 30 batches of it ~1.7 s of the catalog's ~3.8 s.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import hashlib
import inspect
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog import _append, commit, idempotency, rules
from catalog.catalog import VidlakeCatalog
from catalog.coerce import conform
from catalog.config import CatalogConfig
from catalog.key_index import KeyStore
from catalog.rules import clip_ids

FILTERS = ("aesthetic", "motion", "ocr")
CLIPS_PER_ASSET = 20


def _assets(n: int) -> pa.Table:
    ids = [hashlib.sha256(f"asset-{i}".encode()).hexdigest() for i in range(n)]
    return pa.table(
        {
            "asset_id": ids,
            "uri": [f"s3://raw/{a[:2]}/{a}.mp4" for a in ids],
            "size": np.full(n, 50_000_000, dtype=np.int64),
            "source_tier": ["crawl"] * n,
        }
    )


def _clip_batch(asset_ids: list[str], start: int, n: int, rng: np.random.Generator) -> pa.Table:
    k = np.arange(start, start + n)
    t0 = (k % CLIPS_PER_ASSET) * 5.0
    return pa.table(
        {
            "asset_id": [asset_ids[i // CLIPS_PER_ASSET] for i in k],
            "t_start_s": t0,
            "t_end_s": t0 + rng.uniform(2.0, 5.0, n),
            "split_version": ["scenes-v1"] * n,
            "fps": np.full(n, 24.0),
            "num_frames": rng.integers(48, 121, n).astype(np.int32),
            "width": np.full(n, 1280, dtype=np.int32),
            "height": np.full(n, 720, dtype=np.int32),
            "aspect_bucket": ["16:9"] * n,
            "job_id": ["split-job-1"] * n,
        }
    )


def _score_batch(clip_id: pa.Array, filt: str, rng: np.random.Generator) -> pa.Table:
    n = len(clip_id)
    return pa.table(
        {
            "clip_id": clip_id,
            "filter_name": [filt] * n,
            "filter_version": ["v1"] * n,
            "score": rng.random(n),
            "job_id": [f"{filt}-job-1"] * n,
        }
    )


#: ``--stages``: the catalog's functions whose thread CPU is summed, per stage.
_STAGES: dict[str, list[tuple[Any, str]]] = {
    "key_index": [(KeyStore, n) for n in ("has", "prepare", "advance", "splits", "close")],
    "clip_ids": [(rules, "clip_ids")],
    "data_files": [(_append, "_write_data_file")],
    "manifests": [(_append, "_snapshot")],
    "commit": [(_append, "sql_commit")],
    "batch_sha256": [(idempotency, "batch_sha256")],
    "coerce": [(commit, "coerce_batch")],
    "table_loads": [(VidlakeCatalog, "_load")],
}


@contextlib.contextmanager
def _stage_cpu(on: bool) -> Iterator[dict[str, float]]:
    """Sum each stage's thread CPU (``time.thread_time``) and wall time while the block
    runs, in whichever thread a stage runs (cProfile overstates many-small-call
    stages). Wall sums are keyed ``<stage>_wall``: a stage's wall minus its CPU is time
    spent waiting (I/O, fsync, the GIL, the other core)."""
    spent: dict[str, float] = {}
    if on:
        spent = {k: 0.0 for stage in _STAGES for k in (stage, f"{stage}_wall")}
    # As stored (a staticmethod stays one), to be put back as it was.
    real = [
        (owner, name, inspect.getattr_static(owner, name))
        for v in _STAGES.values()
        for owner, name in v
    ]
    if on:
        for stage, targets in _STAGES.items():
            for owner, name in targets:
                timed = _timed(getattr(owner, name), stage, spent)
                static = isinstance(inspect.getattr_static(owner, name), staticmethod)
                setattr(owner, name, staticmethod(timed) if static else timed)
    try:
        yield spent
    finally:
        for owner, name, fn in real:
            setattr(owner, name, fn)


def _timed(fn: Callable[..., Any], stage: str, spent: dict[str, float]) -> Callable[..., Any]:
    wall = f"{stage}_wall"

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t, w = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[stage] += time.thread_time() - t
            spent[wall] += time.perf_counter() - w

    return timed


def _np(col: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(col.to_numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="runs; the median ratio is kept")
    parser.add_argument(
        "--stages", action="store_true", help="add the catalog's thread CPU per stage"
    )
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    n_assets = -(-args.clips // CLIPS_PER_ASSET)
    assets = _assets(n_assets)
    asset_ids = assets["asset_id"].to_pylist()
    # Inputs are built before timing: both sides get the same producer batches.
    clip_batches: list[pa.Table] = []
    score_batches: list[pa.Table] = []
    for start in range(0, args.clips, args.batch):
        clips = _clip_batch(asset_ids, start, min(args.batch, args.clips - start), rng)
        ids = clip_ids(
            clips["asset_id"],
            clips["t_start_s"].to_numpy(),
            clips["t_end_s"].to_numpy(),
            clips["split_version"],
        )
        # Producers name their clips (the catalog re-derives and checks every id).
        clip_batches.append(clips.add_column(0, "clip_id", ids))
        score_batches.extend(_score_batch(ids, f, rng) for f in FILTERS)
    n_scores = sum(b.num_rows for b in score_batches)

    with tempfile.TemporaryDirectory(prefix="vidlake-bench-") as tmp:
        out = Path(tmp) / "parquet"
        out.mkdir()
        ratios, catalog_runs, parquet_runs = [], [], []
        with _stage_cpu(args.stages) as spent:
            for run in range(args.repeat):
                cat = VidlakeCatalog.open(CatalogConfig.embedded(Path(tmp) / f"catalog-{run}"))
                before = dict(spent)
                cat.add_assets(assets)  # setup, untimed
                spent.update(before)  # and not in the stages
                # Batch by batch, the catalog's append then the bare write of the same rows:
                # both sides see the same moments of a shared machine's load.
                catalog_s = parquet_s = 0.0
                work = [(cat.add_clips, b) for b in clip_batches]
                work += [(cat.add_scores, b) for b in score_batches]
                for i, (add, b) in enumerate(work):
                    t = time.perf_counter()
                    add(b)
                    catalog_s += time.perf_counter() - t
                    t = time.perf_counter()
                    pq.write_table(b, os.fspath(out / f"part-{run}-{i:05d}.parquet"))
                    parquet_s += time.perf_counter() - t
                t = time.perf_counter()
                cat.close()  # writes the key index's pending keys: part of the catalog's cost
                catalog_s += time.perf_counter() - t
                catalog_runs.append(catalog_s)
                parquet_runs.append(parquet_s)
                ratios.append(parquet_s / catalog_s)
        pick = int(np.argsort(ratios)[len(ratios) // 2])  # the median run
        catalog_s, parquet_s = catalog_runs[pick], parquet_runs[pick]

        t = time.perf_counter()
        for b in clip_batches:
            clip_ids(b["asset_id"], _np(b["t_start_s"]), _np(b["t_end_s"]), b["split_version"])
        clip_id_s = time.perf_counter() - t

        # The floor: pyiceberg appending the same rows, already in table form, with no
        # checks at all (what the catalog's own work is measured against).
        bare = VidlakeCatalog.open(CatalogConfig.embedded(Path(tmp) / "bare"))
        now = pa.scalar(dt.datetime.now(dt.UTC), pa.timestamp("us", tz="UTC"))
        ready = []
        for name, batches in (("clips", clip_batches), ("scores", score_batches)):
            tbl = bare.iceberg_table(name)
            for b in batches:
                extra = {"split": pa.scalar("train"), "ingested_at": now, "computed_at": now}
                for col, value in extra.items():
                    if col in tbl.schema().column_names and col not in b.column_names:
                        b = b.append_column(col, pa.array([value.as_py()] * b.num_rows, value.type))
                ready.append((tbl, conform(b, tbl.schema())))
        t = time.perf_counter()
        for tbl, b in ready:
            tbl.append(b)
        iceberg_s = time.perf_counter() - t
        bare.close()

    rows = args.clips + n_scores
    print(
        json.dumps(
            {
                "rows": rows,
                "clips": args.clips,
                "scores": n_scores,
                "batch": args.batch,
                "catalog_s": round(catalog_s, 3),
                "parquet_s": round(parquet_s, 3),
                "catalog_rows_per_s": round(rows / catalog_s),
                "parquet_rows_per_s": round(rows / parquet_s),
                "ratio": round(parquet_s / catalog_s, 3),
                "ratios": [round(r, 3) for r in ratios],
                "clip_id_s": round(clip_id_s, 3),
                "bare_iceberg_s": round(iceberg_s, 3),
                "bare_iceberg_ratio": round(parquet_s / iceberg_s, 3),
                **(
                    {
                        "stages_cpu_s": {
                            k: round(v / args.repeat, 3)
                            for k, v in spent.items()
                            if not k.endswith("_wall")
                        },
                        "stages_wall_s": {
                            k.removesuffix("_wall"): round(v / args.repeat, 3)
                            for k, v in spent.items()
                            if k.endswith("_wall")
                        },
                    }
                    if args.stages
                    else {}
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
