"""The on-disk key index (catalog/key_index.py): kept consistent with commits, rebuilt
when missing or stale, shared by processes, and never ahead of Iceberg after a crash."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.table import Table

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.key_index import KeyStore, index_path
from catalog.key_index_rows import digests
from catalog.maintenance.compact import compact_table
from tests.catalog._key_index_child import asset, clip, ingest

CHILD = [sys.executable, "-m", "tests.catalog._key_index_child"]


def _clip_ids(cat: VidlakeCatalog) -> pa.ChunkedArray:
    return cat.scan("clips", include_eval=True)["clip_id"]


def _scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the tables fully scanned from now on."""
    seen: list[str] = []
    real = Table.scan

    def spy(self: Table, *args: Any, **kwargs: Any) -> Any:
        seen.append(self.name()[-1])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Table, "scan", spy)
    return seen


def test_a_new_process_checks_keys_without_reading_the_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key cache once re-read every key of assets and clips in each new process
    (memory and time growing with the catalog); the index is read from disk."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
    scans = _scans(monkeypatch)
    with VidlakeCatalog.open(config) as cat:
        res = cat.add_clips([clip(i, k) for i in range(4, 6) for k in range(3)])
        assert (res.inserted, res.duplicates) == (2, 4)
    assert [t for t in scans if t in ("assets", "clips")] == []


def test_a_missing_index_is_rebuilt_from_the_tables(catalog_config: CatalogConfig) -> None:
    with VidlakeCatalog.open(catalog_config) as cat:
        ingest(cat, 0, 4, 2)
    path = index_path(catalog_config)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with VidlakeCatalog.open(catalog_config) as cat:
        assert cat.add_assets([asset(i) for i in range(3, 6)]).duplicates == 1
        res = cat.add_clips([clip(i, 0) for i in range(6)])
        assert (res.inserted, res.duplicates) == (2, 4)
    assert path.is_file()


def test_compaction_keeps_the_index_and_writers_see_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``replace`` snapshot changes no keys: the index skips it (no rebuild). A
    second catalog with an index of its own (another host) catches up by appends."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    other = config.model_copy(update={"key_index": str(tmp_path / "host2.sqlite")})
    with VidlakeCatalog.open(config) as one, VidlakeCatalog.open(other) as two:
        ingest(one, 0, 6, 2)
        assert two.add_clips([clip(0, 0)]).duplicates == 1  # host 2 builds its index
        compact_table(one.iceberg_table("clips"), sort_by=("clip_id",), target_bytes=1 << 20)
        scans = _scans(monkeypatch)
        assert one.add_clips([clip(i, 2) for i in (4, 5)]).inserted == 2
        assert two.add_clips([clip(i, k) for i in (4, 5) for k in (1, 2)]).duplicates == 4
        assert [t for t in scans if t == "clips"] == []
        assert len(_clip_ids(one)) == 14


@pytest.mark.slow  # two child interpreters (~14 s here)
def test_a_writer_killed_after_its_commit_leaves_the_index_behind_not_wrong(
    tmp_path: Path,
) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 4, 4)
    for mode, (lo, hi) in (("die_after_commit", (0, 2)), ("die_in_index_write", (2, 3))):
        done = subprocess.run([*CHILD, mode, config.model_dump_json(), str(lo), str(hi)])
        assert done.returncode == 3
    with VidlakeCatalog.open(config) as cat:
        # The first child's commit landed; the second died catching the index up
        # (the first left it behind), before its own commit.
        assert len(_clip_ids(cat)) == 12
        store = KeyStore(index_path(config), cat.iceberg_table, config.near_dup_rule())
        res = cat.add_clips([clip(i, k) for i in range(4) for k in range(4)])
        assert (res.inserted, res.duplicates) == (4, 12)
        store.sync("clips")
        assert store.has("clips", _clip_ids(cat)).all()
        store.close()


@pytest.mark.slow  # a child interpreter (~6 s here)
def test_the_index_holds_only_committed_keys_after_a_crash_in_its_write(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 4, 4)
        before = set(_clip_ids(cat).to_pylist())
    done = subprocess.run([*CHILD, "die_in_index_write", config.model_dump_json(), "0", "4"])
    assert done.returncode == 3
    with VidlakeCatalog.open(config) as cat:
        after = _clip_ids(cat)
        assert len(after) == 16  # the child's commit landed; its index write did not
        store = KeyStore(index_path(config), cat.iceberg_table, config.near_dup_rule())
        new = pa.array(sorted(set(after.to_pylist()) - before))
        assert not store.has("clips", new).any()  # rolled back with its meta row
        store.sync("clips")
        assert store.has("clips", new).all()
        store.close()


@pytest.mark.slow  # three child interpreters (~15 s here)
def test_two_processes_with_overlapping_keys_share_one_index(tmp_path: Path) -> None:
    """Two writers on one index file and a third with its own (another host), all with
    overlapping assets and clips: no duplicate row, no lost row."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    VidlakeCatalog.open(config).close()
    other = config.model_copy(update={"key_index": str(tmp_path / "host2.sqlite")})
    runs = [(config, 0, 30), (config, 15, 45), (other, 10, 40)]
    procs = [
        subprocess.Popen([*CHILD, "ingest", c.model_dump_json(), str(lo), str(hi)])
        for c, lo, hi in runs
    ]
    assert [p.wait(240) for p in procs] == [0, 0, 0]
    with VidlakeCatalog.open(config) as cat:
        assets = cat.scan("assets", include_eval=True)["asset_id"]
        clips = _clip_ids(cat)
        assert len(assets) == 45 and pc.count_distinct(assets).as_py() == 45
        assert len(clips) == 90 and pc.count_distinct(clips).as_py() == 90


def test_key_digests_are_the_ids_bytes_or_a_longer_hash() -> None:
    """Hex ids are stored as their bytes (exact, vectorised); any other key (a latent
    key, an uppercase id) as 20 bytes of its SHA-256, a length no id has."""
    ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(5)]
    sliced = pa.array(["x", *ids]).slice(1)
    assert digests(sliced) == [bytes.fromhex(i) for i in ids]
    assert digests(pa.array([i[:32] for i in ids])) == [bytes.fromhex(i[:32]) for i in ids]
    upper, lower = digests(pa.array(["AB" * 16, "ab" * 16]))
    assert lower == b"\xab" * 16 and len(upper) == 20
    assert digests(pa.array(["c\x1f720p"])) == [hashlib.sha256(b"c\x1f720p").digest()[:20]]
