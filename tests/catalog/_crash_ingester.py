"""The child of ``test_ingest_crash.py``: (re)runs a fixed sequence of ingest batches.

Started by a ``forkserver`` that has imported the catalog already, so a child costs a
fork and a catalog open, not an interpreter start. It reports on its pipe before and
after each call, and, in ``assets`` mode, between the assets commit and the events
commit (``between``), where the parent may kill it on purpose.
"""

from __future__ import annotations

import hashlib
import time
from multiprocessing.connection import Connection
from typing import Any

from catalog.catalog import VidlakeCatalog
from catalog.commit import Ingester
from catalog.config import CatalogConfig
from catalog.rules import clip_id

APPEND_TABLES = ("scores", "captions", "jobs", "tombstones", "asset_events")
CLIPS_PER_ASSET = 4
LINKS_PER_ROUND = 4


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def base_assets() -> list[dict[str, Any]]:
    return [
        {"asset_id": sha("base-0"), "uri": "s3://raw/base.mp4", "size": 1, "source_tier": "crawl"}
    ]


def base_clips() -> list[dict[str, Any]]:
    return [
        {
            "asset_id": sha("base-0"),
            "t_start_s": float(k),
            "t_end_s": k + 0.5,
            "split_version": "v1",
            "num_frames": 12,
            "width": 64,
            "height": 64,
        }
        for k in range(CLIPS_PER_ASSET)
    ]


def clip_ids() -> list[str]:
    return [clip_id(sha("base-0"), float(k), k + 0.5, "v1") for k in range(CLIPS_PER_ASSET)]


def append_batch(table: str, r: int) -> list[dict[str, Any]]:
    """Round ``r``'s rows of an append-only table; each carries ``r`` in a column."""
    tag = f"r{r}"
    a = sha("base-0")
    if table == "scores":
        return [
            {"clip_id": c, "filter_name": "aesthetic", "filter_version": "2", "score": r + i / 8}
            | {"job_id": tag}
            for i, c in enumerate(clip_ids())
        ]
    if table == "captions":
        return [
            {"clip_id": c, "caption_version": "1", "kind": "dense", "text": f"{tag} {c}"}
            | {"job_id": tag}
            for c in clip_ids()
        ]
    if table == "jobs":
        return [{"job_id": tag, "stage": "filter", "status": "done"}]
    if table == "tombstones":
        return [{"asset_id": a, "reason": "dmca", "kind": "soft", "requested_by": tag}]
    return [{"asset_id": a, "event": "quarantined", "actor": tag}]


def _frames(seed: int) -> list[int]:
    out, k = [], 0
    while len(out) < 8:
        h = int.from_bytes(hashlib.sha256(f"fp-{seed}-{k}".encode()).digest()[:8], "big")
        k += 1
        if 20 <= h.bit_count() <= 44:
            out.append(h)
    return out


def asset_batch(r: int) -> list[dict[str, Any]]:
    """Round ``r``: originals and a lower-bitrate re-upload of each (one link each)."""
    rows = []
    for k in range(LINKS_PER_ROUND):
        fp = _frames(r * 100 + k)
        copy = [h ^ (1 << (k + 3)) for h in fp]
        for name, frames, rate in ((f"orig-{r}-{k}", fp, 5_000_000), (f"copy-{r}-{k}", copy, 10)):
            rows.append(
                {
                    "asset_id": sha(name),
                    "uri": f"s3://raw/{name}.mp4",
                    "size": 100,
                    "source_tier": "crawl",
                    "probe": {"bitrate": rate},
                    "fingerprint": frames,
                }
            )
    return rows


def expected_links(rounds: int) -> list[tuple[str, str]]:
    return sorted(
        (sha(f"copy-{r}-{k}"), sha(f"orig-{r}-{k}"))
        for r in range(rounds)
        for k in range(LINKS_PER_ROUND)
    )


def run(mode: str, root: str, first: int, rounds: int, conn: Connection) -> None:
    """Ingest rounds ``first..rounds-1`` (a rerun replays what a killed run committed)."""
    cat = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_fraction=0.0))
    if mode == "assets":
        real = Ingester.append_links

        def slow_links(self: Ingester, events: Any, sid: int) -> None:
            conn.send(("between", sid))
            time.sleep(0.05)
            real(self, events, sid)

        Ingester.append_links = slow_links  # type: ignore[method-assign]
    conn.send(("ready",))
    for r in range(first, rounds):
        if mode == "assets":
            conn.send(("start", r, "assets"))
            result = cat.add_assets(asset_batch(r))
            conn.send(("done", r, "assets", result.replayed))
            continue
        for table in APPEND_TABLES:
            conn.send(("start", r, table))
            key = f"round-{r}-{table}" if r % 2 else None  # callers' keys and derived ones
            result = getattr(cat, f"add_{table}")(append_batch(table, r), idempotency_key=key)
            conn.send(("done", r, table, result.replayed))
    conn.send(("finished",))
    cat.close()
