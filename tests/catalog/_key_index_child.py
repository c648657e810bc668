"""Children of ``test_key_index.py``: ingest from another process, or die mid-way.

``ingest`` adds overlapping assets and clips in small batches (a race partner);
``die_after_commit`` and ``die_in_index_write`` add one batch of new clips (``k`` 2
and 3) and are killed (``os._exit``) right after the Iceberg commit, before the key
index learns of it, or inside the index's next write transaction, before it commits.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

from catalog import key_index
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig


def aid(i: int) -> str:
    return hashlib.sha256(f"asset-{i}".encode()).hexdigest()


def asset(i: int) -> dict[str, Any]:
    return {"asset_id": aid(i), "uri": f"s3://raw/{i}.mp4", "size": 1, "source_tier": "crawl"}


def clip(i: int, k: int) -> dict[str, Any]:
    return {
        "asset_id": aid(i),
        "t_start_s": float(k),
        "t_end_s": k + 0.5,
        "split_version": "v1",
        "num_frames": 12,
        "width": 64,
        "height": 64,
    }


def ingest(cat: VidlakeCatalog, start: int, stop: int, batch: int) -> None:
    """Assets ``start .. stop`` and two clips each, ``batch`` assets per call."""
    for lo in range(start, stop, batch):
        ids = range(lo, min(lo + batch, stop))
        cat.add_assets([asset(i) for i in ids])
        cat.add_clips([clip(i, k) for i in ids for k in range(2)])


def _die(*_: object, **__: object) -> None:
    os._exit(3)


def main(mode: str, config_json: str, start: int, stop: int) -> None:
    config = CatalogConfig.model_validate_json(config_json)
    with VidlakeCatalog.open(config) as cat:
        if mode == "ingest":
            ingest(cat, start, stop, 5)
            return
        if mode == "die_after_commit":
            key_index.KeyStore.advance = _die  # type: ignore[method-assign]
        else:
            key_index._set_meta = _die  # type: ignore[assignment]
        cat.add_clips([clip(i, k) for i in range(start, stop) for k in (2, 3)])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
