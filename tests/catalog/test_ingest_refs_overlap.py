"""A score or caption batch's clip references are checked while its data file is
written (``catalog/ingest.py``, ``Planner.plan_clip_refs``): the check overlaps the
write, and an unknown clip still rejects the batch with nothing committed and no file
left behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from catalog import _append
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidBatch
from catalog.key_index import KeyStore
from tests.catalog.test_append import _assets, _clips, _data_files


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[VidlakeCatalog]:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0))
    catalog.add_assets(_assets(5))
    yield catalog
    catalog.close()


def _scores(ids: list[str]) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "clip_id": ids,
            "filter_name": ["ocr"] * n,
            "filter_version": ["v1"] * n,
            "score": np.linspace(0, 1, n),
        }
    )


def test_the_reference_check_runs_while_the_file_is_written(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _clips(_assets(5)["asset_id"].to_pylist(), 30)["clip_id"].to_pylist()
    cat.add_clips(_clips(_assets(5)["asset_id"].to_pylist(), 30))
    writing = threading.Event()
    real_write, real_has = _append._write_data_file, KeyStore.has

    def write(*args: Any) -> Any:
        writing.set()
        return real_write(*args)

    def has(self: KeyStore, view: str, *args: Any, **kwargs: Any) -> Any:
        if view == "clips" and kwargs.get("expect"):
            assert writing.wait(timeout=5), "the check ran before the write began"
        return real_has(self, view, *args, **kwargs)

    monkeypatch.setattr(_append, "_write_data_file", write)
    monkeypatch.setattr(KeyStore, "has", has)
    assert cat.add_scores(_scores(ids)).inserted == 30


def test_an_unknown_clip_commits_nothing_and_leaves_no_file(
    cat: VidlakeCatalog, tmp_path: Path
) -> None:
    ids = _clips(_assets(5)["asset_id"].to_pylist(), 30)["clip_id"].to_pylist()
    cat.add_clips(_clips(_assets(5)["asset_id"].to_pylist(), 30))
    cat.add_scores(_scores(ids[:10]))
    before, files = cat.pin(), _data_files(tmp_path, "scores")
    bad = ids[10:]
    bad[7] = "0" * 32
    with pytest.raises(InvalidBatch) as exc:
        cat.add_scores(_scores(bad))
    assert (exc.value.row, exc.value.field) == (7, "clip_id")
    assert "0" * 32 in str(exc.value)
    assert cat.pin() == before
    assert _data_files(tmp_path, "scores") == files
    with pytest.raises(InvalidBatch, match="unknown clip"):
        cat.add_captions(
            [{"clip_id": "f" * 32, "caption_version": "v1", "kind": "dense", "text": "a cat"}]
        )
    assert cat.pin() == before
    assert cat.add_scores(_scores(ids[10:])).inserted == 20  # the good batch still lands
