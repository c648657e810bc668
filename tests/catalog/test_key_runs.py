"""The sorted run files of the key index (catalog/key_runs.py): exact answers for any
interleaving of writes, merges and probes; crash leftovers swept; a merge racing a
reader; damaged runs detected, never read as "absent"."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import key_runs
from catalog.key_index_rows import Packed
from catalog.key_runs import KeyRuns, RunDamaged, merge_plan


class _Store:
    """A manifest (SQLite) and its runs, as the key index drives them."""

    def __init__(self, root: Path) -> None:
        self.conn = sqlite3.connect(root / "index.sqlite", isolation_level=None, timeout=30)
        self.conn.executescript(key_runs.SCHEMA)
        self.runs = KeyRuns(root / "index.sqlite.runs")

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            self.runs.rolled_back()
            raise
        self.runs.committed()

    def add(self, keys: np.ndarray, view: str = "clips") -> None:
        with self.write() as conn:
            self.runs.add(conn, view, [_packed(keys)])

    def settle(self, view: str = "clips") -> None:
        self.runs.settle(view, lambda: self.conn, self.write)

    def has(self, keys: np.ndarray, view: str = "clips") -> np.ndarray:
        order = np.argsort(keys.view(f"S{keys.shape[1]}").ravel(), kind="stable")
        out = np.zeros(len(keys), np.bool_)
        out[order] = self.runs.has(self.conn, view, _packed(keys[order]))
        return out


def _packed(keys: np.ndarray) -> Packed:
    return Packed(keys.shape[1], keys.tobytes(), np.arange(len(keys), dtype=np.int64))


def _keys(rng: np.random.Generator, n: int, width: int = 16) -> np.ndarray:
    return rng.integers(0, 256, (n, width), dtype=np.uint8)


def _files(store: _Store) -> list[str]:
    root = store.runs.root
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


@pytest.mark.parametrize("dense", [0, 1 << 30])
@pytest.mark.parametrize("width", [16, 20])
def test_a_probe_is_exact_at_block_edges_and_shared_heads(
    tmp_path: Path, width: int, dense: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heads (first 8 bytes) shared by runs of keys across block boundaries, a
    partial last block, keys below the first and above the last: every answer is
    the set's, whether the blocks read are searched key by key or all at once
    (``_DENSE``: 0 never, 2^30 always)."""
    monkeypatch.setattr(key_runs, "_DENSE", dense)
    rng = np.random.default_rng(width)
    keys = _keys(rng, 14 * key_runs.BLOCK + 17, width)
    keys[100:1400, :8] = 7  # 1300 keys with one head, spanning 10 blocks
    store = _Store(tmp_path)
    store.add(keys)
    probe = np.concatenate([keys, _keys(rng, 500, width)])
    probe[-50:, :8] = 7  # absent keys with the shared head
    probe[-60:-50] = 0  # below every key
    probe[-70:-60] = 255  # above every key
    want = {bytes(k) for k in keys}
    assert store.has(probe).tolist() == [bytes(k) in want for k in probe]
    for key in keys[100:1400:97]:  # alone: only its head's blocks are read
        assert store.has(key[None]).all()


