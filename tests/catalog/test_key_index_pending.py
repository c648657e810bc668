"""A writer's clip and latent keys held back and written in larger sorted batches
(catalog/key_index_pending.py): fewer index transactions, answers as exact as before,
with other writers on the same file and after a writer dies with keys pending."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.key_index import KeyStore, index_path
from catalog.key_index_pending import Pending
from catalog.key_index_rows import Packed, heads, merge_sorted
from tests.catalog._key_index_child import asset, clip


@contextmanager
def _index_writes(store: KeyStore) -> Iterator[list[str]]:
    """The write transactions ``store``'s connection begins meanwhile."""
    seen: list[str] = []
    conn = store._db()
    conn.set_trace_callback(lambda s: seen.append(s) if s == "BEGIN IMMEDIATE" else None)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


def _clip_ids(cat: VidlakeCatalog) -> pa.Array:
    return cat.scan("clips", include_eval=True)["clip_id"].combine_chunks()


def _indexed(config: CatalogConfig, load: VidlakeCatalog, ids: pa.Array) -> np.ndarray:
    """Which ``ids`` the index file itself holds (a fresh store, no sync)."""
    store = KeyStore(index_path(config), load.iceberg_table, config.near_dup_rule())
    try:
        return store.has("clips", ids)
    finally:
        store.close()


def test_a_writers_clip_batches_share_one_index_write(tmp_path: Path) -> None:
    """Each clip batch once wrote its random keys to the index in a transaction of
    its own (55 % of a batch at 800k clips); they are now written together."""
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets([asset(i) for i in range(8)])
        cat.add_clips([clip(0, 0)])
        with _index_writes(cat._keys) as writes:
            for i in range(1, 8):
                assert cat.add_clips([clip(i, k) for k in range(3)]).inserted == 3
            res = cat.add_clips([clip(i, k) for i in range(8) for k in range(4)])
            assert (res.inserted, res.duplicates) == (10, 22)
        assert writes == []
        ids = _clip_ids(cat)
        assert not _indexed(config, cat, ids).all()  # pending: the index is behind
    with VidlakeCatalog.open(config) as cat:
        assert _indexed(config, cat, ids).all()  # written at close


def test_pending_keys_are_written_when_enough_have_gathered(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat._keys.flush_keys = 5
        cat.add_assets([asset(i) for i in range(6)])
        cat.add_clips([clip(0, 0)])  # the view's first sync writes its state
        with _index_writes(cat._keys) as writes:
            for i in range(6):
                cat.add_clips([clip(i, k) for k in (1, 2)])
        # 5 keys, then 6, each with its view state (then a merge of the two runs of
        # each width, clip ids and asset-keyed digests, which changes no state); the
        # last 2 pending
        assert len(writes) == 4
        assert [r.width for r in cat._keys._runs.listed(cat._keys._db(), "clips")] == [16, 22]
        assert _indexed(config, cat, _clip_ids(cat)).sum() == 11


def test_writers_sharing_one_index_stay_exact(tmp_path: Path) -> None:
    """Two catalogs on one index file (as two processes), interleaved, overlapping:
    each one's sync reads the other's appends, pending keys of a broken chain are
    written or dropped, and no duplicate gets in."""
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as one, VidlakeCatalog.open(config) as two:
        one.add_assets([asset(i) for i in range(12)])
        seen: set[tuple[int, int]] = set()
        for step in range(10):
            cat = (one, two)[step % 3 == 1]
            want = {(i, k) for i in range(step, step + 3) for k in range(2)}
            res = cat.add_clips([clip(i, k) for i, k in sorted(want)])
            assert (res.inserted, res.duplicates) == (len(want - seen), len(want & seen))
            seen |= want
        ids = _clip_ids(one)
        assert len(ids) == len(seen) == pc.count_distinct(ids).as_py()
    with VidlakeCatalog.open(config) as cat:
        assert _indexed(config, cat, ids).all()
        res = cat.add_clips([clip(i, k) for i, k in sorted(seen)])
        assert (res.inserted, res.duplicates) == (0, len(seen))


def test_a_writer_that_dies_with_keys_pending_leaves_the_index_behind_not_wrong(
    tmp_path: Path,
) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets([asset(i) for i in range(4)])
        cat.add_clips([clip(i, 0) for i in range(4)])
        cat._keys._pending.clear()  # as if the process died before close
    with VidlakeCatalog.open(config) as cat:
        res = cat.add_clips([clip(i, k) for i in range(4) for k in range(2)])
        assert (res.inserted, res.duplicates) == (4, 4)


def test_keys_pending_before_a_rewrite_are_not_answered(tmp_path: Path) -> None:
    """A delete (as an erasure's rewrite: not an append) rebuilds the view, and a clip
    it removed, still pending in memory, no longer counts as present."""
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets([asset(i) for i in range(3)])
        cat.add_clips([clip(i, 0) for i in range(3)])
        gone = _clip_ids(cat)[0].as_py()
        cat.iceberg_table("clips").delete(f"clip_id = '{gone}'")
        res = cat.add_clips([clip(i, 0) for i in range(3)] + [clip(0, 1)])  # a new batch
        assert (res.inserted, res.duplicates) == (2, 2)
        assert gone in _clip_ids(cat).to_pylist()


def test_pending_runs_answer_whole_digests_only() -> None:
    """Digests sharing their first eight bytes are told apart (an exact answer)."""
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 256, (600, 16), dtype=np.uint8)
    keys[:20, :8] = 9  # twenty digests, one head
    pending = Pending(("t", 1, "r"), ("t", 1, "r"))
    for part in np.array_split(keys, 5):
        pending.add([Packed(16, part.tobytes(), np.arange(len(part)))])
    probe = np.concatenate([keys[::4], rng.integers(0, 256, (300, 16), dtype=np.uint8)])
    probe[-10:, :8] = 9
    got = pending.known(Packed(16, probe.tobytes(), np.arange(len(probe))))
    want = np.array([(keys == p).all(axis=1).any() for p in probe])
    assert (got == want).all() and got.sum() == 150
    assert len(pending.runs[16]) < 5 and pending.count == 600
    (flat,) = pending.packed()
    held = np.frombuffer(flat.data, dtype=np.uint8).reshape(-1, 16)
    assert sorted(map(bytes, held)) == sorted(map(bytes, keys))


