"""The node cache: one bounded, verified, SHA-256-addressed object cache per machine.

Every process of a node (ranks, DataLoader workers, the CLI) opens the same directory::

    <root>/cache.db                SQLite (WAL): budget, entries, leases, statistics
    <root>/objects/ab/abcd…        ready objects, named by their SHA-256
    <root>/tmp/<token>/abcd…       downloads in flight, one private folder each

How it stays correct (docs/cache.md has the long version):

* **Reserve, then transfer.** A miss inserts a ``downloading`` row holding the object's
  size inside a write transaction, evicting unleased LRU entries first, so that the
  bytes of ready *and* in-flight objects never exceed the budget. Files are unlinked
  inside that transaction, before the reservation is visible, so the bytes on disk
  never exceed the accounted bytes either. A failed download deletes its temp folder
  and then its row (its reservation) in one transaction.
* **One download per object.** The row is the inter-process lock: whoever inserts it
  downloads; others poll it until it turns ``ready`` (or its owner dies).
* **Leases.** A reader inserts a lease row before it touches the file; eviction, inside
  a write transaction, only picks entries without lease rows.
* **Verified bytes only.** A download is hashed before it is renamed into place. A hit
  is stat-checked (size) and, with ``verify_hits``, hashed — unless this process has
  already verified the very same file (same device, inode, size, mtime and ctime: any
  write through the filesystem changes mtime/ctime, and ctime cannot be set back). A
  corrupt hit is dropped and fetched again.
* **Dead processes.** Leases and downloads carry the owner's pid, its start time (from
  ``/proc/<pid>/stat``, so that a reused pid does not look alive) and its pid
  namespace; opening the cache reclaims what dead owners left. Rows from an earlier
  boot are all dead (process identities: :mod:`loader.owners`; the SQLite schema:
  :mod:`loader.cache_schema`).

Why this module is over 500 lines: :class:`NodeCache` is one class whose lease,
download, reclaim and maintenance paths each run write transactions on the same rows
and rely on the invariants above together (a reservation, an eviction and a lease
must see one another inside one transaction); split across modules, each path would
hide from the others which rows it holds and when.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from catalog.errors import CacheError, CacheFull, ChecksumMismatch, InvalidInput
from catalog.hashing import require_sha256, sha256_file
from loader.cache_anchor import hold
from loader.cache_schema import EVICTABLE, LEASED_BYTES, SCHEMA, SCHEMA_VERSION, STATS
from loader.cache_writers import writer
from loader.leases import LeaseSet
from loader.owners import Proc, boot_id, current_process, is_alive

__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "DiskFree",
    "Fetch",
    "NodeCache",
    "disk_free",
    "forget_verified",
]

log = logging.getLogger("vidlake.cache")

#: Free space kept on the cache's filesystem by default.
DEFAULT_RESERVE_BYTES = 1 << 30
#: A function that writes an object's bytes to the path it is given.
Fetch = Callable[[Path], object]
#: A function giving the bytes free for the cache on the filesystem holding a path.
DiskFree = Callable[[Path], int]

_BUSY_TIMEOUT_S = 60.0
_POLL_MIN_S, _POLL_MAX_S = 0.001, 0.05
_FINGERPRINTS_MAX = 100_000
#: Pack files whose proved members a process remembers (loader.packs), and the members
#: all of them may hold together (~150 B each: a 64 MB pack of 16 KB members holds 4k).
_PACKS_MAX = 4096
_PACK_MEMBERS_MAX = 1 << 18
# Errnos that mean "the disk (or the quota) is full", however a fetch reports them.
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


# Connections inherited through fork() must never be used or closed in the child (SQLite
# forbids it; closing could even drop the parent's WAL): they are parked here for good.
_INHERITED: list[sqlite3.Connection] = []
_INSTANCES: weakref.WeakSet[NodeCache] = weakref.WeakSet()


def disk_free(path: Path) -> int:
    """The default free-space probe: bytes available to unprivileged writers."""
    return shutil.disk_usage(path).free


class _NoSpace(Exception):
    """Internal: a download hit ENOSPC and returned its reservation; ``full`` is what
    the caller gets if the retry fails too."""

    def __init__(self, full: CacheFull, cause: OSError) -> None:
        super().__init__(full.message)
        self.full, self.cause = full, cause


def _disk_full_cause(exc: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT ``OSError`` in an exception's chain, if any: stores and fetches
    may wrap the write error (``raise StorageError(...) from exc``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
    return None


def _fingerprint(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Verified:
    """The files one process has hashed under one cache root, as stat fingerprints.

    One per (process, root), shared by every :class:`NodeCache` opened on that root, so
    a new iterator (or a second cache object) does not hash again what another already
    verified. A forked child inherits its parent's (the files are the same files)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fps: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        #: Pack members proved, per pack file: (pack, its stat fingerprint) -> {offset:
        #: the member SHA-256 its bytes there hashed to} (loader.packs).
        self._members: OrderedDict[tuple[str, tuple[int, ...]], dict[int, str]] = OrderedDict()
        self._member_count = 0  # members added to the dicts above, so far as told

    def members(self, pack: str, fp: tuple[int, ...]) -> dict[int, str]:
        """The members this process proved from pack file ``fp`` of object ``pack``
        (a live dict: the reader adds what it proves and says so with :meth:`proved`).
        At most ``_PACKS_MAX`` files and about ``_PACK_MEMBERS_MAX`` members in all: the
        least recent files are forgotten first, and their members are hashed again."""
        key = (pack, fp)
        with self._lock:
            got = self._members.get(key)
            if got is None:
                got = self._members[key] = {}
                while len(self._members) > 1 and (
                    len(self._members) > _PACKS_MAX or self._member_count > _PACK_MEMBERS_MAX
                ):
                    _, old = self._members.popitem(last=False)
                    self._member_count -= len(old)
                # a reader of a forgotten file may still have added to it: recount then
                if self._member_count > 2 * _PACK_MEMBERS_MAX or self._member_count < 0:
                    self._member_count = sum(len(d) for d in self._members.values())
            else:
                self._members.move_to_end(key)
            return got

    def get(self, key: str) -> tuple[int, ...] | None:
        return self._fps.get(key)

    def put(self, key: str, fp: tuple[int, ...]) -> None:
        with self._lock:
            self._fps[key] = fp
            self._fps.move_to_end(key)
            while len(self._fps) > _FINGERPRINTS_MAX:
                self._fps.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._fps.pop(key, None)

    def proved(self) -> None:
        """A reader added one member to a dict :meth:`members` returned."""
        with self._lock:
            self._member_count += 1

    def clear(self) -> None:
        with self._lock:
            self._fps.clear()
            self._members.clear()
            self._member_count = 0

    def after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at fork()