def test_merges_keep_every_key_once_in_bounded_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_runs, "CHUNK_KEYS", 300)  # many chunks per merge input
    rng = np.random.default_rng(1)
    store, held = _Store(tmp_path), np.zeros((0, 16), np.uint8)
    for n in (2000, 400, 400, 90, 700):
        keys = np.concatenate([_keys(rng, n), held[: n // 4]])  # some already held
        store.add(keys)
        store.settle()
        held = np.unique(np.concatenate([held, keys]), axis=0)
    runs = store.runs.listed(store.conn, "clips")
    assert merge_plan([r.count for r in runs]) is None
    assert sum(r.count for r in runs) == len(held)  # each key once
    assert store.has(held).all() and not store.has(_keys(rng, 1000)).any()
    assert _files(store) == sorted(r.name for r in runs)  # merged inputs removed


def test_the_merge_plan_keeps_few_runs() -> None:
    assert merge_plan([1000, 100]) is None
    assert merge_plan([1000, 100, 25]) == 0  # 125 >= 1000 / 8
    assert merge_plan([1000, 50, 10]) == 1
    counts: list[int] = []
    for _ in range(400):  # 400 flushes of 10k keys
        counts = sorted([*counts, 10_000], reverse=True)
        while (start := merge_plan(counts)) is not None:
            counts = [*counts[:start], sum(counts[start:])]
    assert sum(counts) == 4_000_000 and len(counts) <= 5


def test_a_transaction_that_fails_leaves_no_run(tmp_path: Path) -> None:
    store = _Store(tmp_path)
    with pytest.raises(RuntimeError), store.write() as conn:
        store.runs.add(conn, "clips", [_packed(_keys(np.random.default_rng(2), 50))])
        raise RuntimeError("killed before COMMIT")
    assert _files(store) == [] and store.runs.listed(store.conn, "clips") == []


def test_a_crash_between_a_run_and_its_manifest_row_leaves_only_orphans(tmp_path: Path) -> None:
    """A process killed after writing (or renaming) a run but before the transaction
    that names it committed: the files are swept at the next open, under the write
    lock; a live process's temporary file is left alone."""
    rng = np.random.default_rng(3)
    store = _Store(tmp_path)
    keys = _keys(rng, 100)
    store.add(keys)
    root = store.runs.root
    (root / "clips-16-deadbeef.run").write_bytes(b"renamed, never named")
    (root / ".tmp-999999999-abc").write_bytes(b"a dead writer's")
    (root / f".tmp-{os.getpid()}-abc").write_bytes(b"a live writer's")
    other = _Store(tmp_path)
    with other.write() as conn:
        other.runs.sweep(conn)
    (named,) = other.runs.listed(other.conn, "clips")
    assert _files(other) == sorted([f".tmp-{os.getpid()}-abc", named.name])
    assert other.has(keys).all()


def test_a_merge_racing_a_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process merges the runs after this reader listed them and before it
    opened them (the inputs are gone): the reader lists again and answers right; a
    reader holding the old runs open keeps answering from them."""
    rng = np.random.default_rng(4)
    reader, writer = _Store(tmp_path), _Store(tmp_path)
    parts = [_keys(rng, n) for n in (800, 500, 300)]
    for part in parts[:2]:
        writer.add(part)
    old = _Store(tmp_path)
    assert old.has(parts[0]).all()  # holds both runs open
    writer.add(parts[2])
    listed = reader.runs.listed
    raced: list[bool] = []

    def list_then_merge(
        conn: sqlite3.Connection, view: str, width: int | None = None
    ) -> list[key_runs._Listed]:
        got = listed(conn, view, width)
        if not raced:
            raced.append(True)
            writer.settle()  # replaces every run reader just listed
        return got

    monkeypatch.setattr(reader.runs, "listed", list_then_merge)
    every = np.concatenate(parts)
    assert raced == [] and reader.has(every).all() and raced == [True]
    assert len(writer.runs.listed(writer.conn, "clips")) == 1
    assert not reader.has(_keys(rng, 200)).any()
    assert old.has(every[:1300]).all()  # unlinked files, still open


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[key_runs._HEADER.size + 5 * 16 + 3] ^= 0x40  # one byte of one key
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "zeros":
        data[key_runs._HEADER.size : key_runs._HEADER.size + 4096] = bytes(4096)
    else:
        data[-20] ^= 0xFF  # the checksum table
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "truncate", "zeros", "table", "deleted"])
def test_a_damaged_run_is_never_read_as_absent(tmp_path: Path, how: str) -> None:
    rng = np.random.default_rng(5)
    keys = _keys(rng, 2000)
    _Store(tmp_path).add(keys)
    store = _Store(tmp_path)
    (run,) = store.runs.listed(store.conn, "clips")
    path = store.runs.root / run.name
    if how == "deleted":
        path.unlink()
    else:
        _damage(path, how)
    with pytest.raises(RunDamaged, match=run.name):
        store.has(keys[:10])


def test_a_merge_refuses_a_damaged_input_rather_than_rewriting_its_checksums(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(6)
    big, small = _keys(rng, 2000), _keys(rng, 300)
    store = _Store(tmp_path)
    store.add(big)
    store.add(small)
    largest = store.runs.listed(store.conn, "clips")[0]
    _damage(store.runs.root / largest.name, "flip")
    with pytest.raises(RunDamaged, match=largest.name):
        store.settle()
    assert len(store.runs.listed(store.conn, "clips")) == 2  # nothing replaced


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["add", "merge", "probe", "clear"]), st.integers(0, 400)),
        min_size=1,
        max_size=14,
    ),
    seed=st.integers(0, 2**16),
)
def test_any_interleaving_answers_as_a_set(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    store, held = _Store(tmp_path_factory.mktemp("runs")), set[bytes]()
    pool = _keys(rng, 1500)
    pool[:200, :8] = 3  # shared heads
    for op, n in steps:
        if op == "add" and n:
            keys = pool[rng.integers(0, len(pool), n)]
            store.add(keys)
            held |= {bytes(k) for k in keys}
        elif op == "merge":
            store.settle()
        elif op == "clear":
            with store.write() as conn:
                store.runs.clear(conn, "clips")
            held.clear()
        probe = pool[rng.integers(0, len(pool), 300)]
        assert store.has(probe).tolist() == [bytes(k) in held for k in probe]
    listed = {r.name for r in store.runs.listed(store.conn, "clips")}
    assert set(_files(store)) == listed


def test_opening_the_index_sweeps_a_crashed_writers_files(tmp_path: Path) -> None:
    """A writer killed between writing its run and committing the row that names it
    leaves a file no one names; the next process to open the index removes it."""
    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig
    from catalog.key_index import index_path
    from tests.catalog._key_index_child import clip, ingest

    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 4, 2)
    root = Path(f"{index_path(config)}.runs")
    named = sorted(p.name for p in root.iterdir())
    (root / "clips-16-0123.run").write_bytes(b"renamed before the crash")
    (root / ".tmp-999999999-0123").write_bytes(b"written before the crash")
    with VidlakeCatalog.open(config) as cat:
        res = cat.add_clips([clip(i, k) for i in range(4) for k in range(3)])
        assert (res.inserted, res.duplicates) == (4, 8)
        assert sorted(p.name for p in root.iterdir()) == named


def test_a_view_holds_runs_of_two_widths_apart(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    short, long = _keys(rng, 300, 16), _keys(rng, 300, 20)
    long[:, :16] = short  # the same leading bytes: never confused
    store = _Store(tmp_path)
    store.add(short)
    store.add(long[:150])
    assert store.has(short).all()
    assert store.has(long).tolist() == [True] * 150 + [False] * 150
    assert sorted(r.width for r in store.runs.listed(store.conn, "clips")) == [16, 20]


def test_keys_clustered_in_far_apart_blocks_are_probed_in_one_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe's parts are bounded by the distinct blocks they read, not by where the
    blocks lie: an asset-keyed batch (a few blocks spread over the whole run) is one
    buffer and one search, where windows of the block range made one per window."""
    monkeypatch.setattr(key_runs, "PROBE_BLOCKS", 16)
    monkeypatch.setattr(key_runs, "_PART_BLOCKS", 4, raising=False)
    store = _Store(tmp_path)
    stored = np.unique(_keys(np.random.default_rng(3), 64 * key_runs.BLOCK).view("S16"))
    keys = stored.view(np.uint8).reshape(-1, 16)
    store.add(keys)
    picks = np.r_[5, 6, 30 * key_runs.BLOCK + 2, 60 * key_runs.BLOCK + 9]
    absent = keys[picks].copy()
    absent[:, 15] ^= 1  # neighbours of stored keys, in the same blocks
    parts: list[int] = []
    real = key_runs._probe_part

    def counted(run: object, part: np.ndarray, *args: object) -> np.ndarray:
        parts.append(len(part))
        return real(run, part, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(key_runs, "_probe_part", counted)
    probe = np.concatenate([keys[picks], absent])
    assert store.has(probe).tolist() == [True] * 4 + [
        bytes(k) in set(stored.tolist()) for k in absent
    ]
    assert parts == [8]
    parts.clear()
    many = keys[1 :: key_runs.BLOCK // 2]  # two keys in each of 64 blocks, none first
    assert store.has(many).all()
    assert len(parts) == 64 // 4 and sum(parts) == len(many)
