"""The on-disk key index: ingest's duplicate, reference and near-duplicate checks
without a whole table's keys in RAM.

One SQLite file per catalog (WAL mode, a bounded page cache) holds, per *view*, the
keys of one Iceberg table at one snapshot (:mod:`catalog.key_index_rows` says what):
``assets``, ``clips``, ``latents`` and ``near_dup_events`` (the ``near_duplicate``
rows of ``asset_events``). The ``clips`` and ``latents`` keys live in sorted run files
beside it (:mod:`catalog.key_runs`; a probe reads one block per key and run, where a
B-tree read a random leaf), which its ``runs`` table names. Each clip is there twice:
by its id (reference checks) and by (asset prefix, id)
(:func:`~catalog.key_index_rows.asset_clip_digests`), which ingest's duplicate check
asks, so a batch's clips of one asset share a block. A view's ``meta`` row
records the table's uuid and the snapshot the view holds, written in the same
transaction as its keys (or the rows naming its runs), so a crash mid-write leaves
the previous, consistent state.

It is a cache of committed state, never ahead of Iceberg: :meth:`KeyStore.sync`
brings a view to the table's current snapshot by scanning only the files appended
since (compactions, ``replace`` snapshots, change no keys and are skipped), or
rebuilds it from a streamed scan when anything else happened (an erasure rewrite), the
table was recreated, the near-duplicate rule changed, or the file is missing. After its
own commit a writer adds the rows it wrote (:meth:`KeyStore.advance`), only when the
view was at the commit's parent; a writer killed between its commit and that write
leaves the view behind, and the next sync reads the missing append. Several processes
share the file: syncs are serialised by SQLite's write lock and re-check ``meta``
inside it. A plan made against a view newer than the table it commits to loses its
commit race and is re-planned (:mod:`catalog.commit`), so answers stay exact.

A writer's own ``clips`` and ``latents`` keys are not inserted commit by commit: they
are held in memory (:mod:`catalog.key_index_pending`, at most 2^20 a view) and written
as one sorted batch when enough have gathered, when another writer's commit breaks the
chain of ours, and at :meth:`KeyStore.close`; the index plus them is the view at our
last commit, and they are dropped, not written, once another writer's sync moved the
index on (it read our appended files itself).

Look-ups and inserts take a whole batch in one statement (SQLite views) or one pass
per run (run views): the digests go in as one packed blob
(:class:`~catalog.key_index_rows.Packed`) that a recursive CTE reads key by key, or
that numpy searches, so there is no Python object, parameter or statement text per
key. Keys our own
commits added are also answered from bounded memory (:mod:`catalog.key_index_recent`),
emptied whenever the view's history is anything but appends.

Near-duplicates: the ``nd_keys`` table (:mod:`catalog.neardup_index`) holds the exact
pigeonhole keys of :func:`catalog.rules.near_duplicate_pairs` on disk; candidates are
verified against the stored frames, and groups are read by walking ``edges`` from the
matched assets, so memory follows the batch and its groups, not the catalog.

A damaged file (truncated, overwritten, not SQLite: ``SQLITE_CORRUPT``,
``SQLITE_NOTADB``; a run file missing or failing its checksums,
:class:`~catalog.key_runs.RunDamaged`) is discarded, with the run files, with a
warning and rebuilt from the tables; a lookup
that meets the damage rebuilds the views before it answers, so a damaged index never
answers "absent" for a committed key (every view is rebuilt, not only the one read).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pyiceberg.expressions import AlwaysTrue, BooleanExpression, EqualTo
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from catalog import neardup_index, rules
from catalog.backends import BACKEND_ERRORS
from catalog.config import CatalogConfig
from catalog.errors import StorageError
from catalog.key_index_pending import FLUSH_KEYS, PendingKeys
from catalog.key_index_recent import RecentKeys, State
from catalog.key_index_rows import (
    CLEAR,
    SCHEMA,
    SERIES,
    Packed,
    Writes,
    asset_clip_digests,
    digests,
    packed_digests,
    rows_for,
    view_groups,
)
from catalog.key_runs import CHUNK_KEYS, KeyRuns, RunDamaged
from catalog.key_runs import SCHEMA as RUNS_SCHEMA
from catalog.keycache import snapshot_id

__all__ = ["KEYED_TABLES", "VIEWS", "KeyStore", "Matches", "Prepared", "View", "index_path"]

#: The views :meth:`KeyStore.has` looks keys up in (each a table of the same name).
_KEYED = frozenset({"assets", "clips", "latents"})
#: The views whose keys live in sorted run files (:mod:`catalog.key_runs`), and
#: that a writer's commits hold back and write in larger sorted batches
#: (:mod:`catalog.key_index_pending`).
_DEFERRED = frozenset({"clips", "latents"})
#: The file layout version (``PRAGMA user_version``): 2 moved the ``clips`` and
#: ``latents`` keys from SQLite tables to run files; 3 added the clips' asset-keyed
#: digests (:func:`~catalog.key_index_rows.asset_clip_digests`) to the clip runs.
_LAYOUT = 3
log = logging.getLogger(__name__)
R = TypeVar("R")
#: SQLite's result codes of a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
_DAMAGED = frozenset({11, 26})

#: Keys per ``IN (...)`` list (below SQLite's 32766 bound on parameters).
_CHUNK = 8192
#: SQLite page cache per connection, KiB (negative: the PRAGMA's unit).
_CACHE_KIB = 32 * 1024
#: WAL pages (1 KiB) between automatic checkpoints.
_CHECKPOINT_PAGES = 65536
#: How long a writer waits for another process's sync (a rebuild can take minutes).
_BUSY_S = 600.0


def _eq(column: str, value: Any) -> BooleanExpression:
    """A pyiceberg predicate (its pydantic signature defeats mypy's reading)."""
    kind: type[Any] = EqualTo
    expr: BooleanExpression = kind(column, value)
    return expr


#: :meth:`KeyStore.prepare`'s answer: per keyed view, the sorted digests of the rows
#: (their own, and the clips' asset-keyed ones).
Prepared: TypeAlias = dict[str, tuple[list[Packed], list[Packed]]]


@dataclass(frozen=True)
class View:
    """A table's keys as the index keeps them: the columns read and the rows kept."""

    table: str
    columns: tuple[str, ...]
    row_filter: BooleanExpression


VIEWS: dict[str, View] = {
    "assets": View(
        "assets",
        ("asset_id", "split", "probe_bitrate", "duplicate_of", "near_duplicates", "fingerprint"),
        AlwaysTrue(),
    ),
    "clips": View("clips", ("clip_id", "asset_id"), AlwaysTrue()),
    "latents": View(
        "latents", ("clip_id", "rung", "tokenizer_version", "member_sha256"), AlwaysTrue()
    ),
    "near_dup_events": View(
        "asset_events",
        ("asset_id", "related_asset_id", "event"),
        _eq("event", "near_duplicate"),
    ),
}


#: The tables with a view :meth:`KeyStore.has` looks keys up in.
KEYED_TABLES = frozenset(VIEWS[view].table for view in _KEYED)


@dataclass(frozen=True)
class Matches:
    """A batch's near-duplicate matches with existing assets and their groups.

    Attributes:
        ids: Asset ids of every existing asset in a group a match touched, sorted
            (local node ``k`` is ``ids[k]``).
        bitrate: Their bitrates (NaN: unknown).
        query, node: Matches: batch row ``query[k]`` matched local node ``node[k]``.
        edges: Recorded links among the nodes, as local node pairs.
    """

    ids: NDArray[np.str_]
    bitrate: NDArray[np.float64]
    query: NDArray[np.int64]
    node: NDArray[np.int64]
    edges: tuple[NDArray[np.int64], NDArray[np.int64]]


class KeyStore:
    """The key index file of one catalog.

    Args:
        path: The SQLite file (created, with its directory, on first use).
        load: Loads a table by name (fresh metadata).
        rule: The near-duplicate rule (a change rebuilds the ``assets`` view).
    """

    def __init__(self, path: Path, load: Callable[[str], Table], rule: rules.NearDupRule) -> None:
        self.path = path
        self._load = load
        self._rule = rule
        self._rule_key = rule.index_key()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._recent = RecentKeys()
        self._pending = PendingKeys()
        self._runs = KeyRuns(Path(f"{path}.runs"))
        self.flush_keys = FLUSH_KEYS

    # -- connection ---------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        """This process's connection (a forked child opens its own)."""
        if self._conn is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, timeout=_BUSY_S, isolation_level=None, check_same_thread=False
            )
            # 1 KiB pages: a batch's random keys dirty one leaf each, so small pages
            # write ~2x less per batch than 4 KiB (docs/decisions/023-key-index.md).
            conn.execute("PRAGMA page_size = 1024")  # takes effect on a new file only
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")  # a lost last txn is re-synced
            # A batch's random keys dirty thousands of pages: checkpoint (and fsync) the
            # WAL into the file every ~64 MiB, not after every batch.
            conn.execute(f"PRAGMA wal_autocheckpoint = {_CHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
            conn.execute("PRAGMA temp_store = MEMORY")
            # Deleted rows are zeroed on disk, not left in free pages: an erased
            # asset's id and fingerprint must not survive in this file (purge).
            conn.execute("PRAGMA secure_delete = ON")
            conn.executescript(SCHEMA + RUNS_SCHEMA)
            self._runs.close()  # a forked child reopens its runs too
            self._conn, self._pid = conn, os.getpid()
            self._opened(conn)
        return self._conn

    def _opened(self, conn: sqlite3.Connection) -> None:
        """Upgrade a file of an older layout (its clip and latent views are rebuilt),
        and remove run files no transaction names (a crash's orphans)."""
        old = conn.execute("PRAGMA user_version").fetchone()[0] < _LAYOUT
        if not old and not self._runs.unnamed(conn):
            return  # the common case: no write lock to wait for
        with self._write() as txn:
            version = txn.execute("PRAGMA user_version").fetchone()[0]
            if version < 2:
                txn.execute("DROP TABLE IF EXISTS clips")
                txn.execute("DROP TABLE IF EXISTS latents")
                txn.execute("DELETE FROM meta WHERE view IN ('clips', 'latents')")
            if version < 3:  # clip runs without asset-keyed digests: rebuild the view
                self._runs.clear(txn, "clips")
                txn.execute("DELETE FROM meta WHERE view = 'clips'")
            if version < _LAYOUT:
                txn.execute(f"PRAGMA user_version = {_LAYOUT}")
            self._runs.sweep(txn)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (SQLite's write lock held: other writers wait)."""
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            with suppress(sqlite3.Error):  # a damaged file may refuse even this
                conn.execute("ROLLBACK")
            self._runs.rolled_back()
            raise
        self._runs.committed()

    def close(self) -> None:
        """Write the keys still pending, then close this process's connection (the
        next use reopens it). A failed write leaves the index behind, not wrong."""
        with self._lock:
            try:
                for view in self._pending.views():
                    self._flush(view)
            except (sqlite3.Error, RunDamaged) as exc:
                # A damaged run met while merging stays named: the next probe that
                # reads it rebuilds the index, so leaving it here is behind, not wrong.
                self._pending.clear()
                log.warning("key index %s: pending keys not written (%s)", self.path, exc)
            self._shut()

    def _shut(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
            self._runs.close()

    def purge(self) -> None:
        """Empty every view (deleted content zeroed), and truncate the WAL, so that no
        key of an erased asset is left in this file; the next use rebuilds from the
        tables. (Index files of other hosts are rebuilt at their next sync: an
        erasure's rewrite is not an append.)"""
        with self._lock:
            with self._write() as conn:
                for view, statements in CLEAR.items():
                    for statement in statements:
                        conn.execute(statement)
                    if view in _DEFERRED:
                        self._runs.clear(conn, view)
                conn.execute("DELETE FROM meta")
            with self._write() as conn:
                self._runs.sweep(conn)
            self._recent.clear()
            self._pending.clear()
            self._db().execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _guarded(self, fn: Callable[[], R]) -> R:
        """``fn()``; on a damaged file, discard it, rebuild every view (a caller may
        have synced others it is about to read) and call ``fn`` again."""
        try:
            return fn()
        except (sqlite3.DatabaseError, RunDamaged) as exc:
            if isinstance(exc, sqlite3.DatabaseError) and not _damaged(exc):
                raise
            self._discard(exc)
        try:
            for view in VIEWS:
                self._sync(view, None)
            return fn()
        except (sqlite3.DatabaseError, RunDamaged) as exc:
            raise StorageError(
                f"key index {self.path} is still unusable after a rebuild: {exc}",
                path=str(self.path),
            ) from exc

    def _discard(self, exc: Exception) -> None:
        log.warning("key index %s is damaged (%s): rebuilding it from the tables", self.path, exc)
        with self._lock:
            self._pending.clear()
            try:
                self._shut()
            except sqlite3.Error:
                self._conn = None
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self._runs.discard()
            self._recent.clear()

    # -- keeping views current ----------------------------------------------------
    def sync(self, view: str, tbl: Table | None = None) -> None:
        """Bring ``view`` to its table's current snapshot (``tbl``'s, when given, or a
        newer one when the index already holds one); a damaged file is rebuilt.

        Raises:
            StorageError: reading the table failed.
        """
        self._guarded(lambda: self._sync(view, tbl))

    def _sync(self, view: str, tbl: Table | None) -> None:
        spec = VIEWS[view]
        target = tbl if tbl is not None else self._load(spec.table)
        with self._lock:
            try:
                meta = self._pending_state(view, self._wanted(target))
                if meta != self._wanted(target):
                    with self._write() as conn:
                        meta = self._sync_locked(conn, view, spec, target)
                    self._settle(view)
            except BACKEND_ERRORS as exc:
                raise StorageError(f"reading {spec.table} failed: {exc}", table=spec.table) from exc
            if view in _KEYED:
                now = None if meta is None else meta[1]
                self._recent.synced(
                    view, meta, lambda held: _append_runs(target, held, now) is not None
                )

    def _pending_state(self, view: str, wanted: State) -> State | None:
        """The view's state: the index's, or our pending keys' head when the index
        still holds their base and the head is ``wanted``; pending keys that do not
        lead to ``wanted`` are written first (or dropped, :meth:`_flush`)."""
        meta = self._meta(self._db(), view)
        pending = self._pending.get(view)
        if pending is None:
            return meta
        if meta == pending.base and pending.head == wanted:
            return pending.head
        self._flush(view)
        return self._meta(self._db(), view)

    def _flush(self, view: str) -> None:
        """Write ``view``'s pending keys and their head state in one transaction, in
        key order; drop them when the index no longer holds their base (another
        writer's sync read our appended files)."""
        pending = self._pending.pop(view)
        if pending is None:
            return
        with self._write() as conn:
            if self._meta(conn, view) != pending.base:
                return
            self._runs.add(conn, view, pending.packed())
            _set_meta(conn, view, pending.head)
        self._settle(view)

    def _settle(self, view: str) -> None:
        """Merge ``view``'s runs as :mod:`catalog.key_runs` asks (none for SQLite views)."""
        if view in _DEFERRED:
            self._runs.settle(view, self._db, self._write)

    def _wanted(self, tbl: Table) -> tuple[str, int | None, str]:
        return str(tbl.metadata.table_uuid), snapshot_id(tbl), self._rule_key

    def _meta(self, conn: sqlite3.Connection, view: str) -> tuple[str, int | None, str] | None:
        row = conn.execute(
            "SELECT table_uuid, snapshot_id, rule FROM meta WHERE view = ?", (view,)
        ).fetchone()
        return None if row is None else (str(row[0]), row[1], str(row[2]))

    def _sync_locked(
        self, conn: sqlite3.Connection, view: str, spec: View, tbl: Table
    ) -> tuple[str, int | None, str]:
        """Bring ``view`` to ``tbl``'s snapshot (or hold a newer one); its state now."""
        meta = self._meta(conn, view)
        held = None if meta is None else meta[1]
        if held is not None and tbl.metadata.snapshot_by_id(held) is None:
            tbl = self._load(spec.table)  # the index holds a newer snapshot than ``tbl``
        wanted = self._wanted(tbl)
        if meta == wanted:
            return wanted
        runs = None
        if meta is not None and meta[0] == wanted[0] and meta[2] == wanted[2]:
            runs = _append_runs(tbl, meta[1], wanted[1])
        sink = _Sink(view, conn, self._runs, self._rule)
        if runs is None:
            sink.clear()
            if wanted[1] is not None:
                scan = tbl.scan(
                    row_filter=spec.row_filter, selected_fields=spec.columns, snapshot_id=wanted[1]
                )
                for batch in scan.to_arrow_batch_reader():
                    sink.add(pa.Table.from_batches([batch]))
        else:
            for since, until in runs:
                added = tbl.incremental_append_scan(
                    from_snapshot_id_exclusive=since,
                    to_snapshot_id_inclusive=until,
                    row_filter=spec.row_filter,
                    selected_fields=spec.columns,
                ).to_arrow()
                sink.add(added)
        sink.close()
        _set_meta(conn, view, wanted)
        return wanted

    @staticmethod
    def prepare(table: str, rows: pa.Table, known: Prepared | None = None) -> Prepared:
        """The sorted digests :meth:`advance` adds for ``rows`` of ``table``, per keyed
        view. Pure and state-free, so ingest computes them while the rows' data file
        is written (numpy's sorts release the GIL) rather than after the commit.
        ``known``: a view's digests of ``rows`` that the plan already made (a clip
        batch's duplicate check, :meth:`has` ``digests``), sorted or not, with the
        row each belongs to: not made again (a group sorted already is not re-sorted)."""
        known = known or {}
        return {
            view: _sorted(known[view]) if view in known else _sorted(view_groups(view, rows))
            for view, spec in VIEWS.items()
            if spec.table == table and view in _KEYED
        }

    def advance(
        self,
        table: str,
        base: int | None,
        parent: int | None,
        new: int,
        rows: pa.Table,
        prepared: Prepared | None = None,
    ) -> None:
        """After our own commit ``new`` of ``rows`` onto ``base``: add them to the
        views of ``table`` that are at ``base`` (others catch up at their next sync;
        a damaged file is rebuilt). ``prepared``: :meth:`prepare` of the same rows."""
        if base != parent:
            return
        self._guarded(lambda: self._advance(table, base, new, rows, prepared or {}))

    def _advance(
        self, table: str, base: int | None, new: int, rows: pa.Table, prepared: Prepared
    ) -> None:
        with self._lock:
            for view, spec in VIEWS.items():
                if spec.table == table:
                    self._advance_view(view, spec, base, new, rows, prepared.get(view))

    def _advance_view(
        self,
        view: str,
        spec: View,
        base: int | None,
        new: int,
        rows: pa.Table,
        prepared: tuple[list[Packed], list[Packed]] | None,
    ) -> None:
        own: list[Packed] | None = None
        groups: list[Packed] = []
        if view in _KEYED:  # sorted once, not by each holder of the keys
            own, by_asset = prepared if prepared is not None else _sorted_groups(view, rows)
            groups = own + by_asset
        if own is not None and view in _DEFERRED and self._defer(view, base, new, groups, own):
            return
        with self._write() as conn:
            meta = self._meta(conn, view)
            if meta is None or meta[1] != base or meta[2] != self._rule_key:
                return
            if view in _DEFERRED:
                self._runs.add(conn, view, groups)
            else:
                _run(conn, rows_for(view, rows.select(list(spec.columns)), self._rule))
            _set_meta(conn, view, (meta[0], new, meta[2]))
        self._settle(view)
        if own is not None:
            self._recent.added(view, meta, (meta[0], new, meta[2]), own)

    def _defer(
        self, view: str, base: int | None, new: int, groups: list[Packed], own: list[Packed]
    ) -> bool:
        """Hold our commit's keys (``groups``) back (:mod:`catalog.key_index_pending`)
        when the view is at ``base``: with our pending keys, or in the index; False
        when it is not (the write path then leaves the view behind). ``own`` (the keys
        themselves, not the asset-keyed clip digests) is what recent memory holds."""
        pending = self._pending.get(view)
        if pending is None or pending.head[1] != base:
            self._flush(view)
            meta = self._meta(self._db(), view)
            if meta is None or meta[1] != base or meta[2] != self._rule_key:
                return False
            pending = self._pending.start(view, meta)
        head = (pending.head[0], new, pending.head[2])
        self._recent.added(view, pending.head, head, own)
        pending.add(groups)
        pending.head = head
        if pending.count >= self.flush_keys:
            self._flush(view)
        return True

    # -- lookups (after sync) -----------------------------------------------------
    def has(
        self,
        view: str,
        keys: pa.Array | pa.ChunkedArray,
        *,
        expect: bool = False,
        assets: pa.Array | pa.ChunkedArray | None = None,
        digests: list[Packed] | None = None,
    ) -> NDArray[np.bool_]:
        """Whether each key is in ``view`` (``clips``: clip ids; ``latents``: latent
        keys; ``assets``: asset ids); a null key is absent.

        ``assets`` (``clips`` only: each clip's asset id, aligned with ``keys``) looks
        the clips up by their asset-keyed digests
        (:func:`~catalog.key_index_rows.asset_clip_digests`): a batch's clips of one
        asset share a run block, so a duplicate check of 10k clips of 500 assets reads
        ~500 blocks a run, not 10k. The answer is the same for clips whose ids follow
        :func:`catalog.rules.clip_id` (every stored clip's does); a row with a null
        asset is absent.

        One statement per batch (:data:`~catalog.key_index_rows.SERIES`) returns the
        rows of the rarer answer: ``expect=True`` (a reference check: most keys are
        present) returns the absent ones, ``expect=False`` (a duplicate check) the
        present ones. The answer is the same either way. A damaged file is rebuilt.

        ``digests``: the keys' digests as this call would make them (with ``assets``,
        :func:`~catalog.key_index_rows.asset_clip_digests`), when the caller has them:
        a clip batch's plan makes them once for this check and :meth:`prepare`.
        """
        if view not in _KEYED:
            raise ValueError(f"no keys to look up in view {view!r}")
        if assets is not None and (view != "clips" or len(assets) != len(keys)):
            raise ValueError("assets: one asset id per clip id, for view 'clips' only")
        if digests is not None:
            groups = digests
        elif assets is None:
            groups = packed_digests(keys)
        else:
            groups = asset_clip_digests(assets, keys)
        return self._guarded(lambda: self._has(view, len(keys), groups, expect))

    def _has(self, view: str, n: int, groups: list[Packed], expect: bool) -> NDArray[np.bool_]:
        out = np.zeros(n, dtype=np.bool_)
        test = "NOT EXISTS" if expect else "EXISTS"
        query = (
            f"{SERIES}SELECT i FROM s WHERE {test}"
            f" (SELECT 1 FROM {view} WHERE k = substr(?1, i * ?3 + 1, ?3))"
        )
        in_runs = view in _DEFERRED
        with self._lock:
            conn = self._db()
            # In head order: every search below (memory, runs) starts near the last.
            for group in (p.sorted() for g in groups for p in g.parts()):
                known = self._recent.known(view, group)
                if (pending := self._pending.get(view)) is not None and not known.all():
                    miss = np.flatnonzero(~known)
                    known[miss] = pending.known(_unknown(group, known, miss))
                out[group.rows[known]] = True
                if known.all():
                    continue
                rest = _unknown(group, known, np.flatnonzero(~known))
                if in_runs:
                    out[rest.rows] = self._runs.has(conn, view, rest)
                    continue
                hits = np.fromiter((r[0] for r in conn.execute(query, rest.params)), np.int64)
                if expect:
                    out[rest.rows] = True
                out[rest.rows[hits]] = not expect
        return out

    def splits(self, asset_ids: pa.Array | pa.ChunkedArray) -> list[str | None]:
        """Each asset's split (None: unknown asset, or a null id)."""
        return self._guarded(lambda: self._splits(asset_ids))

    def _splits(self, asset_ids: pa.Array | pa.ChunkedArray) -> list[str | None]:
        out: list[str | None] = [None] * len(asset_ids)
        query = _SPLITS
        with self._lock:
            conn = self._db()
            for group in (p for g in packed_digests(asset_ids) for p in g.parts()):
                rows = group.rows.tolist()
                for i, split in conn.execute(query, group.params):
                    out[rows[i]] = split
        return out

    def near_duplicates(self, frames: NDArray[np.uint64], lengths: NDArray[np.int64]) -> Matches:
        """Every existing asset the rule matches with a batch row (exact: band
        candidates, then the rule on the stored frames), and the groups they are in."""
        return self._guarded(lambda: self._near_duplicates(frames, lengths))

    def _near_duplicates(self, frames: NDArray[np.uint64], lengths: NDArray[np.int64]) -> Matches:
        with self._lock:
            conn = self._db()
            rows, cand = self._candidates(conn, frames, lengths)
            stored = self._assets(conn, sorted(set(cand)))
            keep = [k for k, a in enumerate(cand) if a in stored]
            rows, cand = rows[keep], [cand[k] for k in keep]
            ref, ref_len = _frame_matrix([stored[a][1] for a in cand], self._rule.window)
            counts = rules.frame_match_counts(frames[rows], lengths[rows], ref, ref_len, self._rule)
            hit = counts >= self._rule.min_frames
            matched = sorted({a for a, h in zip(cand, hit.tolist(), strict=True) if h})
            ids, rates, edges = self._groups(conn, matched, stored)
        index = {a: k for k, a in enumerate(ids)}
        nodes = np.array([index[a] for a, h in zip(cand, hit.tolist(), strict=True) if h])
        return Matches(
            np.array(ids, dtype="U64"),
            np.array(rates, dtype=np.float64),
            rows[hit].astype(np.int64),
            nodes.astype(np.int64),
            _local_edges(edges, index),
        )

    def _candidates(
        self, conn: sqlite3.Connection, frames: NDArray[np.uint64], lengths: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], list[str]]:
        """(batch row, asset id) pairs sharing a search key, without repeats."""
        return neardup_index.candidates(conn, frames, lengths, self._rule)

    def _assets(self, conn: sqlite3.Connection, ids: list[str]) -> dict[str, tuple[float, bytes]]:
        """Bitrate and stored frames of each known asset among ``ids``."""
        digest = dict(zip(digests(pa.array(ids, pa.large_string())), ids, strict=True))
        out: dict[str, tuple[float, bytes]] = {}
        keys = sorted(digest)
        for start in range(0, len(keys), _CHUNK):
            part = keys[start : start + _CHUNK]
            marks = ",".join("?" * len(part))
            query = f"SELECT k, bitrate, frames FROM assets WHERE k IN ({marks})"
            for k, rate, frames in conn.execute(query, part):
                out[digest[k]] = (np.nan if rate is None else float(rate), frames or b"")
        return out

    def _groups(
        self,
        conn: sqlite3.Connection,
        matched: list[str],
        stored: dict[str, tuple[float, bytes]],
    ) -> tuple[list[str], list[float], list[tuple[str, str]]]:
        """The groups of ``matched``: members (sorted), their bitrates, their links.
        A walk along ``edges`` through known assets only (links to unknown assets
        are dropped, as :func:`catalog.rules.link_edges` drops them)."""
        known = {a: stored[a][0] for a in matched}
        frontier, edges = list(matched), set[tuple[str, str]]()
        while frontier:
            linked: list[tuple[str, str]] = []
            for start in range(0, len(frontier), _CHUNK):
                part = frontier[start : start + _CHUNK]
                marks = ",".join("?" * len(part))
                linked += conn.execute(f"SELECT a, b FROM edges WHERE a IN ({marks})", part)
            unseen = sorted({b for _, b in linked} - known.keys())
            more = self._assets(conn, unseen)
            known.update({a: v[0] for a, v in more.items()})
            edges.update((a, b) for a, b in linked if b in known)
            frontier = sorted(more)
        ids = sorted(known)
        return ids, [known[a] for a in ids], sorted(edges)


#: Each asset's split, by its digest, from the covering index ``assets_split``: a
#: ``WITHOUT ROWID`` table keeps whole rows in its interior pages (7 a 1 KiB page at
#: 800k assets: 6-7 levels, most of them read afresh by a new process), the index
#: ~21 (k, split) pairs (decision 058: 500 assets 4.6-7.6 → 3.3-4.3 ms CPU at 800k).
_SPLITS = (
    f"{SERIES}SELECT s.i, a.split FROM s CROSS JOIN assets a INDEXED BY assets_split"
    " ON a.k = substr(?1, s.i * ?3 + 1, ?3)"
)


def _sorted_groups(view: str, rows: pa.Table) -> tuple[list[Packed], list[Packed]]:
    """:func:`~catalog.key_index_rows.view_groups` of ``rows``, each group sorted."""
    return _sorted(view_groups(view, rows))


def _sorted(groups: tuple[list[Packed], list[Packed]]) -> tuple[list[Packed], list[Packed]]:
    own, by_asset = groups
    return [g.sorted() for g in own], [g.sorted() for g in by_asset]


def _unknown(group: Packed, known: NDArray[np.bool_], miss: NDArray[np.int64]) -> Packed:
    """The keys of ``group`` at ``miss`` (where ``known`` is False): ``group`` itself
    when no key is known, as for a batch of new clips, whose duplicate check would
    otherwise copy its 100k digests twice (~5 ms each)."""
    return group if len(miss) == len(known) else group.take(miss)


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file is damaged (primary code of an extended one)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _DAMAGED


def index_path(config: CatalogConfig) -> Path:
    """Where ``config``'s key index lives: ``config.key_index``; else beside a SQLite
    catalog's file; else, named by the catalog, in a ``key-index`` directory beside a
    local warehouse or under ``~/.cache/vidlake/`` (each host keeps its own copy: the
    index is a cache of committed keys)."""
    if config.key_index is not None:
        return Path(config.key_index)
    prefix = "sqlite:///"
    db = config.uri.removeprefix(prefix).split("?", 1)[0]
    if config.uri.startswith(prefix) and db and db != ":memory:" and not db.startswith("file:"):
        return Path(db).parent / f"key-index.{config.namespace}.sqlite"
    name = hashlib.sha256(f"{config.uri}\x1f{config.namespace}".encode()).hexdigest()[:16]
    if "://" not in config.warehouse:
        return Path(config.warehouse).absolute().parent / "key-index" / f"{name}.sqlite"
    return Path.home() / ".cache" / "vidlake" / "key-index" / f"{name}.sqlite"


def _frame_matrix(packed: list[bytes], window: int) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Stored frames (big-endian) back to a padded frame matrix."""
    return rules.fingerprint_matrix(pa.array(packed, pa.large_binary()), window)


def _local_edges(
    edges: list[tuple[str, str]], index: dict[str, int]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    u = np.array([index[a] for a, _ in edges], dtype=np.int64)
    v = np.array([index[b] for _, b in edges], dtype=np.int64)
    return u, v


def _run(conn: sqlite3.Connection, writes: Writes) -> None:
    for statement, rows in writes:
        if isinstance(rows, Packed):
            conn.execute(statement, rows.params)
        else:
            conn.executemany(statement, rows)


class _Sink:
    """A sync's rows of one view, written as they are read: SQLite rows, or (clips,
    latents) runs of up to :data:`~catalog.key_runs.CHUNK_KEYS` keys each."""

    def __init__(
        self, view: str, conn: sqlite3.Connection, runs: KeyRuns, rule: rules.NearDupRule
    ) -> None:
        self.view, self.conn, self.runs, self.rule = view, conn, runs, rule
        self._held: list[Packed] = []
        self._count = 0

    def clear(self) -> None:
        for statement in CLEAR[self.view]:
            self.conn.execute(statement)
        if self.view in _DEFERRED:
            self.runs.clear(self.conn, self.view)

    def add(self, rows: pa.Table) -> None:
        if self.view not in _DEFERRED:
            _run(self.conn, rows_for(self.view, rows, self.rule))
            return
        own, by_asset = view_groups(self.view, rows)
        groups = own + by_asset
        self._held += groups
        self._count += sum(len(g.rows) for g in groups)
        if self._count >= CHUNK_KEYS:
            self.close()

    def close(self) -> None:
        """Write the keys still held as runs."""
        if self._held:
            self.runs.add(self.conn, self.view, self._held)
        self._held, self._count = [], 0


def _set_meta(conn: sqlite3.Connection, view: str, meta: tuple[str, int | None, str]) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO meta (view, table_uuid, snapshot_id, rule) VALUES (?, ?, ?, ?)",
        (view, *meta),
    )


def _append_runs(
    tbl: Table, since: int | None, until: int | None
) -> list[tuple[int | None, int]] | None:
    """The appends from ``since`` (exclusive) to ``until``, as ``(from exclusive,
    to inclusive)`` runs of consecutive appends; ``replace`` snapshots (compaction:
    the same rows in other files) are skipped. None when ``since`` is not an ancestor
    of ``until`` or anything else happened between them."""
    if until is None:
        return [] if since is None else None
    chain: list[tuple[int, Operation | None, int | None]] = []
    snap = tbl.metadata.snapshot_by_id(until)
    while snap is not None and snap.snapshot_id != since:
        op = snap.summary.operation if snap.summary is not None else None
        chain.append((snap.snapshot_id, op, snap.parent_snapshot_id))
        parent = snap.parent_snapshot_id
        snap = tbl.metadata.snapshot_by_id(parent) if parent is not None else None
    if snap is None and since is not None:
        return None
    runs: list[tuple[int | None, int]] = []
    for sid, op, parent in reversed(chain):
        if op == Operation.APPEND:
            if runs and runs[-1][1] == parent:
                runs[-1] = (runs[-1][0], sid)
            else:
                runs.append((parent, sid))
        elif op != Operation.REPLACE:
            return None
    return runs
