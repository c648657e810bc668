"""Ingest's near-duplicate links through the key index's pair keys equal a brute-force
all-pairs check, batch after batch, and an index file built with the earlier key
scheme is rebuilt, not trusted."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.key_index import index_path
from tests.catalog.test_neardup_keys import RULE, brute_force, corpus


def _rows(
    frames: NDArray[np.uint64], lengths: NDArray[np.int64], lo: int, hi: int
) -> list[dict[str, Any]]:
    return [
        {
            "asset_id": hashlib.sha256(f"neardup-{k}".encode()).hexdigest(),
            "uri": f"s3://raw/{k}.mp4",
            "size": 1,
            "source_tier": "crawl",
            "fingerprint": [int(h) for h in frames[k, : lengths[k]]],
            "probe": {"bitrate": 1000 + k},
        }
        for k in range(lo, hi)
    ]


def test_ingest_links_exactly_the_brute_force_pairs(tmp_path: Path) -> None:
    frames, lengths = corpus(RULE, 21, 150, copies=150)
    want = brute_force(frames, lengths, RULE)
    ids = [hashlib.sha256(f"neardup-{k}".encode()).hexdigest() for k in range(len(frames))]
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        for lo in range(0, len(frames), 100):
            cat.add_assets(_rows(frames, lengths, lo, lo + 100))
        got = {
            r["asset_id"]: set(r["near_duplicates"] or []) for r in cat.scan("assets").to_pylist()
        }
    expected: dict[str, set[str]] = {a: set() for a in ids}
    for i, j in want:  # j is the later asset: it records the link, and i does in its batch
        expected[ids[j]].add(ids[i])
        if i // 100 == j // 100:
            expected[ids[i]].add(ids[j])
    assert len(want) > 40
    assert got == expected


def test_an_index_of_the_earlier_key_scheme_is_rebuilt(tmp_path: Path) -> None:
    frames, lengths = corpus(RULE, 4, 40, copies=0)
    lengths[:] = RULE.window
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets(_rows(frames, lengths, 0, 40))
    # What an index written before pair keys holds: the rule's old key, no nd_keys,
    # the single-position keys in a table of their own.
    with sqlite3.connect(index_path(config)) as db:
        db.execute("UPDATE meta SET rule = '4/6/8' WHERE view = 'assets'")
        db.execute("DELETE FROM nd_keys")
        db.execute("CREATE TABLE bands (slot INTEGER, v INTEGER, k BLOB)")
    near = frames ^ np.uint64(1)  # one bit off in every frame: a near copy of each
    with VidlakeCatalog.open(config) as cat:
        rows = _rows(near, lengths, 0, 3)
        for k, row in enumerate(rows):
            row["asset_id"] = hashlib.sha256(f"copy-{k}".encode()).hexdigest()
        cat.add_assets(rows)
        linked = {
            r["asset_id"]: r["near_duplicates"]
            for r in cat.scan("assets").to_pylist()
            if r["asset_id"] in {row["asset_id"] for row in rows}
        }
    old = [hashlib.sha256(f"neardup-{k}".encode()).hexdigest() for k in range(3)]
    assert [linked[row["asset_id"]] for row in rows] == [[o] for o in old]
    with sqlite3.connect(index_path(config)) as db:
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "bands" not in tables
