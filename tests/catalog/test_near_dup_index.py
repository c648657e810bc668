"""Near-duplicates through the on-disk band index give the answers of the in-memory
all-assets search: the same matches (every pair the Hamming rule accepts, nothing
else) and the same canonical copies, over batches that link into earlier groups."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from catalog import rules
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig

RULE = rules.NearDupRule()


def _frames(rng: np.random.Generator) -> list[int]:
    out: list[int] = []
    while len(out) < RULE.window:
        h = int(rng.integers(0, 2**63)) | (int(rng.integers(0, 2)) << 63)
        if 16 <= h.bit_count() <= 48:
            out.append(h)
    return out


def _near(frames: list[int], rng: np.random.Generator, far: bool = False) -> list[int]:
    """A copy at the rule's edge: each frame with ``max_distance`` bits flipped, one in
    each band but one, the same for every frame (so exactly that band agrees); ``far``: frames 0
    and 1 beyond the threshold, a match only through position 2."""
    bands = RULE.bands()
    keep = int(rng.integers(0, len(bands)))  # the one band every frame keeps
    out = []
    for k, h in enumerate(frames):
        if far and k < 2:
            flips = rng.choice(64, RULE.max_distance + 3, replace=False).tolist()
        else:
            flips = [int(rng.integers(lo, hi)) for b, (lo, hi) in enumerate(bands) if b != keep]
        out.append(h ^ sum(1 << int(b) for b in flips))
    return out


def _corpus(seed: int, batches: int, per: int) -> list[list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    pool: list[list[int]] = []
    out = []
    for b in range(batches):
        rows = []
        for k in range(per):
            kind = rng.integers(0, 4)
            fp = (
                _frames(rng)
                if kind == 0 or not pool
                else _near(pool[rng.integers(0, len(pool))], rng, kind == 3)
            )
            pool.append(fp)
            name = f"{seed}-{b}-{k}"
            rows.append(
                {
                    "asset_id": hashlib.sha256(name.encode()).hexdigest(),
                    "uri": f"s3://raw/{name}.mp4",
                    "size": 1,
                    "source_tier": "crawl",
                    "fingerprint": fp,
                    "probe": {"bitrate": int(rng.integers(1, 4)) * 1000},
                }
            )
        out.append(rows)
    return out


def _reference(
    before: pa.Table, events: pa.Table, batch: pa.Table
) -> tuple[dict[str, set[str]], dict[str, str | None]]:
    """The in-memory answer: matches by the exact all-pairs search, canonical copies
    over the whole recorded graph."""
    old_ids = (
        before["asset_id"].combine_chunks() if before.num_rows else pa.array([], pa.large_string())
    )
    new_ids = batch["asset_id"].combine_chunks()
    a, a_len = rules.fingerprint_matrix(before["fingerprint"], RULE.window)
    q, q_len = rules.fingerprint_matrix(batch["fingerprint"], RULE.window)
    qi, ri = rules.near_duplicate_pairs(q, q_len, a, a_len, RULE)
    bi, bj = rules.near_duplicate_pairs(q, q_len, q, q_len, RULE, same=True)
    every = np.array(old_ids.to_pylist() + new_ids.to_pylist(), dtype="U64")
    matches: dict[str, set[str]] = {x: set() for x in new_ids.to_pylist()}
    for i, j in zip(qi.tolist(), ri.tolist(), strict=True):
        matches[every[len(old_ids) + i]].add(every[j])
    for i, j in zip(bi.tolist(), bj.tolist(), strict=True):
        matches[every[len(old_ids) + i]].add(every[len(old_ids) + j])
        matches[every[len(old_ids) + j]].add(every[len(old_ids) + i])
    edges = rules.link_edges(
        old_ids,
        before["near_duplicates"],
        before["duplicate_of"],
        events["asset_id"],
        events["related_asset_id"],
    )
    rate = np.concatenate([rules.bitrates(before), rules.bitrates(batch)])
    links = rules.plan_links(
        len(old_ids), len(new_ids), edges, (qi, ri), (bi, bj), lambda n: rate[n], lambda n: every[n]
    )
    dup = {
        x: (None if d < 0 else str(every[d]))
        for x, d in zip(new_ids.to_pylist(), links.duplicate_of.tolist(), strict=True)
    }
    return matches, dup


def test_band_index_matches_the_in_memory_search(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        for rows in _corpus(11, 4, 40):
            before = cat.scan("assets", include_eval=True)
            events = cat.scan("asset_events", include_eval=True)
            res = cat.add_assets(rows)
            after = cat.scan("assets", include_eval=True)
            new = {
                r["asset_id"]: r
                for r in after.to_pylist()
                if r["asset_id"] not in set(before["asset_id"].to_pylist())
            }
            batch = after.filter(pa.compute.is_in(after["asset_id"], pa.array(list(new))))
            matches, dup = _reference(before, events, batch)
            assert {a: set(r["near_duplicates"] or []) for a, r in new.items()} == matches
            assert {a: r["duplicate_of"] for a, r in new.items()} == dup
            assert res.near_duplicates == sum(d is not None for d in dup.values())
        assert sum(bool(m) for m in matches.values()) > 10  # the corpus links a lot
