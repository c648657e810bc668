"""Two threads of one process writing to one cache database queue on a lock: the
second begins as soon as the first commits, not after SQLite's busy-handler sleeps."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from loader.cache import NodeCache
from loader.cache_writers import writer


def test_a_second_writer_thread_begins_as_soon_as_the_first_commits(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", 1 << 20, reserve_bytes=0)
    late = [_second_writer_late_by(cache) for _ in range(2)]
    cache.close()
    # Before: the second thread met SQLITE_BUSY and slept its way to ~180 ms (~40 late).
    assert max(late) < 0.020, late


def _second_writer_late_by(cache: NodeCache) -> float:
    inside, committed, entered = threading.Event(), [0.0], [0.0]
    with cache._borrowed(), cache._borrowed():
        pass  # two idle connections: the second thread does not open one in the window

    def first() -> None:
        with cache._tx() as db:
            db.execute("SELECT 1").fetchone()
            inside.set()
            # SQLite's busy handler retries after 0, 1, 3, 8 … 78, 103, 128, 178 ms
            time.sleep(0.140)
        committed[0] = time.perf_counter()

    def second() -> None:
        inside.wait()
        time.sleep(0.002)
        with cache._tx() as db:
            entered[0] = time.perf_counter()
            db.execute("SELECT 1").fetchone()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return entered[0] - committed[0]


def test_the_write_lock_is_one_per_database_and_reentrant(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "cache.db", tmp_path / "b" / "cache.db"
    assert writer(a) is writer(Path(str(a))) and writer(a) is not writer(b)
    with writer(a), writer(a):  # a thread holding it may take it again
        pass
