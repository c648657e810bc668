"""One ingest call: check, plan and commit a batch, unless its key is recorded.

:class:`Ingester` runs a batch through its table's planner (:mod:`catalog.ingest`) and
commits **one** Iceberg append (:func:`catalog._append.append`). Every batch has an
idempotency key recorded in its commit's snapshot summary; a rerun with a recorded key
writes nothing and returns the first result, ``replayed`` (:mod:`catalog.idempotency`).
A lost commit race (another writer first) re-plans against the new state, with jittered
backoff, up to :data:`COMMIT_ATTEMPTS` times. The near-duplicate events of an assets
commit go to ``asset_events`` in a second, keyed commit; events lost between the two
(a killed writer) are re-derived by the next ``add_assets`` (:mod:`catalog.link_events`).
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeAlias

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from catalog import idempotency, link_events
from catalog._append import append as fast_append
from catalog.backends import BACKEND_ERRORS
from catalog.coerce import coerce_batch, conform, fill_time
from catalog.config import IngestResult
from catalog.errors import Conflict, NotFound, StorageError
from catalog.ingest import Plan, Planner
from catalog.key_index import KEYED_TABLES, VIEWS, KeyStore, Prepared
from catalog.keycache import snapshot_id
from catalog.tables import TABLES

__all__ = ["COMMIT_ATTEMPTS", "Ingester", "Rows"]

log = logging.getLogger("vidlake.catalog")

COMMIT_ATTEMPTS = 12
_LINK_FAILURES: tuple[type[Exception], ...] = (
    *BACKEND_ERRORS,
    CommitFailedException,
    StorageError,
    NotFound,
)
#: An events commit that fails for any of these is re-derived by a later add_assets.
_EVENT_FAILURES: tuple[type[Exception], ...] = (*_LINK_FAILURES, Conflict)

#: A batch: an Arrow table or a list of row dicts.
Rows: TypeAlias = pa.Table | Sequence[Mapping[str, Any]]
PlanFn: TypeAlias = Callable[[pa.Table, Table], Plan]
PrepareFn: TypeAlias = Callable[[pa.Table], pa.Table]


def _backoff(attempt: int) -> None:
    """Sleep before retrying a lost commit race (exponential, jittered)."""
    time.sleep(min(2.0, 0.02 * 2**attempt) * (1 + random.random()))


class Ingester:
    """Commits batches for one catalog, one at a time per process.

    Args:
        load: Loads a table by name (fresh metadata).
        keys: The catalog's key index (advanced after each of our commits).
        planner: The per-table planners.
    """

    def __init__(self, load: Callable[[str], Table], keys: KeyStore, planner: Planner) -> None:
        self._load = load
        self._index = keys
        self._planner = planner
        self._lock = threading.RLock()
        self._keys: dict[str, idempotency.KeyIndex] = {}

    def _plans(self, name: str) -> tuple[PlanFn, PrepareFn | None]:
        p = self._planner
        plans: dict[str, tuple[PlanFn, PrepareFn | None]] = {
            "assets": (p.plan_assets, None),
            "clips": (p.plan_clips, None),
            "latents": (p.plan_latents, p.prepare_latents),
            "scores": (p.plan_clip_refs, None),
            "captions": (p.plan_clip_refs, None),
            "tombstones": (p.plan_asset_refs, None),
            "asset_events": (p.plan_asset_refs, None),
            "jobs": (p.plan_plain, None),
        }
        return plans[name]

    def ingest(self, name: str, data: Rows, key: str | None) -> IngestResult:
        """Check, plan and commit one batch of table ``name``, unless its key is recorded.

        ``prepare`` (latents) runs the checks that do not depend on the table's state
        (object reads) once; ``plan`` runs again after a lost commit race, as does the
        key lookup (the winner may have committed this very batch).
        """
        with self._lock:
            tbl = self._load(name)
            batch = coerce_batch(TABLES[name], data, tbl.schema(), fill_time=False)
            # A clip batch's id check starts now, not at its plan (decision 062).
            checking = self._planner.check_clip_ids(batch) if name == "clips" else None
            try:
                return self._ingest(name, tbl, batch, key, checking)
            finally:
                if checking is not None:
                    checking.exception()  # waits: nothing outlives the call

    def _ingest(
        self,
        name: str,
        tbl: Table,
        batch: pa.Table,
        key: str | None,
        checking: Future[object] | None,
    ) -> IngestResult:
        """:meth:`ingest` of a coerced batch (``checking``: its clip-id check)."""
        tdef = TABLES[name]
        plan, prepare = self._plans(name)
        if checking is not None:
            plan = functools.partial(self._planner.plan_clips, checking=checking)
        batch_sha = idempotency.batch_sha256(batch)
        if key is None:
            key = idempotency.derived_key(batch_sha)
        key = idempotency.check_key(key)
        batch = fill_time(tdef, batch)
        if name == "assets":
            self._repair_link_events(tbl)
        for attempt in range(COMMIT_ATTEMPTS):
            if (prior := self.key_index(name).lookup(tbl.metadata, key)) is not None:
                _warn_other_rows(name, key, prior, batch_sha)
                return IngestResult.replay(name, prior)
            if prepare is not None:
                batch, prepare = prepare(batch), None
            done = self._attempt(name, tbl, plan(batch, tbl), key, batch_sha)
            if done is not None:
                return done
            log.info("%s: concurrent commit, re-checking (attempt %d)", name, attempt + 1)
            _backoff(attempt)
            tbl = self._load(name)
        raise Conflict(f"{name}: gave up after {COMMIT_ATTEMPTS} concurrent commits", table=name)

    def _attempt(
        self, name: str, tbl: Table, todo: Plan, key: str, batch_sha: str
    ) -> IngestResult | None:
        """Commit ``todo`` on ``tbl``; None when another writer committed first."""
        base = snapshot_id(tbl)
        if todo.rows.num_rows == 0:
            if todo.verify is not None:
                todo.verify()
            return IngestResult(name, 0, todo.duplicates, 0, 0, base, idempotency_key=key)
        rows = conform(todo.rows, tbl.schema())
        counts = todo.counts(rows.num_rows)
        props = {
            "vidlake.rows": str(rows.num_rows),
            **idempotency.summary_properties(key, batch_sha, counts),
        }
        events = todo.events if todo.events is not None and todo.events.num_rows else None
        if events is not None:
            props[idempotency.PROP_EVENTS] = str(events.num_rows)
        prepared: Prepared = {}
        alongside = todo.verify
        if name in KEYED_TABLES:

            def alongside() -> None:
                # The key index's sorted digests of the rows, while their file is
                # written, not after the commit; then the plan's own check, if any.
                prepared.update(self._index.prepare(name, rows, todo.digests))
                if todo.verify is not None:
                    todo.verify()

        try:
            fast_append(tbl, rows, props, alongside=alongside)
        except CommitFailedException:
            return None  # re-check against the winner's state
        except BACKEND_ERRORS as exc:
            raise StorageError(f"appending to {name} failed: {exc}", table=name) from exc
        snap = tbl.current_snapshot()
        assert snap is not None  # we just appended
        self._index.advance(name, base, snap.parent_snapshot_id, snap.snapshot_id, rows, prepared)
        if events is not None:
            self.append_links(events, snap.snapshot_id)
        return IngestResult(
            name,
            counts["inserted"],
            counts["duplicates"],
            counts["eval"],
            0,
            snap.snapshot_id,
            counts["near_duplicates"],
            idempotency_key=key,
        )

    def key_index(self, table: str) -> idempotency.KeyIndex:
        """The recorded idempotency keys of ``table`` (read incrementally)."""
        return self._keys.setdefault(table, idempotency.KeyIndex())

    def append_links(self, events: pa.Table, assets_snapshot: int) -> None:
        """Append the near-duplicate events of an assets commit, once (a keyed commit,
        re-checked after a lost race). A failure loses nothing for good: the next
        ``add_assets`` re-derives them (:meth:`_repair_link_events`), and the assets'
        ``near_duplicates`` column holds every link meanwhile."""
        try:
            link_events.append_once(
                lambda: self._load("asset_events"),
                self.key_index("asset_events"),
                events,
                assets_snapshot,
                COMMIT_ATTEMPTS,
            )
        except _EVENT_FAILURES as exc:
            log.warning("events of assets snapshot %d not recorded: %s", assets_snapshot, exc)

    def _repair_link_events(self, assets: Table) -> None:
        """Append the events of every assets commit whose events commit is missing
        (a writer killed between its two commits; see :mod:`catalog.link_events`)."""
        planned = self.key_index("assets")
        recorded = self.key_index("asset_events")
        for sid in link_events.missing(assets, planned, recorded, self._load("asset_events")):
            try:
                old, new = link_events.committed_batch(assets, sid)
                recorded = self._link_events()
            except _LINK_FAILURES as exc:  # a later add_assets tries again
                log.warning("re-deriving the events of assets snapshot %d failed: %s", sid, exc)
                continue
            events = link_events.rederive(old, recorded, new)
            log.warning("assets snapshot %d lost %d link events; re-derived", sid, len(events))
            self.append_links(events, sid)

    def _link_events(self) -> pa.Table:
        """Every recorded ``near_duplicate`` event (a repair reads the whole assets
        table too: it runs only after a writer was killed between its two commits)."""
        spec = VIEWS["near_dup_events"]
        tbl = self._load(spec.table)
        try:
            return tbl.scan(row_filter=spec.row_filter, selected_fields=spec.columns).to_arrow()
        except BACKEND_ERRORS as exc:
            raise StorageError(f"reading {spec.table} failed: {exc}", table=spec.table) from exc


def _warn_other_rows(name: str, key: str, prior: idempotency.Recorded, batch_sha: str) -> None:
    if prior.batch_sha256 not in (None, batch_sha):
        log.warning(
            "%s: key %r was recorded for other rows (batch %s, now %s); nothing written",
            name,
            key,
            prior.batch_sha256,
            batch_sha,
        )
