"""Fault injection on the on-disk key index between two ingests: the file deleted,
truncated, overwritten with garbage or with a few flipped bytes. Ingest rebuilds it
from the tables or fails clearly; it never accepts a duplicate key."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import VidlakeError
from catalog.key_index import KeyStore, index_path
from tests.catalog._key_index_child import asset, clip, ingest


def _delete(path: Path) -> None:
    path.unlink()
    for extra in ("-wal", "-shm"):
        Path(f"{path}{extra}").unlink(missing_ok=True)


def _truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def _header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:16] = b"not a database!\x00"
    path.write_bytes(bytes(data))


def _pages(path: Path) -> None:
    """Flip bytes in every page after the first (b-tree pages of the keys)."""
    data = bytearray(path.read_bytes())
    for at in range(1024 + 100, len(data), 1024):
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))


FAULTS: dict[str, Callable[[Path], None]] = {
    "deleted": _delete,
    "truncated": _truncate,
    "empty": _empty,
    "garbage": _garbage,
    "header": _header,
    "pages": _pages,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_index_never_lets_a_duplicate_in(tmp_path: Path, fault: str) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
        before = cat.scan("clips", include_eval=True).num_rows
    path = index_path(config)
    with VidlakeCatalog.open(config) as cat:  # checkpoint: the keys are in the main file
        cat.add_assets([asset(0)])
    for extra in ("-wal", "-shm"):
        Path(f"{path}{extra}").unlink(missing_ok=True)
    FAULTS[fault](path)
    with VidlakeCatalog.open(config) as cat:
        try:
            res = cat.add_clips([clip(i, k) for i in range(4, 6) for k in range(3)])
        except VidlakeError as exc:  # failing clearly is allowed: it must name the file
            assert str(path) in exc.message, exc.message
            assert cat.scan("clips", include_eval=True).num_rows == before
            return  # (and the message says how to recover: checked below)
        assert (res.inserted, res.duplicates) == (2, 4)
        assert cat.scan("clips", include_eval=True).num_rows == before + 2
        again = cat.add_assets([asset(i) for i in range(8)])
        assert (again.inserted, again.duplicates) == (2, 6)


@pytest.mark.parametrize("fault", ["garbage", "truncated"])
def test_a_lookup_that_meets_the_damage_rebuilds_its_view_first(tmp_path: Path, fault: str) -> None:
    """The file damaged after a sync, under an open store: the lookup must not answer
    from an empty, fresh file ("absent": a duplicate let in), but from the tables."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
    with VidlakeCatalog.open(config) as cat:  # its own store stays closed: no WAL kept
        store = KeyStore(index_path(config), cat.iceberg_table, config.near_dup_rule())
        store.sync("clips")
        ids = cat.scan("clips", include_eval=True)["clip_id"]
        store.close()
        FAULTS[fault](index_path(config))
        assert store.has("clips", ids).all()
        assert store.splits(cat.scan("assets", include_eval=True)["asset_id"]).count(None) == 0
        store.close()


@pytest.mark.parametrize("fault", ["garbage", "truncated", "deleted"])
def test_damage_under_an_open_catalog_never_lets_a_duplicate_in(tmp_path: Path, fault: str) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
        before = cat.scan("clips", include_eval=True).num_rows
        FAULTS[fault](index_path(config))
        res = cat.add_clips([clip(i, k) for i in range(4, 6) for k in range(3)])
        assert (res.inserted, res.duplicates) == (2, 4)
        again = cat.add_assets([asset(i) for i in range(8)])
        assert (again.inserted, again.duplicates) == (2, 6)
        assert cat.scan("clips", include_eval=True).num_rows == before + 2


def _run_files(config: CatalogConfig) -> list[Path]:
    return sorted(Path(f"{index_path(config)}.runs").glob("clips-*.run"))


def _key_byte(path: Path) -> None:
    """Flip one byte of the first key (after the 32-byte header)."""
    data = bytearray(path.read_bytes())
    data[32 + 3] ^= 0x10
    path.write_bytes(bytes(data))


RUN_FAULTS = {**FAULTS, "key byte": _key_byte}


@pytest.mark.parametrize("fault", ["deleted", "truncated", "garbage", "key byte"])
def test_a_damaged_run_file_never_lets_a_duplicate_in(tmp_path: Path, fault: str) -> None:
    """The clip keys' run files (catalog/key_runs.py) damaged between two ingests:
    the lookup that meets the damage rebuilds the index from the tables."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 6, 3)
        before = cat.scan("clips", include_eval=True).num_rows
    runs = _run_files(config)
    assert runs
    for path in runs:
        RUN_FAULTS[fault](path)
    with VidlakeCatalog.open(config) as cat:
        res = cat.add_clips([clip(i, k) for i in range(3, 6) for k in range(4)])
        assert (res.inserted, res.duplicates) == (6, 6)  # k = 2, 3 are new
        assert cat.scan("clips", include_eval=True).num_rows == before + 6


def test_an_index_of_the_old_layout_is_rebuilt(tmp_path: Path) -> None:
    """A file from before the run files (clip keys in a SQLite table, user_version
    0): its clip and latent views are dropped and rebuilt, the others kept."""
    import sqlite3

    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        ingest(cat, 0, 4, 2)
    path = index_path(config)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA user_version = 0")
    conn.execute("CREATE TABLE clips (k BLOB PRIMARY KEY) WITHOUT ROWID")
    conn.execute("DELETE FROM runs")
    conn.close()
    with VidlakeCatalog.open(config) as cat:
        res = cat.add_clips([clip(i, k) for i in range(4) for k in range(3)])
        assert (res.inserted, res.duplicates) == (4, 8)
    conn = sqlite3.connect(path)
    names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "clips" not in names and conn.execute("PRAGMA user_version").fetchone()[0] == 3
    conn.close()
