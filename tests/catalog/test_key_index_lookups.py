"""How the key index answers a batch (catalog/key_index.py, key_index_rows.py,
key_index_recent.py): one statement per batch, keys a commit of ours just added
answered from memory, and never an answer the tables would not give."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from catalog import key_index_rows
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidBatch
from catalog.key_index import _SPLITS, KeyStore
from catalog.key_index_recent import RecentKeys
from catalog.key_index_rows import Packed, digests, packed_digests
from tests.catalog._key_index_child import clip, ingest


@contextmanager
def _statements(store: KeyStore) -> Iterator[list[str]]:
    """The SQL statements ``store``'s connection runs meanwhile."""
    seen: list[str] = []
    conn = store._db()
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


def _clip_ids(cat: VidlakeCatalog) -> pa.Array:
    return cat.scan("clips", include_eval=True)["clip_id"].combine_chunks()


def _scores(clip_ids: list[str]) -> list[dict[str, object]]:
    return [
        {"clip_id": c, "filter_name": "aesthetic", "filter_version": "v1", "score": 0.5}
        for c in clip_ids
    ]


def test_a_batch_is_looked_up_in_one_statement(tmp_path: Path) -> None:
    """The index once sent a batch as ``IN (...)`` lists of 8,192 keys, each list a
    statement to parse and a Python object per key; now one statement reads the whole
    batch from one packed parameter, present and absent keys alike."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
        known = _clip_ids(cat).to_pylist()
    absent = [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(20_000)]
    keys = pa.array([*absent[:10_000], *known, *absent[10_000:]])
    with VidlakeCatalog.open(config) as cat:  # a fresh process: nothing in memory
        store = cat._keys
        store.sync("clips")
        for expect in (False, True):
            with _statements(store) as seen:
                found = store.has("clips", keys, expect=expect)
            assert [s for s in seen if "clips" in s] != []
            assert len([s for s in seen if "clips" in s]) == 1
            assert found.tolist() == [k in known for k in keys.to_pylist()]


def test_a_score_batch_for_clips_just_added_makes_no_index_probe(tmp_path: Path) -> None:
    """Scores name the clips the batch before wrote: each reference check was a
    B-tree probe in SQLite per row (more than the row's Parquet write)."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
        ids = _clip_ids(cat).to_pylist()
        with _statements(cat._keys) as seen:
            assert cat.add_scores(_scores(ids)).inserted == len(ids)
        assert [s for s in seen if "FROM clips" in s] == []
        with pytest.raises(InvalidBatch, match="unknown clip"):
            cat.add_scores(_scores([ids[0], "ab" * 16]))


def test_a_duplicate_check_of_new_clips_copies_no_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of new clips is unknown to memory and to the held keys alike: its
    digests go on to the run files as they are, not copied twice (~5 ms a copy per
    100k clips); a batch some of whose keys are known still sends only the rest."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
        taken: list[int] = []
        real = Packed.take

        def take(self: Packed, picks: np.ndarray) -> Packed:
            taken.append(len(picks))
            return real(self, picks)

        monkeypatch.setattr(Packed, "take", take)
        ingest(cat, 6, 12, 6)  # new clips, with keys of ours held in memory
        assert taken == []
        # One clip already held, one new: only the new one goes on to the run files.
        assert cat.add_clips([clip(6, 0), clip(6, 5)]).duplicates == 1
        assert taken == [1]


def test_keys_removed_by_another_process_are_not_answered_from_memory(tmp_path: Path) -> None:
    """A second catalog on the same index file (another process) deletes a clip and
    rebuilds the shared view; the first, whose memory holds the clip from its own
    commit, must refuse a score for it as the tables do."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as one, VidlakeCatalog.open(config) as two:
        ingest(one, 0, 4, 4)
        gone = _clip_ids(one)[0].as_py()
        two.iceberg_table("clips").delete(f"clip_id = '{gone}'")
        two._keys.sync("clips")  # the shared view now matches the table again
        with pytest.raises(InvalidBatch, match="unknown clip"):
            one.add_scores(_scores([gone]))
        one._keys.sync("clips")
        assert not one._keys.has("clips", pa.array([gone]), expect=True).any()


def test_packed_digests_are_the_digests_by_width() -> None:
    ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(4)]
    keys = pa.array([ids[0], None, ids[1][:32], "AB" * 16, "c\x1f720p", "", ids[2], "é"])
    want = digests(pa.array([k for k in keys.to_pylist() if k is not None]))
    rows = [i for i, k in enumerate(keys.to_pylist()) if k is not None]
    got: dict[int, bytes] = {}
    for group in packed_digests(keys.slice(0)):
        for j, row in enumerate(group.rows.tolist()):
            got[row] = group.data[j * group.width : (j + 1) * group.width]
    assert got == dict(zip(rows, want, strict=True))
    assert sorted({g.width for g in packed_digests(keys)}) == [16, 20, 32]
    assert packed_digests(pa.array([], pa.string())) == []


def _packed(keys: list[bytes]) -> Packed:
    return Packed(len(keys[0]), b"".join(keys), np.arange(len(keys), dtype=np.int64))


def test_recent_keys_answer_only_whole_digests_of_a_traceable_state() -> None:
    recent = RecentKeys(capacity=4)
    state = ("uuid", 1, "rule")
    a, b = b"\x01" * 16, b"\x02" * 16
    twin = b"\x01" * 8 + b"\x09" * 8  # a's first eight bytes, another key
    recent.added("clips", state, ("uuid", 2, "rule"), [_packed([a, b])])
    assert recent.known("clips", _packed([a, twin, b])).tolist() == [True, False, True]
    recent.synced("clips", ("uuid", 3, "rule"), lambda held: held == 2)
    assert recent.known("clips", _packed([a])).tolist() == [True]
    recent.synced("clips", ("uuid", 4, "rule"), lambda held: False)  # e.g. a rewrite
    assert recent.known("clips", _packed([a])).tolist() == [False]
    fresh = [bytes([i]) * 16 for i in range(3, 9)]
    recent.added("clips", ("uuid", 4, "rule"), ("uuid", 5, "rule"), [_packed(fresh[:3])])
    recent.added("clips", ("uuid", 5, "rule"), ("uuid", 6, "rule"), [_packed(fresh[3:])])
    held = recent.known("clips", _packed(fresh))
    assert held.sum() <= 4 and held[3:].all()  # bounded, the newest kept


def test_a_batch_larger_than_one_statement_is_sent_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite bounds a blob at 1 GB, less than a batch may hold: the packed keys go
    in parts, with the same answers and the same index rows."""
    monkeypatch.setattr(key_index_rows, "PART_KEYS", 5)
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 6)
        known = _clip_ids(cat).to_pylist()
        absent = [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(7)]
        keys = pa.array([*absent[:3], *known, *absent[3:]])
        for expect in (False, True):
            found = cat._keys.has("clips", keys, expect=expect)
            assert found.tolist() == [k in known for k in keys.to_pylist()]
    with VidlakeCatalog.open(config) as cat:  # nothing in memory: every key from SQLite
        cat._keys.sync("clips")
        assert cat._keys.has("clips", pa.array(known)).all()
        assert cat.add_scores(_scores(known)).inserted == len(known)


def test_splits_are_read_from_the_covering_index_even_in_an_older_file(tmp_path: Path) -> None:
    """A ``WITHOUT ROWID`` table holds whole asset rows in its interior pages (8 to a
    1 KiB page: 6-7 levels at 800k assets, read afresh by each new process); the splits
    come from the narrow ``assets_split`` index instead (decision 058). A file made
    before the index existed gets it when a process opens it, with the same answers."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
        ids = cat.scan("assets")["asset_id"].combine_chunks()
        expected = cat._keys.splits(ids)
        path = cat._keys.path
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP INDEX assets_split")  # as a file of the previous layout
    conn.close()
    with VidlakeCatalog.open(config) as cat:
        store = cat._keys
        asked = pa.array([*ids.to_pylist(), "f" * 64, None])
        with _statements(store) as seen:
            assert store.splits(asked) == [*expected, None, None]
        assert any("INDEXED BY assets_split" in s for s in seen)
        assert None not in expected and len(expected) == len(ids)
        group = packed_digests(ids)[0]
        plan = store._db().execute("EXPLAIN QUERY PLAN " + _SPLITS, group.params).fetchall()
        assert any("COVERING INDEX assets_split" in str(row[-1]) for row in plan)
