"""Near-duplicate detection at ingest as the number of fingerprinted assets grows.

One embedded catalog (SQLite + local warehouse in a temp dir) is grown to each size in
``--sizes`` (fingerprinted assets already in the catalog; default 5k, 20k, 100k;
``--quick``: 2k, 8k, 32k). At each size one process ingests ``--batches`` batches of
``--batch`` new fingerprinted assets, a tenth of them near copies of existing assets
(every frame within the rule's threshold), and reports the median batch's time
(``batch_s``: the whole ``add_assets``, an Iceberg commit included) and, for one more
batch, the key index's near-duplicate search alone (``search_s``:
:meth:`catalog.key_index.KeyStore.near_duplicates`) with the matches it found
(then ingests that batch too), and the key index file's bytes per asset
(``index_kb_per_asset``, after a checkpoint). Prints one JSON line::

    {"sizes", "batch", "runs": [{"existing", "batch_s", "search_s", "matches",
     "index_kb_per_asset"}, ...], "growth", "search_growth"}

``growth`` = ``batch_s`` at the largest catalog / at the smallest (goal: flat, ~1);
``search_growth`` the same for ``search_s``.
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
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog import rules
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig

SEED_BATCH = 20_000
NEAR_FRACTION = 0.1


def _random_frames(rng: np.random.Generator, n: int, window: int) -> np.ndarray:
    """``n`` fingerprints of ``window`` informative random frame hashes."""
    frames = rng.integers(0, 2**64, size=(n, window), dtype=np.uint64, endpoint=False)
    bits = np.bitwise_count(frames)
    bad = (bits < rules.MIN_FRAME_BITS) | (bits > 64 - rules.MIN_FRAME_BITS)
    while bad.any():  # vanishingly rare for uniform hashes
        frames[bad] = rng.integers(0, 2**64, size=int(bad.sum()), dtype=np.uint64)
        bits = np.bitwise_count(frames)
        bad = (bits < rules.MIN_FRAME_BITS) | (bits > 64 - rules.MIN_FRAME_BITS)
    return frames


def _near_copies(rng: np.random.Generator, src: np.ndarray, rule: rules.NearDupRule) -> np.ndarray:
    """Each row of ``src`` with ``max_distance`` random bits flipped in every frame."""
    out = src.copy()
    for _ in range(rule.max_distance):
        out ^= np.uint64(1) << rng.integers(0, 64, size=src.shape, dtype=np.uint64)
    return out


def _assets(first: int, frames: np.ndarray) -> pa.Table:
    n = len(frames)
    ids = [hashlib.sha256(f"neardup-bench-{first + i}".encode()).hexdigest() for i in range(n)]
    packed = frames.astype(">u8").tobytes()
    width = frames.shape[1] * rules.FRAME_BYTES
    return pa.table(
        {
            "asset_id": ids,
            "uri": [f"s3://raw/{first + i}.mp4" for i in range(n)],
            "size": pa.array(np.full(n, 1000), pa.int64()),
            "source_tier": ["crawl"] * n,
            "split": ["train"] * n,
            "fingerprint": pa.array(
                [packed[i * width : (i + 1) * width] for i in range(n)], pa.binary()
            ),
        }
    )


class Corpus:
    """Fingerprints handed out in order: new ones random, a fraction near copies."""

    def __init__(self, rule: rules.NearDupRule, seed: int = 7) -> None:
        self.rule = rule
        self.rng = np.random.default_rng(seed)
        self.pool: list[np.ndarray] = []
        self.count = 0

    def take(self, n: int, near: float) -> pa.Table:
        frames = _random_frames(self.rng, n, self.rule.window)
        if self.pool and near > 0:
            old = np.concatenate(self.pool)
            k = int(n * near)
            picks = self.rng.integers(0, len(old), size=k)
            frames[:k] = _near_copies(self.rng, old[picks], self.rule)
        self.pool.append(frames)
        table = _assets(self.count, frames)
        self.count += n
        return table


def _grow(cat: VidlakeCatalog, corpus: Corpus, want: int) -> None:
    while corpus.count < want:
        cat.add_assets(corpus.take(min(SEED_BATCH, want - corpus.count), near=0.0))


def _measure(
    cat: VidlakeCatalog, corpus: Corpus, batch: int, batches: int, existing: int
) -> dict[str, Any]:
    took = []
    for _ in range(batches):
        rows = corpus.take(batch, NEAR_FRACTION)
        t0 = time.perf_counter()
        cat.add_assets(rows)
        took.append(time.perf_counter() - t0)
    probe = corpus.take(batch, NEAR_FRACTION)
    frames, lengths = rules.fingerprint_matrix(probe["fingerprint"], corpus.rule.window)
    keys = cat._keys
    keys.sync("assets")
    keys.sync("near_dup_events")
    t0 = time.perf_counter()
    found = keys.near_duplicates(frames, lengths)
    search_s = time.perf_counter() - t0
    cat.add_assets(probe)  # later near copies may copy it
    return {
        "existing": existing,
        "batch_s": round(float(np.median(took)), 3),
        "search_s": round(search_s, 3),
        "matches": len(found.query),
        "index_kb_per_asset": round(_index_bytes(keys) / corpus.count / 1024, 2),
    }


def _index_bytes(keys: Any) -> int:
    """The key index file's size once its WAL is checkpointed into it."""
    keys._db().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return int(Path(keys.path).stat().st_size)


def run(root: Path, sizes: list[int], batch: int, batches: int) -> dict[str, Any]:
    config = CatalogConfig.embedded(root, eval_fraction=0.0)
    corpus = Corpus(config.near_dup_rule())
    runs = []
    with VidlakeCatalog.open(config) as cat:
        for size in sizes:
            _grow(cat, corpus, size)
            runs.append(_measure(cat, corpus, batch, batches, corpus.count))
    return {
        "sizes": sizes,
        "batch": batch,
        "runs": runs,
        "growth": round(runs[-1]["batch_s"] / runs[0]["batch_s"], 3),
        "search_growth": round(runs[-1]["search_s"] / runs[0]["search_s"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2k, 8k, 32k assets, 2k batches")
    parser.add_argument("--sizes", default="5000,20000,100000")
    parser.add_argument("--batch", type=int, default=5_000, help="assets per measured batch")
    parser.add_argument("--batches", type=int, default=3, help="measured batches per size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    batch = args.batch
    if args.quick:
        sizes, batch = [2_000, 8_000, 32_000], 2_000
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), sizes, batch, args.batches)))


if __name__ == "__main__":
    main()
