"""One idle SQLite connection per node-cache database per process: the WAL's anchor.

When the last connection to a WAL database closes, SQLite checkpoints the whole log
into the database, fsyncs it and deletes the ``-wal`` and ``-shm`` files; the next
connection creates them again. Every :class:`loader.cache.NodeCache` of an iterator
closes its connections when the iterator ends, so without an anchor each epoch, each
evaluation pass and each resume paid that checkpoint (2-100 ms measured on a busy
node) and re-created the log. :func:`hold` keeps one connection open, outside any
transaction, so that closing the others is only a close. It changes nothing SQLite
guarantees: commits are durable as before and automatic checkpoints still run.

Anchors are bounded (the last :data:`MAX_ANCHORS` databases opened) and follow the
file: a database deleted and created again at the same path gets a new anchor. An
anchor whose file is no longer at its path is parked, never closed (SQLite deletes
the ``-wal`` file *by name* when the last connection closes: it would be the new
database's); so are anchors inherited through fork(), as the cache's own inherited
connections are.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections import OrderedDict

__all__ = ["MAX_ANCHORS", "hold", "release_all"]

#: Databases a process keeps an anchor for (least recently opened released first).
MAX_ANCHORS = 8

#: path -> (the database file's (device, inode), its anchor connection)
_ANCHORS: OrderedDict[str, tuple[tuple[int, int], sqlite3.Connection]] = OrderedDict()
_LOCK = threading.Lock()
#: Anchors never to be used or closed: inherited through fork(), or of a file that
#: was replaced at its path.
_PARKED: list[sqlite3.Connection] = []


def hold(db_path: str) -> None:
    """Keep an idle connection to the WAL database ``db_path`` open in this process.

    Call it after the database exists and is in WAL mode. Errors are ignored: an
    anchor only saves time."""
    try:
        st = os.stat(db_path)
    except OSError:
        return
    ident = (st.st_dev, st.st_ino)
    with _LOCK:
        known = _ANCHORS.get(db_path)
        if known is not None and known[0] == ident:
            _ANCHORS.move_to_end(db_path)
            return
        if known is not None:
            _PARKED.append(known[1])
        evicted = []
        try:
            conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
            # A read maps the WAL index: from then on this connection counts as one
            # attached to the log, and others closing leave it alone.
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error:
            return
        _ANCHORS[db_path] = (ident, conn)
        _ANCHORS.move_to_end(db_path)
        while len(_ANCHORS) > MAX_ANCHORS:
            evicted.append(_ANCHORS.popitem(last=False))
    for path, (was, old) in evicted:
        _release(path, was, old)


def release_all() -> None:
    """Close (or park) every anchor of this process: for tools and tests that want
    the cache's files closed; the next cache opened takes a new one."""
    with _LOCK:
        held = list(_ANCHORS.items())
        _ANCHORS.clear()
    for path, (ident, conn) in held:
        _release(path, ident, conn)


def _release(path: str, ident: tuple[int, int], conn: sqlite3.Connection) -> None:
    """Close an evicted anchor if its file is still the one at ``path``, else park it."""
    try:
        st = os.stat(path)
        same = (st.st_dev, st.st_ino) == ident
    except OSError:
        same = False
    if not same:
        _PARKED.append(conn)
        return
    with contextlib.suppress(sqlite3.Error):
        conn.close()


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    _PARKED.extend(conn for _, conn in _ANCHORS.values())
    _ANCHORS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