_VERIFIED: dict[Path, _Verified] = {}
_VERIFIED_LOCK = threading.Lock()


def _verified_for(root: Path) -> _Verified:
    with _VERIFIED_LOCK:
        return _VERIFIED.setdefault(root, _Verified())


def forget_verified(root: str | Path | None = None) -> None:
    """Forget which files this process verified under ``root`` (every root when None):
    the next hit of each is hashed again. For measuring verification, and for tools
    that want a fresh proof without a full :meth:`NodeCache.verify`."""
    with _VERIFIED_LOCK:
        chosen: list[_Verified | None] = (
            list(_VERIFIED.values()) if root is None else [_VERIFIED.get(Path(root).absolute())]
        )
    for verified in chosen:
        if verified is not None:
            verified.clear()  # in place: open caches hold the same object


def _after_fork_in_child() -> None:
    global _VERIFIED_LOCK
    _VERIFIED_LOCK = threading.Lock()
    for verified in _VERIFIED.values():
        verified.after_fork()
    for cache in list(_INSTANCES):
        cache._forget_process_state()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class NodeCache:
    """A bounded, verified object cache shared by every process of a node.

    Args:
        root: The cache directory (on a local filesystem: SQLite WAL needs one).
        budget_bytes: Bytes that ready plus in-flight objects may occupy. Stored with
            the cache on creation; opening it with another value raises
            :class:`CacheError`. ``None`` adopts the stored budget (for tools).
        reserve_bytes: Free space to keep on the filesystem. A miss that would eat into
            it evicts unleased entries (LRU) first, as for the budget; when that is not
            enough it raises :class:`CacheFull` (``reason="disk"``).
        verify_hits: Hash a hit unless this process already verified the unchanged
            file. ``False`` checks only the size on hits (downloads are always hashed).
        full_wait_s: How long a miss waits for leased or in-flight bytes to be
            released when nothing else can be evicted (budget or disk), before
            raising CacheFull.
        disk_free: The free-space probe, ``disk_free(root) -> bytes``; the default
            asks the filesystem. A seam for tests and for quotas the filesystem does
            not report; it must pickle if the cache is pickled.

    Raises:
        CacheError: The stored budget differs, or there is no cache and no budget.
        InvalidInput: A negative or zero size in the arguments.
    """

    def __init__(
        self,
        root: str | Path,
        budget_bytes: int | None,
        *,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
        verify_hits: bool = True,
        full_wait_s: float = 0.0,
        disk_free: DiskFree | None = None,
    ) -> None:
        self._configure(root, budget_bytes, reserve_bytes, verify_hits, full_wait_s, disk_free)
        self._ensure_open()

    def _configure(
        self,
        root: str | Path,
        budget_bytes: int | None,
        reserve_bytes: int,
        verify_hits: bool,
        full_wait_s: float,
        disk_free: DiskFree | None,
    ) -> None:
        if budget_bytes is not None:
            _require_count(budget_bytes, "budget_bytes", minimum=1)
        _require_count(reserve_bytes, "reserve_bytes", minimum=0)
        if not full_wait_s >= 0:
            raise InvalidInput(
                f"full_wait_s must be >= 0, got {full_wait_s!r}", field="full_wait_s"
            )
        if disk_free is not None and not callable(disk_free):
            raise InvalidInput(
                f"disk_free must be a function of the cache root, got {disk_free!r}",
                field="disk_free",
            )
        self._disk_free_probe = disk_free
        self.root = Path(root).absolute()
        self.reserve_bytes = reserve_bytes
        self.verify_hits = verify_hits
        self.full_wait_s = float(full_wait_s)
        self._requested_budget = budget_bytes
        self._budget: int | None = None
        self._db_path = self.root / "cache.db"
        self._objects = self.root / "objects"
        self._objects_str = str(self._objects)
        self._tmp = self.root / "tmp"
        self._closed = False
        self._forget_process_state()
        _INSTANCES.add(self)

    def _forget_process_state(self) -> None:
        """Drop what belongs to one process: connections and locks (the verified files
        are the process's, per root, and a forked child keeps its parent's)."""
        for conn in getattr(self, "_conns", []):
            _INHERITED.append(conn)
        self._conns: list[sqlite3.Connection] = []
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._verified = _verified_for(self.root)
        self._opened_pid: int | None = None
        self._proc = Proc(0, 0, 0)

    # -- pickling: configuration only; the child reopens lazily ------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "budget_bytes": self._budget if self._budget is not None else self._requested_budget,
            "reserve_bytes": self.reserve_bytes,
            "verify_hits": self.verify_hits,
            "full_wait_s": self.full_wait_s,
            "disk_free": self._disk_free_probe,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._configure(
            state["root"],
            state["budget_bytes"],
            state["reserve_bytes"],
            state["verify_hits"],
            state["full_wait_s"],
            state.get("disk_free"),
        )

    def __repr__(self) -> str:
        return f"NodeCache({str(self.root)!r}, budget_bytes={self._budget})"

    def __enter__(self) -> NodeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def budget_bytes(self) -> int:
        """The budget every process sharing this cache works under."""
        self._ensure_open()
        assert self._budget is not None
        return self._budget

    def path_of(self, key_sha256: str) -> Path:
        """Where a ready object lives (use it only under a lease)."""
        key = require_sha256(key_sha256, "key_sha256")
        return self._objects / key[:2] / key

    def _object_path(self, key: str) -> str:
        """:meth:`path_of` for a key already checked, as a string (no pathlib per hit)."""
        return f"{self._objects_str}/{key[:2]}/{key}"

    # -- the lease ---------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(
        self, key_sha256: str, size: int, fetch: Fetch, *, timeout: float | None = None
    ) -> Iterator[Path]:
        """Hold a verified local copy of an object for the duration of a ``with`` block.

        Args:
            key_sha256: The object's SHA-256 (lowercase hex).
            size: Its size in bytes.
            fetch: Called as ``fetch(tmp_path)`` on a miss; must write the object's
                bytes to ``tmp_path``. The cache verifies them before use.
            timeout: Seconds to wait for another process's download of the same
                object; ``None`` waits while that process is alive.

        Yields:
            The path of a file holding exactly ``size`` bytes that hash to
            ``key_sha256``; it is not evicted before the block ends.

        Raises:
            CacheFull: No room (budget, leases, disk reserve) or the object is larger
                than the budget.
            ChecksumMismatch: ``fetch`` wrote other bytes, or the cached object has
                another size than ``size``.
            CacheError: The wait timed out or the cache database is unusable.
        """
        key = require_sha256(key_sha256, "key_sha256")
        _require_count(size, "size", minimum=0)
        lease_id, path = self._acquire(key, size, fetch, timeout)
        try:
            yield path
        finally:
            self._release(lease_id)

    def leases(self, wanted: Iterable[tuple[str, int]] = ()) -> LeaseSet:
        """Leases for a batch: the cached ones among ``wanted`` (``(sha256, size)``
        pairs) in one write transaction, all returned in one more when the set closes.

        Use as ``with cache.leases(items) as held: path = held.path(sha, size, fetch)``
        (:class:`loader.leases.LeaseSet`); ``path`` behaves as :meth:`lease` does.
        """
        self._ensure_open()
        return LeaseSet(self, wanted)

    def _claim_hits(self, wanted: list[tuple[str, int]]) -> dict[str, tuple[int, str]]:
        """Lease every ready entry of ``wanted`` whose size matches: one transaction of
        two statements, whatever the count. Returns key -> (lease id, generation); the
        rest take the per-object path (which raises on a size mismatch)."""
        self._ensure_open()
        now = time.time_ns()
        sizes = dict(wanted)
        keys = json.dumps(list(sizes))
        with self._tx() as db:
            gens = {
                key: gen
                for key, size, gen in db.execute(
                    # "+state": look the keys up by primary key; on the (state, ...)
                    # index the claim visited every ready entry of the node.
                    "UPDATE entries SET last_access = ? WHERE +state = 'ready' AND sha256 IN"
                    " (SELECT value FROM json_each(?)) RETURNING sha256, size, gen",
                    (now, keys),
                )
                if sizes[key] == size
            }
            if not gens:
                return {}
            me = self._proc
            held = {
                key: (lease_id, gens[key])
                for lease_id, key in db.execute(
                    "INSERT INTO leases (sha256, pid, pid_start, pid_ns, at)"
                    " SELECT value, ?, ?, ?, ? FROM json_each(?) RETURNING id, sha256",
                    (me.pid, me.start, me.ns, now, json.dumps(list(gens))),
                )
            }
            _bump(db, hits=len(held))
        return held

    def _acquire(
        self, key: str, size: int, fetch: Fetch, timeout: float | None
    ) -> tuple[int, Path]:
        self._ensure_open()
        if size > self.budget_bytes:
            with self._tx(read=True) as db:
                raise self._full("too_large", db, size)
        started = time.monotonic()
        path = self.path_of(key)
        delay = _POLL_MIN_S
        retried_enospc = False
        while True:
            try:
                action, lease_id, gen = self._claim(key, size)
            except CacheFull as exc:
                # Leased bytes come back when their readers finish, and evicting them
                # then frees the disk too: wait a while if asked.
                if exc.details.get("reason") not in ("leased", "disk"):
                    raise
                if time.monotonic() - started >= self.full_wait_s:
                    raise
                self._reclaim_dead()
                time.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
                continue
            if action == "download":
                try:
                    return self._download(key, size, fetch, gen)
                except _NoSpace as no_space:
                    if retried_enospc:
                        raise no_space.full from no_space.cause
                    # The probe saw room the write did not find (another writer, a
                    # quota): claim once more, so that the probe looks again and evicts.
                    retried_enospc = True
                    continue
            if action == "hit":
                if self._check(key, size, path, force_hash=False):
                    return lease_id, path
                self._drop_corrupt(key, gen, lease_id, was_hit=True)
            elif action == "wait":
                self._wait_for_download(key, started, timeout)

    def _wait_for_download(self, key: str, started: float, timeout: float | None) -> None:
        """Poll, read-only and with backoff, until no live process is downloading ``key``."""
        delay = _POLL_MIN_S
        while True:
            with self._tx(read=True) as db:
                row = db.execute(
                    "SELECT pid, pid_start, pid_ns FROM entries"
                    " WHERE sha256 = ? AND state = 'downloading'",
                    (key,),
                ).fetchone()
            if row is None or not is_alive(Proc(*row), self._proc):
                return
            if timeout is not None and time.monotonic() - started > timeout:
                raise CacheError(
                    f"timed out after {timeout}s waiting for pid {row[0]} to download {key}",
                    key=key,
                    pid=row[0],
                )
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)

    def _claim(self, key: str, size: int) -> tuple[str, int, str]:
        """One write transaction: lease a ready entry, reclaim a dead download, or
        reserve room for a new one. Returns (action, lease id, generation)."""
        now = time.time_ns()
        with self._tx() as db:
            # The common case, a hit, in one statement: touch it for LRU and read it.
            row = (
                db.execute(
                    "UPDATE entries SET last_access = ? WHERE sha256 = ? AND state = 'ready'"
                    " RETURNING state, size, gen, pid, pid_start, pid_ns",
                    (now, key),
                ).fetchone()
                or db.execute(
                    "SELECT state, size, gen, pid, pid_start, pid_ns FROM entries WHERE sha256 = ?",
                    (key,),
                ).fetchone()
            )
            if row is None:
                return "download", 0, self._reserve(db, key, size, now)
            state, stored_size, gen = row[:3]
            if stored_size != size:
                raise ChecksumMismatch(
                    f"object {key} is cached with {stored_size} bytes, not {size}",
                    sha256=key,
                    size=stored_size,
                    expected_size=size,
                )
            if state == "ready":
                lease_id = self._insert_lease(db, key, now)
                _bump(db, hits=1)
                return "hit", lease_id, gen
            if is_alive(Proc(*row[3:]), self._proc):
                return "wait", 0, gen
            self._discard_download(db, key, gen)
            _bump(db, reclaimed=1)
            log.info("reclaimed the download of %s left by dead pid %s", key, row[3])
            return "retry", 0, gen

    def _reserve(self, db: sqlite3.Connection, key: str, size: int, now: int) -> str:
        """Evict unleased LRU entries until both the budget and the disk have room for
        ``size`` more bytes, then insert the 'downloading' row that reserves them."""
        totals = _totals(db)
        over_budget = totals["bytes"] + totals["reserved"] + size - self.budget_bytes
        free = self._free_disk()
        # Bytes other downloads have reserved but not yet written will also leave the disk.
        short_disk = self.reserve_bytes + self._pending(db) + size - free
        victims: list[tuple[str, int]] = []
        freed = 0
        need = max(over_budget, short_disk)
        if need > 0:
            cur = db.execute(EVICTABLE)
            for sha, sz in cur:
                victims.append((sha, sz))
                freed += sz
                if freed >= need:
                    break
            cur.close()
        if freed < over_budget:
            raise self._full("leased", db, size)
        if freed < short_disk:
            raise self._full("disk", db, size, free_disk=free, reserve=self.reserve_bytes)
        # Unlink before the reservation commits: bytes on disk never exceed the books.
        for sha, sz in victims:
            self._evict(db, sha, sz)
        gen = uuid.uuid4().hex
        db.execute(
            "INSERT INTO entries (sha256, size, state, gen, pid, pid_start, pid_ns, last_access)"
            " VALUES (?, ?, 'downloading', ?, ?, ?, ?, ?)",
            (key, size, gen, self._proc.pid, self._proc.start, self._proc.ns, now),
        )
        _bump(db, misses=1)
        return gen

    def _evict(self, db: sqlite3.Connection, key: str, size: int) -> None:
        self.path_of(key).unlink(missing_ok=True)
        db.execute("DELETE FROM entries WHERE sha256 = ?", (key,))
        _bump(db, evictions=1)
        self._forget(key)
        log.debug("evicted %s (%d bytes)", key, size, extra={"sha256": key, "event": "evict"})

    def _pending(self, db: sqlite3.Connection) -> int:
        """Bytes that in-flight downloads have reserved but not yet written."""
        pending = 0
        for sha, gen, sz in db.execute(
            "SELECT sha256, gen, size FROM entries WHERE state = 'downloading'"
        ):
            try:
                written = (self._tmp / gen / sha).stat().st_size
            except FileNotFoundError:
                written = 0
            pending += max(sz - written, 0)
        return pending

    def _free_disk(self) -> int:
        probe = self._disk_free_probe or disk_free
        return int(probe(self.root))

    def _full(self, reason: str, db: sqlite3.Connection, needed: int, **more: object) -> CacheFull:
        totals = _totals(db)
        used = totals["bytes"] + totals["reserved"]
        leased = db.execute(LEASED_BYTES).fetchone()[0] + totals["reserved"]
        why = {
            "too_large": "the object is larger than the whole budget",
            "leased": "every other entry is leased or still downloading",
            "disk": f"the filesystem would keep less than reserve_bytes={self.reserve_bytes} free"
            " even after evicting every unleased entry",
        }[reason]
        if more.get("enospc"):
            why = "the filesystem ran out of space (ENOSPC) while the object was written"
        return CacheFull(
            f"node cache {self.root} cannot take {needed} bytes: {why} "
            f"(budget {self.budget_bytes}, used {used}, leased or in flight {leased})",
            reason=reason,
            needed=needed,
            budget=self.budget_bytes,
            used=used,
            leased=leased,
            **more,
        )

    def _download(self, key: str, size: int, fetch: Fetch, gen: str) -> tuple[int, Path]:
        work = self._tmp / gen
        tmp = work / key
        final = self.path_of(key)
        lease_id: int | None = None
        try:
            work.mkdir(parents=True)
            fetch(tmp)
            try:
                digest, got = sha256_file(tmp)
            except FileNotFoundError:
                digest, got = "", -1
            if got != size or digest != key:
                raise ChecksumMismatch(
                    f"fetch wrote {got} bytes hashing to {digest or 'nothing'} for object {key}"
                    f" of {size} bytes",
                    sha256=key,
                    actual=digest,
                    size=got,
                    expected_size=size,
                )
            # mtime in the past: any later write moves it, which the fast path notices.
            now = time.time_ns()
            os.utime(tmp, ns=(now, now - 1_000_000_000))
            final.parent.mkdir(exist_ok=True)
            with self._tx() as db:
                row = db.execute(
                    "SELECT state, gen FROM entries WHERE sha256 = ?", (key,)
                ).fetchone()
                if row != ("downloading", gen):
                    raise CacheError(f"the reservation for {key} was reclaimed mid-download")
                os.replace(tmp, final)
                shutil.rmtree(work, ignore_errors=True)  # with its row: no stray folders
                db.execute(
                    "UPDATE entries SET state = 'ready', pid = NULL, pid_start = NULL,"
                    " pid_ns = NULL, last_access = ? WHERE sha256 = ?",
                    (time.time_ns(), key),
                )
                lease_id = self._insert_lease(db, key, time.time_ns())
                _bump(db, bytes_downloaded=size)
            self._remember(key, final)
            return lease_id, final
        except BaseException as exc:
            abandoned = False
            with contextlib.suppress(Exception):
                self._abandon(key, gen, lease_id)
                abandoned = True
            cause = _disk_full_cause(exc)
            if cause is None or isinstance(exc, CacheFull):
                raise
            with self._tx(read=True) as db:
                full = self._full("disk", db, size, enospc=True, errno=cause.errno)
            if abandoned:  # else a retry would wait on our own stuck reservation
                raise _NoSpace(full, cause) from exc
            raise full from cause

    def _abandon(self, key: str, gen: str, lease_id: int | None) -> None:
        """Return a failed download's reservation (after deleting its bytes)."""
        with self._tx() as db:
            row = db.execute("SELECT state, gen FROM entries WHERE sha256 = ?", (key,)).fetchone()
            if row == ("downloading", gen):  # else it committed: only the lease is ours
                self._discard_download(db, key, gen)
        if lease_id is not None:
            self._release(lease_id)

    def _discard_download(self, db: sqlite3.Connection, key: str, gen: str) -> None:
        """Delete a 'downloading' row and its bytes (temp folder first, then the row)."""
        shutil.rmtree(self._tmp / gen, ignore_errors=True)
        # A failure (or crash) between the rename and its commit leaves a final file for
        # a row that is still 'downloading': never accounted as ready, so it goes too.
        self.path_of(key).unlink(missing_ok=True)
        db.execute("DELETE FROM entries WHERE sha256 = ? AND gen = ?", (key, gen))

    def _insert_lease(self, db: sqlite3.Connection, key: str, now: int) -> int:
        cur = db.execute(
            "INSERT INTO leases (sha256, pid, pid_start, pid_ns, at) VALUES (?, ?, ?, ?, ?)",
            (key, self._proc.pid, self._proc.start, self._proc.ns, now),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def _release(self, lease_id: int) -> None:
        try:
            if self._closed:
                with contextlib.closing(self._connect()) as conn:
                    conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
            else:
                with self._borrowed() as conn:
                    conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
        except sqlite3.Error as exc:
            # Never mask the caller's own exception; a dead owner's lease is reclaimed.
            log.warning("could not release lease %d: %s", lease_id, exc)

    def _release_many(self, lease_ids: list[int]) -> None:
        """Delete many lease rows in one transaction (never raises, as _release)."""
        if not lease_ids:
            return
        rows = [(i,) for i in lease_ids]
        try:
            if self._closed:
                with contextlib.closing(self._connect()) as conn:
                    _delete_leases(conn, rows)
            else:
                with self._borrowed() as conn:
                    _delete_leases(conn, rows)
        except sqlite3.Error as exc:
            log.warning("could not release %d leases: %s", len(rows), exc)

    # -- verification ------------------------------------------------------------------
    def _check(self, key: str, size: int, path: Path | str, *, force_hash: bool) -> bool:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        if st.st_size != size:
            return False
        fp = _fingerprint(st)
        if not force_hash and not self._hash_due(key, fp):
            return True
        try:
            digest, got = sha256_file(path)
            after = _fingerprint(os.stat(path))
        except FileNotFoundError:
            return False
        if digest != key or got != size:
            return False
        if after == fp:
            self._store_fingerprint(key, fp)
        return True

    def _hash_due(self, key: str, fp: tuple[int, ...]) -> bool:
        """Whether a hit with stat fingerprint ``fp`` must be hashed (docs/cache.md)."""
        return self.verify_hits and self._verified.get(key) != fp

    def _hash_pending(self, key: str, size: int, path: str) -> tuple[bool, tuple[int, ...] | None]:
        """The stat half of :meth:`_check`: (size ok, the fingerprint a hash must
        confirm, or None when none is due). The caller hashes the bytes it reads and
        settles with :meth:`_settle`."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False, None
        if st.st_size != size:
            return False, None
        fp = _fingerprint(st)
        return True, fp if self._hash_due(key, fp) else None

    def _stat_fingerprint(self, key: str, size: int, path: str) -> tuple[int, ...] | None:
        """The stat fingerprint of cached file ``path`` when it holds ``size`` bytes,
        else None (wrong size or gone): the size check of a pack entry's hit."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return _fingerprint(st) if st.st_size == size else None

    def _member_proved(self) -> None:
        self._verified.proved()

    def _proved_members(self, pack: str, fp: tuple[int, ...]) -> dict[int, str]:
        """``{offset: member SHA-256}`` of the members this process proved by hashing
        them from pack file ``fp`` (its stat fingerprint) of object ``pack``; the
        reader adds each member it proves (:mod:`loader.packs`)."""
        return self._verified.members(pack, fp)

    def _settle(self, key: str, fp: tuple[int, ...], digest: str, st: os.stat_result) -> bool:
        """The hash half of :meth:`_check`, for bytes the caller read and hashed
        itself: True when ``digest`` is ``key``; the fingerprint is remembered only if
        ``st`` (the read file's ``fstat`` after the read) is the one stat-checked."""
        if digest != key:
            return False
        if _fingerprint(st) == fp:
            self._store_fingerprint(key, fp)
        return True

    def _remember(self, key: str, path: Path | str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._store_fingerprint(key, _fingerprint(os.stat(path)))

    def _store_fingerprint(self, key: str, fp: tuple[int, ...]) -> None:
        self._verified.put(key, fp)

    def _forget(self, key: str) -> None:
        self._verified.forget(key)

    def _drop_corrupt(self, key: str, gen: str, lease_id: int, *, was_hit: bool) -> None:
        self._forget(key)
        with self._tx() as db:
            db.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
            row = db.execute(
                "SELECT gen FROM entries WHERE sha256 = ? AND state = 'ready'", (key,)
            ).fetchone()
            # Only the generation we checked: another process may have replaced it.
            dropped = row is not None and row[0] == gen
            if dropped:
                self.path_of(key).unlink(missing_ok=True)
                db.execute("DELETE FROM entries WHERE sha256 = ?", (key,))
                _bump(db, corrupt_refetches=1)
            if was_hit:
                _bump(db, hits=-1)
        if dropped:
            log.warning(
                "cached object %s failed verification; dropped, fetched again on next use",
                key,
                extra={"sha256": key, "event": "corrupt"},
            )

    # -- maintenance (the CLI's `vidlake cache stats|verify|gc`) -----------------------
    def stats(self) -> dict[str, Any]:
        """Figures for humans and dashboards, as a JSON-ready dict."""
        self._ensure_open()
        with self._tx(read=True) as db:
            totals = _totals(db)
            leases = db.execute("SELECT COUNT(*) FROM leases").fetchone()[0]
            leased = db.execute(LEASED_BYTES).fetchone()[0] + totals["reserved"]
        return {
            "root": str(self.root),
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.reserve_bytes,
            **totals,
            "used_bytes": totals["bytes"] + totals["reserved"],
            "leases": leases,
            "leased_bytes": leased,
            "disk_free_bytes": self._free_disk(),
        }

    def verify(self) -> dict[str, Any]:
        """Re-hash every ready entry (ignoring the fast path); drop corrupt ones.

        Returns:
            ``checked``, ``ok``, ``corrupt`` (their keys), ``bytes_checked``,
            ``reclaimed`` (rows of dead processes) and ``orphans_removed`` (files the
            database does not know).
        """
        self._ensure_open()
        reclaimed = self._reclaim_dead()
        with self._tx(read=True) as db:
            keys = [r[0] for r in db.execute("SELECT sha256 FROM entries WHERE state = 'ready'")]
        checked = ok = nbytes = 0
        corrupt: list[str] = []
        for key in sorted(keys):
            now = time.time_ns()
            with self._tx() as db:
                row = db.execute(
                    "SELECT gen, size FROM entries WHERE sha256 = ? AND state = 'ready'", (key,)
                ).fetchone()
                lease_id = self._insert_lease(db, key, now) if row else None
            if row is None or lease_id is None:
                continue  # evicted meanwhile
            checked += 1
            if self._check(key, row[1], self.path_of(key), force_hash=True):
                ok += 1
                nbytes += row[1]
                self._release(lease_id)
            else:
                corrupt.append(key)
                self._drop_corrupt(key, row[0], lease_id, was_hit=False)
        return {
            "checked": checked,
            "ok": ok,
            "corrupt": corrupt,
            "bytes_checked": nbytes,
            "reclaimed": reclaimed,
            "orphans_removed": self._remove_orphans(),
        }

    def gc(self, target_bytes: int | None = None) -> dict[str, Any]:
        """Reclaim what dead processes left, remove orphan files, and evict unleased
        entries, least recently used first, until at most ``target_bytes`` are used
        (default: the budget). Leased entries stay, even above the target."""
        self._ensure_open()
        target = self.budget_bytes if target_bytes is None else target_bytes
        _require_count(target, "target_bytes", minimum=0)
        reclaimed = self._reclaim_dead()
        evicted = freed = 0
        with self._tx() as db:
            totals = _totals(db)
            excess = totals["bytes"] + totals["reserved"] - target
            victims: list[tuple[str, int]] = []
            if excess > 0:
                cur = db.execute(EVICTABLE)
                for sha, sz in cur:
                    if freed >= excess:
                        break
                    victims.append((sha, sz))
                    freed += sz
                cur.close()
            for sha, sz in victims:
                self._evict(db, sha, sz)
            evicted = len(victims)
        orphans = self._remove_orphans()
        after = self.stats()
        return {
            "target_bytes": target,
            "evicted": evicted,
            "bytes_freed": freed,
            "reclaimed": reclaimed,
            "orphans_removed": orphans,
            "used_bytes": after["used_bytes"],
            "leased_bytes": after["leased_bytes"],
        }

    def close(self) -> None:
        """Close this process's database connections. Idempotent."""
        self._closed = True
        with self._lock:
            conns, self._conns, self._idle = self._conns, [], []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    # -- opening, reclaiming ----------------------------------------------------------
    def _ensure_open(self) -> None:
        if self._closed:
            raise CacheError(f"node cache {self.root} is closed", root=str(self.root))
        if self._opened_pid == os.getpid():
            return
        if self._opened_pid is not None:  # forked without the hook: start afresh
            self._forget_process_state()
        with self._open_lock:
            if self._opened_pid == os.getpid():
                return
            self._open()
            self._opened_pid = os.getpid()
        # Closing this cache's connections then never checkpoints and deletes the
        # WAL (loader.cache_anchor): an iterator's end used to cost 2-100 ms.
        hold(str(self._db_path))

    def _open(self) -> None:
        if self._requested_budget is None and not self._db_path.exists():
            raise CacheError(
                f"no node cache at {self.root}; pass budget_bytes to create one",
                root=str(self.root),
            )
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(exist_ok=True)
        self._proc = current_process()
        if self._open_read_only():
            return
        with self._tx() as db:
            for statement in SCHEMA:
                db.execute(statement)
            db.executemany(
                "INSERT OR IGNORE INTO stats (name, value) VALUES (?, 0)", [(n,) for n in STATS]
            )
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
                raise CacheError(
                    f"node cache {self.root} has schema {meta['schema']}, "
                    f"this code reads {SCHEMA_VERSION}",
                    root=str(self.root),
                )
            if "budget_bytes" not in meta:
                assert self._requested_budget is not None
                db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [
                        ("schema", SCHEMA_VERSION),
                        ("budget_bytes", str(self._requested_budget)),
                        ("boot_id", boot_id()),
                    ],
                )
                meta["budget_bytes"] = str(self._requested_budget)
            stored = int(meta["budget_bytes"])
            if self._requested_budget is not None and stored != self._requested_budget:
                raise CacheError(
                    f"node cache {self.root} has budget_bytes={stored}, not "
                    f"{self._requested_budget}: every process sharing it must use one "
                    "budget (pass budget_bytes=None to adopt the stored one)",
                    root=str(self.root),
                    budget_bytes=stored,
                    requested=self._requested_budget,
                )
            self._budget = stored
            self._reclaim(db, meta.get("boot_id"))

    def _open_read_only(self) -> bool:
        """Open an existing cache with reads only when nothing needs a write: the schema
        and budget are there, and no dead owner, earlier boot or stray temp folder
        needs reclaiming. Many processes starting at once then take no write lock."""
        try:
            with self._tx(read=True) as db:
                meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
                owners = db.execute(
                    "SELECT pid, pid_start, pid_ns FROM leases UNION SELECT pid, pid_start,"
                    " pid_ns FROM entries WHERE state = 'downloading'"
                ).fetchall()
                live = {
                    r[0] for r in db.execute("SELECT gen FROM entries WHERE state = 'downloading'")
                }
        except CacheError:
            return False  # a new cache (no tables yet): the write path creates it
        if meta.get("schema") != SCHEMA_VERSION or "budget_bytes" not in meta:
            return False
        if meta.get("boot_id") != boot_id():
            return False
        stored = int(meta["budget_bytes"])
        if self._requested_budget is not None and stored != self._requested_budget:
            return False  # the write path raises the error
        if any(not is_alive(Proc(*o), self._proc) for o in owners):
            return False
        if any(p.name not in live for p in self._tmp.iterdir()):
            return False
        self._budget = stored
        return True

    def _reclaim_dead(self) -> int:
        with self._tx() as db:
            return self._reclaim(db, None)

    def _reclaim(self, db: sqlite3.Connection, stored_boot: str | None) -> int:
        """Delete leases and downloads of dead processes, and stray temp folders."""
        boot = boot_id()
        if stored_boot is not None and boot and stored_boot != boot:
            # The machine rebooted: nobody from before can hold anything.
            dead = {tuple(r) for r in db.execute("SELECT pid, pid_start, pid_ns FROM leases")}
            dead |= {
                tuple(r)
                for r in db.execute(
                    "SELECT pid, pid_start, pid_ns FROM entries WHERE state = 'downloading'"
                )
            }
            db.execute("UPDATE meta SET value = ? WHERE key = 'boot_id'", (boot,))
        else:
            owners = db.execute(
                "SELECT pid, pid_start, pid_ns FROM leases UNION SELECT pid, pid_start, pid_ns"
                " FROM entries WHERE state = 'downloading'"
            ).fetchall()
            dead = {tuple(o) for o in owners if not is_alive(Proc(*o), self._proc)}
        n = 0
        for owner in dead:
            n += db.execute(
                "DELETE FROM leases WHERE pid = ? AND pid_start = ? AND pid_ns = ?", owner
            ).rowcount
            for key, gen in db.execute(
                "SELECT sha256, gen FROM entries WHERE state = 'downloading'"
                " AND pid = ? AND pid_start = ? AND pid_ns = ?",
                owner,
            ).fetchall():
                self._discard_download(db, key, gen)
                n += 1
        # Temp folders are created after their row commits and removed before it goes,
        # so under the write lock a folder without a 'downloading' row is garbage.
        live = {r[0] for r in db.execute("SELECT gen FROM entries WHERE state = 'downloading'")}
        for stray in self._tmp.iterdir():
            if stray.name not in live:
                _remove(stray)
                n += 1
        if n:
            _bump(db, reclaimed=n)
            log.info("reclaimed %d leases, downloads and temp files of dead processes", n)
        return n

    def _remove_orphans(self) -> int:
        """Delete files under objects/ that no entry accounts for (they would escape the
        budget). Listed without the lock, judged and deleted under it."""
        found = [p for d in self._objects.iterdir() if d.is_dir() for p in d.iterdir()]
        n = 0
        with self._tx() as db:
            for path in found:
                known = db.execute(
                    "SELECT 1 FROM entries WHERE sha256 = ? AND ? = substr(sha256, 1, 2)",
                    (path.name, path.parent.name),
                ).fetchone()
                if known is None:
                    _remove(path)
                    n += 1
        return n

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._db_path,
            timeout=_BUSY_TIMEOUT_S,
            isolation_level=None,  # explicit BEGIN IMMEDIATE / COMMIT below
            check_same_thread=False,  # pooled: one thread at a time, any thread
        )
        conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        _use_wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    @contextlib.contextmanager
    def _borrowed(self) -> Iterator[sqlite3.Connection]:
        """A connection of this process's pool for one transaction: an idle one (so the
        first part read after opening uses the connection the cache was opened with),
        else a new one. Connections are never shared by two threads at once."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._new_conn()
        try:
            yield conn
        finally:
            with self._lock:
                if any(c is conn for c in self._conns):  # not closed meanwhile
                    self._idle.append(conn)

    def _new_conn(self) -> sqlite3.Connection:
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise CacheError(
                f"cannot open node cache database {self._db_path}: {exc}",
                root=str(self.root),
            ) from exc
        with self._lock:
            self._conns.append(conn)
        return conn

    @contextlib.contextmanager
    def _tx(self, *, read: bool = False) -> Iterator[sqlite3.Connection]:
        # Writers of this process queue on a lock, not in SQLite's busy handler's sleeps.
        with contextlib.nullcontext() if read else writer(self._db_path), self._borrowed() as conn:
            try:
                conn.execute("BEGIN" if read else "BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    raise CacheFull(
                        f"node cache database {self._db_path} cannot grow: the disk is full",
                        reason="disk",
                        root=str(self.root),
                    ) from exc
                raise CacheError(
                    f"node cache database {self._db_path} failed: {exc}", root=str(self.root)
                ) from exc


def _totals(db: sqlite3.Connection) -> dict[str, int]:
    return {name: int(value) for name, value in db.execute("SELECT name, value FROM stats")}


def _delete_leases(conn: sqlite3.Connection, rows: list[tuple[int]]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany("DELETE FROM leases WHERE id = ?", rows)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _bump(db: sqlite3.Connection, **deltas: int) -> None:
    db.executemany(
        "UPDATE stats SET value = value + ? WHERE name = ?",
        [(delta, name) for name, delta in deltas.items()],
    )


def _use_wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode (persistent, so usually already done).

    Switching the journal mode needs the database to itself, and SQLite answers
    "database is locked" at once, without its busy handler, when processes opening a
    new cache race to switch it; so retry until the busy timeout."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _require_count(value: object, field: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{field} must be an integer >= {minimum}, got {value!r}", field=field)
