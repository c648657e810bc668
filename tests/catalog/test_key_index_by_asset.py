"""The clips' asset-keyed digests (catalog/key_index_rows.py ``asset_clip_digests``):
a duplicate check reads about one run block per asset instead of one per clip, and
answers exactly as a look-up by clip id, in runs, pending keys and after a rebuild."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import key_runs
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidBatch
from catalog.key_index import index_path
from catalog.key_index_pending import Pending
from catalog.key_index_rows import asset_clip_digests, asset_prefixes, packed_digests
from catalog.key_runs import KeyRuns
from catalog.rules import clip_id
from tests.catalog._key_index_child import aid, asset, clip


def _rows(pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    return [clip(i, k) for i, k in pairs]


def _ids(pairs: list[tuple[int, int]]) -> tuple[pa.Array, pa.Array]:
    assets = pa.array([aid(i) for i, _ in pairs], pa.large_string())
    ids = pa.array([clip_id(aid(i), float(k), k + 0.5, "v1") for i, k in pairs])
    return assets, ids


def _preadv_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.preadv

    def counted(fd: int, buffers: Any, offset: int) -> int:
        calls.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counted)
    return calls


def test_a_duplicate_check_reads_about_one_block_per_asset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By clip id, 100 new clips of 5 stored assets fell in ~60 block ranges of a
    40k-key run (one ``preadv`` each); by asset, in one or two per asset."""
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets([asset(i) for i in range(2000)])
        cat.add_clips(_rows([(i, k) for i in range(2000) for k in range(20)]))
    new = [(i, k) for i in range(0, 2000, 400) for k in range(20, 40)]
    assets, ids = _ids(new)
    with VidlakeCatalog.open(config) as cat:
        cat._keys.sync("clips")
        calls = _preadv_calls(monkeypatch)
        assert not cat._keys.has("clips", ids, assets=assets).any()
        by_asset = len(calls)
        calls.clear()
        assert not cat._keys.has("clips", ids).any()
        by_clip = len(calls)
        assert by_asset <= 2 * 5 < 4 * by_asset < by_clip
        res = cat.add_clips(_rows([*new, (0, 3), (1600, 19)]))
        assert (res.inserted, res.duplicates) == (100, 2)


def test_a_clip_id_never_names_clips_of_two_assets(tmp_path: Path) -> None:
    """What makes the asset-keyed duplicate check exact: a stored clip's id is the
    rule's of its own asset, so a row claiming it for another asset is rejected."""
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets([asset(i) for i in range(2)])
        cat.add_clips([clip(0, 0)])
        stolen = {**clip(1, 0), "clip_id": clip_id(aid(0), 0.0, 0.5, "v1")}
        with pytest.raises(InvalidBatch, match="clip_id"):
            cat.add_clips([stolen])
        assert cat.scan("clips", include_eval=True).num_rows == 1


def test_an_index_of_the_previous_layout_rebuilds_its_clip_keys(tmp_path: Path) -> None:
    """A layout-2 file holds clip runs without asset-keyed digests: read as they are,
    every stored clip would look new to the duplicate check."""
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    pairs = [(i, k) for i in range(6) for k in range(3)]
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets([asset(i) for i in range(6)])
        cat.add_clips(_rows(pairs))
    with sqlite3.connect(index_path(config)) as db:  # as the previous layout wrote it
        assert db.execute("SELECT count(*) FROM runs WHERE width = 22").fetchone()[0] > 0
        db.execute("DELETE FROM runs WHERE width != 16")
        db.execute("PRAGMA user_version = 2")
    with VidlakeCatalog.open(config) as cat:
        res = cat.add_clips(_rows([*pairs, (0, 5)]))  # not a replay: one clip new
        assert (res.inserted, res.duplicates) == (1, len(pairs))


def test_asset_keyed_digests_lead_with_the_asset_and_never_share_a_width() -> None:
    assets, ids = _ids([(0, 0), (0, 1), (1, 0)])
    odd = pa.array(["not-hex", None, "ab" * 32], pa.large_string())
    (hexed,) = asset_clip_digests(assets, ids)
    assert hexed.width == 22 and hexed.rows.tolist() == [0, 1, 2]
    prefix = [bytes.fromhex(aid(i))[:6] for i in (0, 0, 1)]
    assert [hexed.data[j * 22 : j * 22 + 6] for j in range(3)] == prefix
    assert [hexed.data[j * 22 + 6 : j * 22 + 22] for j in range(3)] == [
        bytes.fromhex(c) for c in ids.to_pylist()
    ]
    widths = {g.width for g in asset_clip_digests(pa.array([aid(0), aid(1), None]), odd)}
    own = {g.width for g in packed_digests(odd)}
    assert widths == {26} and own == {20, 32}  # the null asset's row has none
    assert not widths & {16, 20, 32}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stored=st.sets(st.tuples(st.integers(0, 30), st.integers(0, 12)), max_size=120),
    asked=st.lists(st.tuples(st.integers(0, 34), st.integers(0, 14)), min_size=1, max_size=80),
    cut=st.integers(0, 120),
)
def test_by_asset_answers_as_by_clip_id_in_runs_and_pending_keys(
    tmp_path_factory: pytest.TempPathFactory,
    stored: set[tuple[int, int]],
    asked: list[tuple[int, int]],
    cut: int,
) -> None:
    """Stored clips split between run files and a writer's pending keys: the
    asset-keyed look-up of any batch is the set membership of its clip ids."""
    root = tmp_path_factory.mktemp("runs")
    conn = sqlite3.connect(root / "index.sqlite", isolation_level=None)
    conn.executescript(key_runs.SCHEMA)
    runs, pending = KeyRuns(root / "runs"), Pending(("u", 1, "r"), ("u", 1, "r"))
    ordered = sorted(stored)
    for part, hold in ((ordered[:cut], False), (ordered[cut:], True)):
        if part:
            assets, ids = _ids(part)
            groups = [g.sorted() for g in asset_clip_digests(assets, ids)]
            if hold:
                pending.add(groups)
            else:
                runs.add(conn, "clips", groups)
                runs.committed()
    assets, ids = _ids(asked)
    (group,) = asset_clip_digests(assets, ids)
    group = group.sorted()
    found = np.zeros(len(asked), np.bool_)
    found[group.rows] = runs.has(conn, "clips", group) | pending.known(group)
    assert found.tolist() == [p in stored for p in asked]
    runs.close()
    conn.close()


def _prefix(asset_id: str) -> bytes:
    head = asset_id[:12]
    if len(head) == 12 and all(c in "0123456789abcdef" for c in head):
        return bytes.fromhex(head)
    return hashlib.sha256(asset_id.encode()).digest()[:6]


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.text(alphabet="0123456789abcdefX", min_size=10, max_size=70),
            st.text(max_size=20),
        ),
        max_size=30,
    ),
    st.integers(0, 3),
)
@settings(max_examples=150, deadline=None)
def test_asset_prefixes_are_the_ids_first_bytes_or_their_hash(
    ids: list[str | None], cut: int
) -> None:
    arr = pa.array(ids, pa.large_string()).slice(min(cut, len(ids)))
    prefix, valid = asset_prefixes(arr)
    values = arr.to_pylist()
    assert valid.tolist() == [v is not None for v in values]
    for row, value in enumerate(values):
        if value is not None:
            assert prefix[row].tobytes() == _prefix(value)
