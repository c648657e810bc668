"""One writer at a time per cache database within a process, waiting on a lock.

Every fetch thread of an iterator leases and returns its part of a step in write
transactions (``BEGIN IMMEDIATE``) on its own connection. Two threads of one process
that begin at once met in SQLite's lock, and the loser slept in SQLite's busy handler
(1, 2, 5, 10, 15, 20, 25 … 100 ms between tries) however soon the winner committed:
8 MB rows, 128 a pass, spent up to 86 ms in one lease. A thread of the same process now
waits on :func:`writer` instead, and is woken the moment the other commits. Writers of
other processes still meet in SQLite's lock, as before.

The lock is re-entrant (a thread holding it may take it again) and per database path;
a forked child starts with fresh locks, since a thread of the parent may have held one.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["writer"]

_LOCKS: dict[str, threading.RLock] = {}
_GUARD = threading.Lock()


def writer(db_path: Path) -> threading.RLock:
    """The process's write lock for the database at ``db_path``."""
    key = os.fspath(db_path)
    with _GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = threading.RLock()
        return lock


def _after_fork_in_child() -> None:
    global _GUARD
    _GUARD = threading.Lock()
    _LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