@pytest.mark.parametrize("width", [16, 20])
def test_pending_keys_of_both_widths(width: int) -> None:
    keys = np.random.default_rng(width).integers(0, 256, (50, width), dtype=np.uint8)
    pending = Pending(("t", 1, "r"), ("t", 1, "r"))
    pending.add([Packed(width, keys.tobytes(), np.arange(50))])
    other = Packed(32 - width, bytes(32 - width), np.arange(1))
    assert not pending.known(other).any()
    assert pending.known(Packed(width, keys.tobytes(), np.arange(50))).all()


def test_a_purge_forgets_pending_keys_too(tmp_path: Path) -> None:
    """An erasure purges the index file: keys held back before it are never written
    after it (the erased clip's id must not reappear in the file at close)."""
    config = CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets([asset(i) for i in range(2)])
        cat.add_clips([clip(i, 0) for i in range(2)])
        key = bytes.fromhex(_clip_ids(cat)[0].as_py())
        cat.purge_key_index()
    path = index_path(config)
    files = [Path(f"{path}{s}") for s in ("", "-wal")] + list(Path(f"{path}.runs").glob("*"))
    held = b"".join(f.read_bytes() for f in files if f.exists())
    assert key not in held


@pytest.mark.parametrize("width", [16, 22])
def test_runs_merge_as_the_stable_sort_of_their_rows(width: int) -> None:
    # Few distinct heads, so that equal heads (older run first) are common.
    rng = np.random.default_rng(width)
    runs = []
    for n in (50, 20, 7, 90):
        keys = rng.integers(0, 256, (n, width), dtype=np.uint8)
        keys[:, :8] = rng.integers(0, 3, (n, 1), dtype=np.uint8)
        order = np.argsort(heads(keys), kind="stable")
        runs.append((heads(keys)[order], keys[order]))
    merged = runs[0]
    for newer in runs[1:]:
        merged = merge_sorted(merged, newer)
    every = np.concatenate([keys for _, keys in runs])
    want = every[np.argsort(heads(every), kind="stable")]
    assert merged[1].tobytes() == want.tobytes()
    assert (merged[0] == heads(want)).all()


def test_held_runs_merge_and_answer_every_key() -> None:
    pending = Pending(("t", 1, "r"), ("t", 1, "r"))
    rng = np.random.default_rng(3)
    held = []
    for n in (64, 32, 16, 16, 100):
        keys = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        held.append(keys)
        pending.add([Packed(16, keys.tobytes(), np.arange(n, dtype=np.int64)).sorted()])
    runs = pending.runs[16]
    assert len(runs) < 5  # merged
    for run in runs:
        assert (run.head[1:] >= run.head[:-1]).all()
        assert (run.head == heads(run.keys)).all()
    every = np.concatenate(held)
    assert pending.known(Packed(16, every.tobytes(), np.arange(len(every)))).all()
    absent = rng.integers(0, 256, (50, 16), dtype=np.uint8)
    assert not pending.known(Packed(16, absent.tobytes(), np.arange(50))).any()
