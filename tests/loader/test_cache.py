"""The node cache, point by point (docs/internals.md, "Node cache"; docs/cache.md).

In-process tests for each rule, a few real child processes where the rule is about
processes (one download across processes, fork, pickling, dead owners), and a
Hypothesis state machine that checks the cache against an exact LRU model.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from catalog.errors import CacheError, CacheFull, ChecksumMismatch, InvalidInput, StorageError
from loader import cache as cache_module
from loader.cache import NodeCache
from loader.owners import proc_stat

WORKER = Path(__file__).with_name("_cache_worker.py")


def _blob(i: int, size: int) -> bytes:
    return hashlib.shake_256(f"blob-{i}".encode()).digest(size)


class Source:
    """Objects by SHA-256 and a count of fetches per key."""

    def __init__(self, sizes: list[int]) -> None:
        blobs = [_blob(i, size) for i, size in enumerate(sizes)]
        self.blobs = {hashlib.sha256(b).hexdigest(): b for b in blobs}
        self.keys = list(self.blobs)
        self.fetches: Counter[str] = Counter()

    def size(self, key: str) -> int:
        return len(self.blobs[key])

    def fetch(self, key: str, payload: bytes | None = None) -> Callable[[Path], None]:
        def write(tmp: Path) -> None:
            self.fetches[key] += 1
            tmp.write_bytes(self.blobs[key] if payload is None else payload)

        return write

    def lease(self, cache: NodeCache, key: str) -> contextlib.AbstractContextManager[Path]:
        return cache.lease(key, self.size(key), self.fetch(key))

    def read(self, cache: NodeCache, key: str) -> bytes:
        with self.lease(cache, key) as path:
            return path.read_bytes()


@pytest.fixture
def src() -> Source:
    return Source([100, 200, 300, 400, 500, 600])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _open(root: Path, budget: int | None = 1000, **kw: Any) -> NodeCache:
    kw.setdefault("reserve_bytes", 0)
    return NodeCache(root, budget, **kw)


def payload_bytes(root: Path) -> int:
    """Bytes of every file the cache keeps besides its database (temp files included)."""
    return sum(
        p.stat().st_size for d in ("objects", "tmp") for p in (root / d).rglob("*") if p.is_file()
    )


def _flip(path: Path, offset: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _db(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "cache.db", isolation_level=None, timeout=30)


# -- addressing, download, verification ----------------------------------------------


def test_a_miss_fetches_once_and_later_hits_use_the_verified_file(root: Path, src: Source) -> None:
    key = src.keys[0]
    with _open(root) as cache:
        for _ in range(3):
            with src.lease(cache, key) as path:
                assert path == root / "objects" / key[:2] / key
                assert path.read_bytes() == src.blobs[key]
        stats = cache.stats()
    assert src.fetches[key] == 1
    assert (stats["hits"], stats["misses"], stats["bytes_downloaded"]) == (2, 1, src.size(key))
    assert (stats["entries"], stats["bytes"], stats["reserved"], stats["leases"]) == (
        1,
        src.size(key),
        0,
        0,
    )
    json.dumps(stats)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda b: b[:-1], id="short"),
        pytest.param(lambda b: b + b"x", id="long"),
        pytest.param(lambda b: bytes([b[0] ^ 1]) + b[1:], id="flipped"),
    ],
)
def test_a_download_with_wrong_bytes_is_refused_and_returns_its_reservation(
    root: Path, src: Source, bad: Callable[[bytes], bytes]
) -> None:
    key = src.keys[1]
    with _open(root) as cache:
        with (
            pytest.raises(ChecksumMismatch) as err,
            cache.lease(key, src.size(key), src.fetch(key, bad(src.blobs[key]))),
        ):
            pytest.fail("a lease on unverified bytes was granted")
        assert err.value.sha256 == key
        stats = cache.stats()
        assert (stats["reserved"], stats["bytes"], stats["entries"]) == (0, 0, 0)
        assert payload_bytes(root) == 0  # the temp file is gone, nothing was renamed
        assert src.read(cache, key) == src.blobs[key]  # and a later good fetch works


def test_a_failing_or_silent_fetch_returns_its_reservation(root: Path, src: Source) -> None:
    key = src.keys[2]

    def boom(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise OSError("network down")

    with _open(root) as cache:
        with pytest.raises(OSError, match="network down"), cache.lease(key, 300, boom):
            pass
        with pytest.raises(ChecksumMismatch), cache.lease(key, 300, lambda tmp: None):
            pass
        assert cache.stats()["reserved"] == 0
        assert payload_bytes(root) == 0
        assert not list((root / "tmp").iterdir())


def test_a_size_that_disagrees_with_the_cached_object_is_refused(root: Path, src: Source) -> None:
    key = src.keys[0]
    with _open(root) as cache:
        src.read(cache, key)
        with pytest.raises(ChecksumMismatch), cache.lease(key, 99, src.fetch(key)):
            pass


def test_bad_arguments_are_refused(root: Path, src: Source) -> None:
    with pytest.raises(InvalidInput):
        NodeCache(root, 0)
    with pytest.raises(InvalidInput):
        NodeCache(root, 10, reserve_bytes=-1)
    with _open(root) as cache:
        with pytest.raises(InvalidInput), cache.lease("ABC", 1, src.fetch(src.keys[0])):
            pass
        with pytest.raises(InvalidInput), cache.lease(src.keys[0], -1, src.fetch(src.keys[0])):
            pass
        with pytest.raises(InvalidInput):
            cache.gc(-5)


# -- budget and reservations ---------------------------------------------------------


def test_bytes_are_reserved_before_the_transfer_starts(root: Path, src: Source) -> None:
    key = src.keys[3]
    seen: dict[str, Any] = {}
    with _open(root) as cache:

        def fetch(tmp: Path) -> None:
            seen.update(cache.stats())
            tmp.write_bytes(src.blobs[key])

        with cache.lease(key, src.size(key), fetch):
            pass
    assert (seen["reserved"], seen["used_bytes"], seen["bytes"]) == (400, 400, 0)


def test_an_in_flight_download_counts_toward_the_budget(root: Path, src: Source) -> None:
    big, other = src.keys[5], src.keys[4]  # 600 + 500 > 1000
    started, release = threading.Event(), threading.Event()

    def slow(tmp: Path) -> None:
        started.set()
        release.wait(10)
        tmp.write_bytes(src.blobs[big])

    with _open(root) as cache:
        thread = threading.Thread(target=_lease_with, args=(cache, big, 600, slow))
        thread.start()
        assert started.wait(10)
        with pytest.raises(CacheFull) as err, src.lease(cache, other):
            pass
        release.set()
        thread.join(10)
    assert err.value.reason == "leased"
    assert (err.value.needed, err.value.budget, err.value.used, err.value.leased) == (
        500,
        1000,
        600,
        600,
    )


def _lease_with(cache: NodeCache, key: str, size: int, fetch: Callable[[Path], None]) -> None:
    with cache.lease(key, size, fetch):
        pass


def test_the_budget_is_stored_with_the_cache_and_a_different_one_is_refused(root: Path) -> None:
    with pytest.raises(CacheError, match="no node cache"):
        NodeCache(root, None)
    with _open(root, 1000):
        with pytest.raises(CacheError, match="budget_bytes=1000") as err:
            _open(root, 2000)
        assert (err.value.budget_bytes, err.value.requested) == (1000, 2000)
        with _open(root, None) as tool:
            assert tool.budget_bytes == 1000
        _open(root, 1000).close()


def test_an_object_larger_than_the_budget_is_refused(root: Path, src: Source) -> None:
    with _open(root, 550) as cache:
        with pytest.raises(CacheFull) as err, src.lease(cache, src.keys[5]):
            pass
        assert (err.value.reason, err.value.needed, err.value.budget) == ("too_large", 600, 550)
        assert src.fetches[src.keys[5]] == 0


def test_too_little_free_disk_is_refused_and_changes_nothing(root: Path, src: Source) -> None:
    with _open(root) as cache:
        src.read(cache, src.keys[0])
    free = shutil.disk_usage(root).free
    with _open(root, reserve_bytes=free + (1 << 30)) as cache:
        before = cache.stats()
        with pytest.raises(CacheFull) as err, src.lease(cache, src.keys[1]):
            pass
        assert err.value.reason == "disk"
        assert err.value.reserve == free + (1 << 30)
        after = cache.stats()
    assert {k: after[k] for k in ("entries", "bytes", "reserved", "misses", "evictions")} == {
        k: before[k] for k in ("entries", "bytes", "reserved", "misses", "evictions")
    }
    assert src.fetches[src.keys[1]] == 0


class Disk:
    """A simulated filesystem of ``capacity`` bytes holding the cache's payload plus
    ``tenant`` bytes that another program wrote: a free-space probe and a fetch that
    fails with ENOSPC, as a real write would, when the bytes do not fit."""

    def __init__(self, root: Path, capacity: int) -> None:
        self.root, self.capacity, self.tenant = root, capacity, 0
        self.enospc = 0

    def free(self, _root: Path) -> int:
        return self.capacity - self.tenant - payload_bytes(self.root)

    def fetch(self, src: Source, key: str) -> Callable[[Path], None]:
        def write(tmp: Path) -> None:
            src.fetches[key] += 1
            room = self.free(self.root)
            data = src.blobs[key]
            if len(data) > room:
                tmp.write_bytes(data[: max(room, 0)])  # a partial write
                self.enospc += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
            tmp.write_bytes(data)

        return write


def test_a_full_disk_evicts_unleased_lru_entries_before_the_budget_is_reached(
    root: Path, src: Source
) -> None:
    k100, k200, k300, k400, *_ = src.keys
    disk = Disk(root, 700)  # fills before the budget (1000) does
    with _open(root, disk_free=disk.free) as cache:
        for key in (k100, k200, k300):
            src.read(cache, key)
        src.read(cache, k100)  # k200 is now the least recently used
        with cache.lease(k400, 400, disk.fetch(src, k400)) as path:  # 600 + 400 > 700
            assert path.read_bytes() == src.blobs[k400]
        resident = {p.name for p in (root / "objects").rglob("*") if p.is_file()}
        assert resident == {k100, k400}  # k200 then k300 went, oldest first
        stats = cache.stats()
        assert (stats["evictions"], stats["bytes"]) == (2, 500) and disk.enospc == 0
        assert stats["disk_free_bytes"] == disk.free(root) == 200


def test_a_full_disk_with_every_entry_leased_is_refused_and_changes_nothing(
    root: Path, src: Source
) -> None:
    k100, k200, k300, k400, *_ = src.keys
    disk = Disk(root, 700)
    with _open(root, disk_free=disk.free) as cache:
        src.read(cache, k100)
        with src.lease(cache, k200), src.lease(cache, k300):
            before = cache.stats()
            with pytest.raises(CacheFull) as err, src.lease(cache, k400):
                pass
            after = cache.stats()
        assert (err.value.reason, err.value.needed, err.value.free_disk) == ("disk", 400, 100)
        assert {k: after[k] for k in ("entries", "bytes", "reserved", "misses", "evictions")} == {
            k: before[k] for k in ("entries", "bytes", "reserved", "misses", "evictions")
        }
        assert src.fetches[k400] == 0
        # Once the leases end, the same miss evicts and goes through.
        assert src.read(cache, k400) == src.blobs[k400]


def test_enospc_during_a_download_is_cache_full_disk_and_returns_the_reservation(
    root: Path, src: Source
) -> None:
    k100, k300 = src.keys[0], src.keys[2]
    calls: list[Path] = []

    def no_space(tmp: Path) -> None:  # a quota, say: the free-space probe sees room
        calls.append(tmp)
        tmp.write_bytes(src.blobs[k300][:120])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    with _open(root, full_wait_s=30) as cache:
        src.read(cache, k100)
        started = time.monotonic()
        with pytest.raises(CacheFull) as err, cache.lease(k300, 300, no_space):
            pass
        # Not waited on like a full budget: that would download it again and again.
        assert time.monotonic() - started < 5
        assert err.value.reason == "disk" and err.value.enospc is True
        assert isinstance(err.value.__cause__, OSError)
        assert err.value.__cause__.errno == errno.ENOSPC
        assert len(calls) == 2  # one retry, after the probe had another look
        stats = cache.stats()
        assert (stats["reserved"], stats["entries"]) == (0, 1)
        assert payload_bytes(root) == stats["bytes"] == 100
        assert not list((root / "tmp").iterdir())


def test_enospc_once_retries_after_evicting_what_the_disk_needs(root: Path, src: Source) -> None:
    k100, k200, k300, *_ = src.keys
    disk = Disk(root, 1000)
    with _open(root, disk_free=disk.free) as cache:
        src.read(cache, k100)
        src.read(cache, k200)  # 300 used, 700 free: the probe lets a 300-byte miss start
        fetch = disk.fetch(src, k300)
        calls: list[Path] = []

        def first_fails(tmp: Path) -> None:
            if not calls:
                disk.tenant = 500  # a checkpoint lands mid-download: 200 free
            calls.append(tmp)
            fetch(tmp)

        with cache.lease(k300, 300, first_fails) as path:
            assert path.read_bytes() == src.blobs[k300]
        assert len(calls) == 2 and disk.enospc == 1
        stats = cache.stats()
        assert stats["evictions"] == 1 and stats["bytes"] == 500  # k100 (LRU) made room


def test_enospc_wrapped_by_the_store_is_cache_full_disk(root: Path, src: Source) -> None:
    key = src.keys[0]

    def store_download(tmp: Path) -> None:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise StorageError(f"cannot write {tmp}: {exc}") from exc

    with _open(root) as cache:
        with pytest.raises(CacheFull) as err, cache.lease(key, 100, store_download):
            pass
        assert err.value.reason == "disk"
        assert cache.stats()["reserved"] == 0


def test_other_os_errors_in_a_fetch_are_not_disguised(root: Path, src: Source) -> None:
    def denied(tmp: Path) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp))

    with _open(root) as cache:
        with pytest.raises(PermissionError), cache.lease(src.keys[0], 100, denied):
            pass
        assert cache.stats()["reserved"] == 0


def test_a_full_disk_can_wait_for_leases_like_a_full_budget(root: Path, src: Source) -> None:
    k100, k200, *_ = src.keys
    disk = Disk(root, 250)
    with _open(root, disk_free=disk.free, full_wait_s=10) as cache:
        held = contextlib.ExitStack()
        held.enter_context(src.lease(cache, k100))
        threading.Timer(0.2, held.close).start()
        started = time.monotonic()
        assert src.read(cache, k200) == src.blobs[k200]  # waited for k100's lease
        assert 0.15 < time.monotonic() - started < 10
        assert cache.stats()["evictions"] == 1


def test_a_database_that_cannot_grow_is_cache_full_disk(root: Path) -> None:
    blobs = [_blob(i, 10) for i in range(400)]
    with _open(root, 1 << 20) as cache:
        # SQLite's own SQLITE_FULL: no page may be added (on the pool's one connection,
        # which every later transaction of this single thread borrows).
        with cache._borrowed() as conn:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(CacheFull) as err:
            for blob in blobs:
                key = hashlib.sha256(blob).hexdigest()
                with cache.lease(key, 10, lambda tmp, b=blob: tmp.write_bytes(b)):
                    pass
        assert err.value.reason == "disk"
        assert isinstance(err.value.__cause__, sqlite3.OperationalError)


def test_a_disk_free_probe_must_be_callable(root: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        _open(root, disk_free=42)  # type: ignore[arg-type]
    assert err.value.field == "disk_free"


# -- leases and eviction -------------------------------------------------------------


def test_eviction_is_lru_and_never_touches_a_leased_object(root: Path, src: Source) -> None:
    k100, k200, k300, k400, k500, _ = src.keys
    with _open(root) as cache:
        for key in (k100, k200, k300, k400):  # 1000 bytes: full
            src.read(cache, key)
        src.read(cache, k100)  # k200 is now the least recently used
        with src.lease(cache, k200) as held:
            src.read(cache, k500)  # needs 500: evicts k300 and k400, not the leased k200
            assert held.read_bytes() == src.blobs[k200]
        resident = {p.name for p in (root / "objects").rglob("*") if p.is_file()}
        assert resident == {k100, k200, k500}
        assert cache.stats()["evictions"] == 2
        assert payload_bytes(root) == cache.stats()["bytes"] == 800


def test_every_candidate_leased_raises_cache_full_with_figures(root: Path, src: Source) -> None:
    k100, k200, k300, k400, _, k600 = src.keys
    with _open(root) as cache, contextlib.ExitStack() as held:
        for key in (k100, k200, k300, k400):
            held.enter_context(src.lease(cache, key))
        with pytest.raises(CacheFull) as err, src.lease(cache, k600):
            pass
        exc = err.value
        assert (exc.reason, exc.needed, exc.budget, exc.used, exc.leased) == (
            "leased",
            600,
            1000,
            1000,
            1000,
        )
        assert exc.to_dict()["details"]["leased"] == 1000
        assert cache.stats()["entries"] == 4  # nothing was evicted for nothing


def test_full_wait_s_waits_for_a_lease_to_be_released(root: Path, src: Source) -> None:
    k100, k200, k300, k400, _, k600 = src.keys
    with _open(root, full_wait_s=10) as cache:
        stack = contextlib.ExitStack()
        for key in (k100, k200, k300, k400):
            stack.enter_context(src.lease(cache, key))
        timer = threading.Timer(0.2, stack.close)
        timer.start()
        assert src.read(cache, k600) == src.blobs[k600]
        timer.join()


def test_one_download_when_threads_ask_at_once(root: Path, src: Source) -> None:
    key = src.keys[4]
    gate = threading.Barrier(6)
    results: list[bytes] = []

    def slow_fetch(tmp: Path) -> None:
        src.fetches[key] += 1
        time.sleep(0.2)
        tmp.write_bytes(src.blobs[key])

    def reader(cache: NodeCache) -> None:
        gate.wait()
        with cache.lease(key, src.size(key), slow_fetch) as path:
            results.append(path.read_bytes())

    with _open(root) as cache:
        threads = [threading.Thread(target=reader, args=(cache,)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert cache.stats()["leases"] == 0
    assert results == [src.blobs[key]] * 6
    assert src.fetches[key] == 1


def _worker(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _events(folder: Path) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for log in folder.glob("*.log"):
        for line in log.read_text().splitlines():
            event, key = line.split()[:2]
            counts[event, key] += 1
    return counts


def _write_src(tmp_path: Path, src: Source) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    for key, data in src.blobs.items():
        (folder / key).write_bytes(data)
    return folder


def test_one_download_when_processes_ask_at_once(tmp_path: Path, root: Path, src: Source) -> None:
    key = src.keys[5]
    cfg = {
        "mode": "lease",
        "root": str(root),
        "budget": 1000,
        "src": str(_write_src(tmp_path, src)),
        "events": str(tmp_path / "events"),
        "key": key,
        "size": src.size(key),
        "fetch_delay_s": 0.5,  # a wide window for the others to arrive in
    }
    procs = [_worker(cfg) for _ in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    events = _events(tmp_path / "events")
    assert events["fetch", key] == 1
    assert events["read", key] == 4 and events["bad", key] == 0
    with _open(root) as cache:
        stats = cache.stats()
    assert (stats["misses"], stats["hits"], stats["leases"]) == (1, 3, 0)


# -- verification on hit -------------------------------------------------------------


def test_a_flipped_byte_is_detected_on_the_next_hit_and_refetched(root: Path, src: Source) -> None:
    key = src.keys[2]
    with _open(root) as cache:
        src.read(cache, key)
        src.read(cache, key)  # verified by this process: the fast path now applies
        _flip(cache.path_of(key), 123)
        assert src.read(cache, key) == src.blobs[key]
        assert src.fetches[key] == 2
        assert cache.stats()["corrupt_refetches"] == 1
        # A process that never verified the file hashes it on its first hit.
        _flip(cache.path_of(key), 7)
        with _open(root) as fresh:
            assert src.read(fresh, key) == src.blobs[key]
        assert src.fetches[key] == 3
        stats = cache.stats()
        assert (stats["corrupt_refetches"], stats["hits"]) == (2, 1)


def test_a_missing_or_truncated_file_is_refetched(root: Path, src: Source) -> None:
    a, b = src.keys[0], src.keys[1]
    with _open(root, verify_hits=False) as cache:
        src.read(cache, a)
        src.read(cache, b)
        cache.path_of(a).unlink()
        with open(cache.path_of(b), "r+b") as f:
            f.truncate(10)
        assert src.read(cache, a) == src.blobs[a]
        assert src.read(cache, b) == src.blobs[b]
    assert (src.fetches[a], src.fetches[b]) == (2, 2)


def test_hits_hash_unless_this_process_verified_the_unchanged_file(
    root: Path, src: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = src.keys[3]
    hashed: list[str] = []
    real = cache_module.sha256_file

    def counting(path: str | Path) -> tuple[str, int]:
        hashed.append(str(path))
        return real(path)

    monkeypatch.setattr(cache_module, "sha256_file", counting)
    with _open(root) as cache:
        src.read(cache, key)  # the download is hashed
        src.read(cache, key)  # the file this process verified: not hashed again
        assert len(hashed) == 1
        with _open(root) as other:  # the memory is the process's, per root
            src.read(other, key)
            src.read(other, key)
        assert len(hashed) == 1
        os.utime(cache.path_of(key))  # any change of the file voids the fast path
        src.read(cache, key)
        assert len(hashed) == 2
        with _open(root, verify_hits=False) as unverified:
            src.read(unverified, key)
        assert len(hashed) == 2
    assert src.fetches[key] == 1


# -- maintenance ---------------------------------------------------------------------


def test_verify_rehashes_everything_and_drops_corrupt_entries(root: Path, src: Source) -> None:
    with _open(root) as cache:
        for key in src.keys[:3]:
            src.read(cache, key)
        _flip(cache.path_of(src.keys[1]), 5)
        stray = root / "objects" / "ab" / ("ab" + "0" * 62)
        stray.parent.mkdir(exist_ok=True)
        stray.write_bytes(b"not accounted for")
        report = cache.verify()
        json.dumps(report)
        assert report["checked"] == 3 and report["ok"] == 2
        assert report["corrupt"] == [src.keys[1]]
        assert report["bytes_checked"] == 100 + 300
        assert report["orphans_removed"] == 1 and not stray.exists()
        assert cache.stats()["bytes"] == payload_bytes(root) == 400
        assert src.read(cache, src.keys[1]) == src.blobs[src.keys[1]]


def test_gc_evicts_unleased_entries_lru_first_down_to_the_target(root: Path, src: Source) -> None:
    k100, k200, k300, k400 = src.keys[:4]
    with _open(root) as cache:
        for key in (k100, k200, k300, k400):
            src.read(cache, key)
        with src.lease(cache, k100):
            report = cache.gc(0)
        json.dumps(report)
        assert report["evicted"] == 3 and report["bytes_freed"] == 900
        assert report["used_bytes"] == 100 and report["leased_bytes"] == 100
        assert cache.gc()["evicted"] == 0  # under the budget already
        assert payload_bytes(root) == 100


# -- processes: pickling, fork, dead owners -----------------------------------------


def test_pickles_without_connections_and_reopens_in_a_child(
    tmp_path: Path, root: Path, src: Source
) -> None:
    key = src.keys[0]
    with _open(root, verify_hits=False) as cache:
        src.read(cache, key)
        blob = pickle.dumps(cache)
        assert b"sqlite3" not in blob
        copy = pickle.loads(blob)
        assert (copy.budget_bytes, copy.verify_hits) == (1000, False)
        (tmp_path / "cache.pkl").write_bytes(blob)
        cfg = {
            "mode": "lease",
            "pickle": str(tmp_path / "cache.pkl"),
            "src": str(_write_src(tmp_path, src)),
            "events": str(tmp_path / "events"),
            "key": key,
            "size": src.size(key),
        }
        proc = _worker(cfg)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out)["hits"] == 1
        copy.close()
    assert _events(tmp_path / "events")["read", key] == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_uses_its_own_connection_and_identity(root: Path, src: Source) -> None:
    a, b = src.keys[0], src.keys[1]
    with _open(root) as cache:
        src.read(cache, a)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                ok = src.read(cache, a) == src.blobs[a] and src.read(cache, b) == src.blobs[b]
                code = 0 if ok else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        stats = cache.stats()  # the parent's connection still works
        assert (stats["entries"], stats["hits"], stats["misses"], stats["leases"]) == (2, 1, 2, 0)


def test_opening_reclaims_what_dead_processes_left(root: Path, src: Source) -> None:
    ready, downloading = src.keys[0], src.keys[1]
    dead = _dead_pid()
    with _open(root) as cache:
        src.read(cache, ready)
        me = cache._proc
    db = _db(root)
    # A dead reader's lease, a lease from a reused pid (ours, another start time), and a
    # dead download that crashed after its rename but before its commit.
    db.execute(
        "INSERT INTO leases (sha256, pid, pid_start, pid_ns, at) VALUES (?, ?, ?, ?, 0), "
        "(?, ?, ?, ?, 0)",
        (ready, dead, 1, me.ns, ready, me.pid, me.start - 1, me.ns),
    )
    db.execute(
        "INSERT INTO entries (sha256, size, state, gen, pid, pid_start, pid_ns, last_access)"
        " VALUES (?, 200, 'downloading', 'g1', ?, 1, ?, 0)",
        (downloading, dead, me.ns),
    )
    (root / "tmp" / "g1").mkdir()
    (root / "tmp" / "g1" / downloading).write_bytes(b"half")
    (root / "tmp" / "stray").mkdir()
    final = root / "objects" / downloading[:2] / downloading
    final.parent.mkdir(exist_ok=True)
    final.write_bytes(src.blobs[downloading])
    db.close()
    with _open(root) as cache:
        stats = cache.stats()
        assert (stats["leases"], stats["reserved"], stats["entries"]) == (0, 0, 1)
        assert stats["reclaimed"] == 4
        assert not list((root / "tmp").iterdir()) and not final.exists()
        assert payload_bytes(root) == stats["bytes"] == 100
        assert src.read(cache, downloading) == src.blobs[downloading]


def test_a_killed_zombie_holds_nothing(root: Path, src: Source) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = proc_stat(proc.pid)
    assert start is not None
    with _open(root) as cache:
        src.read(cache, src.keys[0])
        ns = cache._proc.ns
    db = _db(root)
    db.execute(
        "INSERT INTO leases (sha256, pid, pid_start, pid_ns, at) VALUES (?, ?, ?, ?, 0)",
        (src.keys[0], proc.pid, start[1], ns),
    )
    db.close()
    with _open(root) as cache:
        assert cache.stats()["leases"] == 1  # alive: its lease stands
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (proc_stat(proc.pid) or ("Z", 0))[0] != "Z":  # not reaped yet
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with _open(root) as cache:
        assert cache.stats()["leases"] == 0
    proc.wait()


def test_a_waiter_takes_over_the_download_of_a_dead_owner(root: Path, src: Source) -> None:
    key = src.keys[2]
    with _open(root) as cache:
        db = _db(root)
        db.execute(
            "INSERT INTO entries (sha256, size, state, gen, pid, pid_start, pid_ns, last_access)"
            " VALUES (?, 300, 'downloading', 'g2', ?, 1, ?, 0)",
            (key, _dead_pid(), cache._proc.ns),
        )
        db.close()
        assert src.read(cache, key) == src.blobs[key]
        assert cache.stats()["reclaimed"] == 1


def test_waiting_for_a_live_downloader_can_time_out(root: Path, src: Source) -> None:
    key = src.keys[2]
    with _open(root) as cache:
        me = cache._proc
        db = _db(root)
        db.execute(
            "INSERT INTO entries (sha256, size, state, gen, pid, pid_start, pid_ns, last_access)"
            " VALUES (?, 300, 'downloading', 'g3', ?, ?, ?, 0)",
            (key, me.pid, me.start, me.ns),
        )
        db.close()
        started = time.monotonic()
        with (
            pytest.raises(CacheError, match="timed out"),
            cache.lease(key, 300, src.fetch(key), timeout=0.2),
        ):
            pass
        assert time.monotonic() - started < 5
        assert src.fetches[key] == 0


def test_a_closed_cache_refuses_work(root: Path, src: Source) -> None:
    cache = _open(root)
    with src.lease(cache, src.keys[0]):
        cache.close()  # the lease still ends cleanly after close
    with pytest.raises(CacheError, match="closed"):
        cache.stats()
    cache.close()
    with _open(root) as again:
        assert again.stats()["leases"] == 0


def test_the_cache_module_imports_no_service_dependency() -> None:
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'fastapi', 'duckdb', 'pyiceberg', 'lancedb',"
        " 'materializer', 'service', 'torch', 'pyarrow'}:\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import loader.cache\n"
    )
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr


# -- the cache against an exact model ------------------------------------------------

_MODEL_SIZES = [5, 9, 13, 17, 21, 30, 40]
_MODEL_BUDGET = 64


class CacheAgainstModel(RuleBasedStateMachine):
    """Random leases, releases, byte flips, gc and verify; the cache must match an LRU
    model exactly (which object is fetched, evicted, refused) and keep its books."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.root = Path(self.dir.name)
        self.cache = NodeCache(self.root, _MODEL_BUDGET, reserve_bytes=0)
        self.src = Source(_MODEL_SIZES)
        self.lru: OrderedDict[str, None] = OrderedDict()  # resident keys, oldest first
        self.corrupt: set[str] = set()
        self.held: list[tuple[str, contextlib.ExitStack]] = []

    def _pinned(self) -> set[str]:
        return {key for key, _ in self.held}

    def _victims(self, target: int) -> tuple[list[str], bool]:
        """Unleased keys, oldest first, to evict until at most ``target`` bytes are
        used, and whether that target is reached."""
        used = sum(self.src.size(k) for k in self.lru)
        victims, pinned = [], self._pinned()
        for key in self.lru:
            if used <= target:
                break
            if key not in pinned:
                victims.append(key)
                used -= self.src.size(key)
        return victims, used <= target

    def _evicted(self, victims: list[str]) -> None:
        for key in victims:
            del self.lru[key]
            self.corrupt.discard(key)

    @rule(i=st.integers(0, len(_MODEL_SIZES) - 1), hold=st.booleans())
    def lease(self, i: int, hold: bool) -> None:
        key = self.src.keys[i]
        size = self.src.size(key)
        if key in self.corrupt:  # detected on the hit, dropped
            self.corrupt.discard(key)
            del self.lru[key]
        miss = key not in self.lru
        victims, room = self._victims(_MODEL_BUDGET - size) if miss else ([], True)
        full = not room
        before = self.src.fetches[key]
        stack = contextlib.ExitStack()
        try:
            path = stack.enter_context(self.src.lease(self.cache, key))
        except CacheFull as exc:
            assert full, "refused although the model had room"
            assert exc.leased + size > _MODEL_BUDGET
            assert self.src.fetches[key] == before
            return
        self.held.append((key, stack))  # teardown releases it whatever happens below
        assert not full, "granted although every candidate is leased"
        assert path.read_bytes() == self.src.blobs[key]
        assert self.src.fetches[key] == before + miss
        self._evicted(victims)
        self.lru[key] = None
        self.lru.move_to_end(key)
        if not hold:
            self.held.pop()
            stack.close()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        _, stack = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        stack.close()

    def _flippable(self) -> list[str]:
        # Not twice: a second flip of the same byte would restore the original.
        return sorted(set(self.lru) - self._pinned() - self.corrupt)

    @precondition(lambda self: self._flippable())
    @rule(data=st.data())
    def flip(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self._flippable()))
        _flip(self.cache.path_of(key), data.draw(st.integers(0, self.src.size(key) - 1)))
        self.corrupt.add(key)

    @rule(goal=st.integers(0, _MODEL_BUDGET))
    def gc(self, goal: int) -> None:
        victims, _ = self._victims(goal)  # short of the target, all unleased go
        report = self.cache.gc(goal)
        assert report["evicted"] == len(victims)
        self._evicted(victims)

    @rule()
    def verify(self) -> None:
        report = self.cache.verify()
        assert sorted(report["corrupt"]) == sorted(self.corrupt)
        for key in self.corrupt:
            del self.lru[key]
        self.corrupt.clear()

    @invariant()
    def books_match_disk(self) -> None:
        stats = self.cache.stats()
        expected = sum(self.src.size(k) for k in self.lru)
        assert stats["bytes"] == expected == payload_bytes(self.root)
        assert stats["used_bytes"] <= _MODEL_BUDGET
        assert (stats["entries"], stats["reserved"]) == (len(self.lru), 0)
        assert stats["leases"] == len(self.held)

    def teardown(self) -> None:
        for _, stack in self.held:
            stack.close()
        self.cache.close()
        self.dir.cleanup()


CacheAgainstModel.TestCase.settings = settings(
    max_examples=30, stateful_step_count=25, deadline=None, database=None
)
test_cache_against_model = CacheAgainstModel.TestCase
