"""The node cache's WAL anchor (loader.cache_anchor): an iterator's end is a close.

When the last connection to a WAL database closes, SQLite checkpoints the log and
deletes it; an iterator's cache used to pay that at every end (2-100 ms). These tests
check the effect without timing: the ``-wal`` file outlives the cache object, a
database re-created at the same path gets an anchor of its own, and the anchors stay
bounded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import loader.cache_anchor as anchor
from loader.cache import NodeCache

MB = 1 << 20


def _touch(cache: NodeCache, payload: bytes = b"x" * 100) -> None:
    """One miss (a write transaction into the WAL) and its release."""
    from catalog.hashing import sha256_bytes

    with cache.lease(sha256_bytes(payload), len(payload), lambda p: p.write_bytes(payload)):
        pass


def test_closing_the_last_cache_keeps_the_wal(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "c", 16 * MB, reserve_bytes=0)
    _touch(cache)
    cache.close()
    # Without an anchor SQLite checkpoints and deletes the log on this close.
    assert (tmp_path / "c" / "cache.db-wal").exists()
    again = NodeCache(tmp_path / "c", 16 * MB, reserve_bytes=0)
    assert again.stats()["entries"] == 1
    again.close()


def test_a_recreated_database_gets_its_own_anchor(tmp_path: Path) -> None:
    root = tmp_path / "c"
    NodeCache(root, 16 * MB, reserve_bytes=0).close()
    old = anchor._ANCHORS[str(root / "cache.db")]
    shutil.rmtree(root)
    cache = NodeCache(root, 16 * MB, reserve_bytes=0)
    _touch(cache)
    cache.close()
    new = anchor._ANCHORS[str(root / "cache.db")]
    assert new[0] != old[0]  # another file
    assert old[1] in anchor._PARKED  # never closed: it would delete the new -wal
    assert (root / "cache.db-wal").exists()


def test_anchors_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anchor, "MAX_ANCHORS", 2)
    for i in range(4):
        NodeCache(tmp_path / str(i), 16 * MB, reserve_bytes=0).close()
    held = [p for p in anchor._ANCHORS if p.startswith(str(tmp_path))]
    assert held == [str(tmp_path / n / "cache.db") for n in ("2", "3")]
