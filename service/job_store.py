"""Where job records live: the store contract, its SQLite backend, and the choice.

:class:`JobStoreBase` holds every query once (``?`` placeholders); a backend supplies
:meth:`JobStoreBase._connect`, one transaction on a :class:`Tx`. Two backends:

* :class:`JobStore` — a SQLite file (WAL mode) beside the service's other state, the
  embedded default: one replica, or several processes of one host sharing the file;
* :class:`service.job_store_pg.PostgresJobStore` — a table of its own in the
  PostgreSQL database of the catalog, so that every replica behind a load balancer
  answers ``GET /v1/jobs/{id}`` for every job and lists them all.

:func:`open_job_store` picks by the catalog URI (``postgresql…``: the database; anything
else: the file). Every call changes rows in one transaction, on a connection kept per
thread (SQLite) or its own (PostgreSQL), so a store is safe to share between threads,
processes and hosts.
:meth:`JobStoreBase.create_once` takes a lock per (kind, key) inside that transaction
(SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a transaction-scoped advisory lock), so that
identical requests arriving at two replicas share one job.

Interrupted jobs: :meth:`JobStoreBase.recover` fails the unfinished jobs *of this host*
whose process is gone (or is this process under a runner that no longer exists). Jobs
of other hosts are left alone on either backend: their liveness cannot be told from
here, and a replica that is merely slow must not have its jobs failed under it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from catalog.errors import InvalidInput, NotFound

__all__ = [
    "JOB_STATES",
    "JobRecord",
    "JobState",
    "JobStore",
    "JobStoreBase",
    "Tx",
    "open_job_store",
]

log = logging.getLogger("vidlake.jobs")

JobState = Literal["queued", "running", "succeeded", "failed"]
JOB_STATES: tuple[JobState, ...] = ("queued", "running", "succeeded", "failed")

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    state       TEXT NOT NULL,
    stage       TEXT,
    progress    REAL NOT NULL DEFAULT 0,
    params      TEXT NOT NULL,
    result      TEXT,
    error       TEXT,
    owner       TEXT,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    runner_id   TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    started_at  TEXT,
    finished_at TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at);
CREATE INDEX IF NOT EXISTS jobs_by_created ON jobs (created_at);
"""
_BUSY_TIMEOUT_S = 30.0
_INTERRUPTED = {
    "code": "interrupted",
    "message": "the service stopped before this job finished; start it again",
    "details": {},
}


def now() -> str:
    """The timestamp format of job records (UTC, microseconds)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class JobRecord:
    """One job as stored."""

    id: str
    kind: str
    state: JobState
    stage: str | None
    progress: float
    params: dict[str, Any]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    owner: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to finish, when both are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        start = datetime.fromisoformat(self.started_at)
        return (datetime.fromisoformat(self.finished_at) - start).total_seconds()


def _record(row: Mapping[str, Any]) -> JobRecord:
    def loads(text: str | None) -> Any:
        return None if text is None else json.loads(text)

    return JobRecord(
        id=row["id"],
        kind=row["kind"],
        state=row["state"],
        stage=row["stage"],
        progress=float(row["progress"]),
        params=loads(row["params"]) or {},
        result=loads(row["result"]),
        error=loads(row["error"]),
        owner=row["owner"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


class Tx(Protocol):
    """One open transaction of a backend (queries use ``?`` placeholders and the
    table name ``jobs``; the backend rewrites both for its database)."""

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Mapping[str, Any]]: ...

    def run(self, sql: str, args: tuple[Any, ...] = ()) -> None: ...

    def lock(self, kind: str, key: str) -> None:
        """Serialise :meth:`JobStoreBase.create_once` calls for ``(kind, key)`` until
        the transaction ends."""


class JobStoreBase(ABC):
    """The job store contract; every query lives here, a backend opens transactions.

    ``_NEWEST`` orders rows newest first with a backend's insertion tie-break.
    """

    _NEWEST = "created_at DESC, id DESC"

    @abstractmethod
    def _connect(self) -> AbstractContextManager[Tx]:
        """One transaction: committed when the block succeeds, rolled back otherwise."""

    def close(self) -> None:  # noqa: B027 - a backend with nothing kept has nothing to do
        """Release the connections this store keeps."""

    def create(
        self,
        kind: str,
        params: Mapping[str, Any],
        *,
        owner: str | None,
        runner_id: str,
        key: str | None = None,
    ) -> JobRecord:
        """Record a new queued job (under dedupe ``key``, which later
        :meth:`create_once` calls may join, but not checked here)."""
        with self._connect() as tx:
            job_id = _insert(tx, kind, params, owner, runner_id, key)
        return self.get(job_id)

    def create_once(
        self,
        kind: str,
        params: Mapping[str, Any],
        *,
        key: str,
        owner: str | None,
        runner_id: str,
    ) -> tuple[JobRecord, bool]:
        """The queued, running or succeeded job of ``kind`` with dedupe ``key``, else
        a new queued one; returns (record, created). Atomic across processes."""
        with self._connect() as tx:
            tx.lock(kind, key)  # the lookup and the insert under one lock
            rows = tx.rows(
                "SELECT * FROM jobs WHERE dedupe_key = ? AND kind = ? AND state != 'failed'"
                f" ORDER BY {self._NEWEST} LIMIT 1",
                (key, kind),
            )
            if rows:
                return _record(rows[0]), False
            job_id = _insert(tx, kind, params, owner, runner_id, key)
        return self.get(job_id), True

    def get(self, job_id: str) -> JobRecord:
        """One job; NotFound when there is no such id."""
        with self._connect() as tx:
            rows = tx.rows("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise NotFound(f"no job {job_id!r}", job_id=job_id)
        return _record(rows[0])

    def list(
        self, *, state: str | None = None, kind: str | None = None, limit: int = 100
    ) -> list[JobRecord]:
        """Jobs, newest first, optionally of one state and kind."""
        if state is not None and state not in JOB_STATES:
            raise InvalidInput(f"unknown job state {state!r}; known: {list(JOB_STATES)}")
        clauses: list[str] = []
        args: list[Any] = []
        if state is not None:
            clauses.append("state = ?")
            args.append(state)
        if kind is not None:
            clauses.append("kind = ?")
            args.append(kind)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._connect() as tx:
            rows = tx.rows(
                f"SELECT * FROM jobs {where} ORDER BY created_at DESC, id LIMIT ?",
                (*args, int(limit)),
            )
        return [_record(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state (every state present, zeros included)."""
        with self._connect() as tx:
            rows = tx.rows("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
        found = {str(r["state"]): int(r["n"]) for r in rows}
        return {s: found.get(s, 0) for s in JOB_STATES}

    def start(self, job_id: str) -> None:
        with self._connect() as tx:
            tx.run(
                "UPDATE jobs SET state = 'running', started_at = ?"
                " WHERE id = ? AND state = 'queued'",
                (now(), job_id),
            )

    def progress(self, job_id: str, stage: str, fraction: float) -> None:
        with self._connect() as tx:
            tx.run(
                "UPDATE jobs SET stage = ?, progress = ? WHERE id = ? AND state = 'running'",
                (stage, min(1.0, max(0.0, float(fraction))), job_id),
            )

    def finish(self, job_id: str, result: Mapping[str, Any] | None) -> None:
        with self._connect() as tx:
            tx.run(
                "UPDATE jobs SET state = 'succeeded', progress = 1, result = ?, finished_at = ?"
                " WHERE id = ? AND state IN ('queued', 'running')",
                (json.dumps(dict(result or {}), sort_keys=True, default=str), now(), job_id),
            )

    def fail(self, job_id: str, error: Mapping[str, Any]) -> None:
        with self._connect() as tx:
            tx.run(
                "UPDATE jobs SET state = 'failed', error = ?, finished_at = ?"
                " WHERE id = ? AND state IN ('queued', 'running')",
                (json.dumps(dict(error), sort_keys=True, default=str), now(), job_id),
            )

    def recover(self, live_runners: set[str]) -> int:
        """Fail this host's unfinished jobs whose process or runner is gone.

        Returns:
            How many jobs were marked failed (code ``interrupted``).
        """
        host, me = socket.gethostname(), os.getpid()
        with self._connect() as tx:
            rows = tx.rows(
                "SELECT id, pid, runner_id FROM jobs"
                " WHERE state IN ('queued', 'running') AND host = ?",
                (host,),
            )
            orphans = [
                r["id"]
                for r in rows
                if (r["pid"] == me and r["runner_id"] not in live_runners)
                or (r["pid"] != me and not _pid_alive(int(r["pid"])))
            ]
            error = json.dumps(_INTERRUPTED)
            for job_id in orphans:
                tx.run(
                    "UPDATE jobs SET state = 'failed', error = ?, finished_at = ?"
                    " WHERE id = ? AND state IN ('queued', 'running')",
                    (error, now(), job_id),
                )
        if orphans:
            log.warning("marked %d interrupted jobs as failed", len(orphans))
        return len(orphans)


def _insert(
    tx: Tx,
    kind: str,
    params: Mapping[str, Any],
    owner: str | None,
    runner_id: str,
    key: str | None,
) -> str:
    job_id = f"job_{uuid.uuid4().hex[:20]}"
    tx.run(
        "INSERT INTO jobs (id, kind, state, params, owner, host, pid, runner_id,"
        " created_at, dedupe_key) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
        (
            job_id,
            kind,
            json.dumps(dict(params), sort_keys=True),
            owner,
            socket.gethostname(),
            os.getpid(),
            runner_id,
            now(),
            key,
        ),
    )
    return job_id


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


class _SqliteTx:
    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Mapping[str, Any]]:
        return list(self._con.execute(sql, args).fetchall())

    def run(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        self._con.execute(sql, args)

    def lock(self, kind: str, key: str) -> None:
        # The database's write lock: coarser than (kind, key), and as short.
        self._con.execute("BEGIN IMMEDIATE")


class JobStore(JobStoreBase):
    """Job records in a SQLite file (created with its directory on first use)."""

    _NEWEST = "created_at DESC, rowid DESC"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._ready = False
        self._ready_lock = threading.Lock()
        # One connection per thread, kept: opening one cost ~1.5 ms of every
        # ``GET /v1/jobs`` (issue 16). Keyed by pid too: a forked child opens its own.
        self._local = threading.local()

    def _prepare(self) -> None:
        with self._ready_lock:
            if not self._ready:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S) as con:
                    con.execute("PRAGMA journal_mode=WAL")
                    con.executescript(_SQLITE_SCHEMA)
                    _add_dedupe_key(con)
                con.close()
                self._ready = True

    def _open(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S)
        con.row_factory = sqlite3.Row
        return con

    def _held(self) -> _Held:
        held: _Held | None = getattr(self._local, "held", None)
        if held is None or held.pid != os.getpid():
            held = self._local.held = _Held(os.getpid(), self._open())
        return held

    @contextmanager
    def _connect(self) -> Iterator[Tx]:
        if not self._ready:
            self._prepare()
        held = self._held()
        if held.busy:  # a transaction inside one of this thread's: a connection of its own
            with closing(self._open()) as own, own:
                yield _SqliteTx(own)
            return
        held.busy = True
        try:
            with held.con:  # one transaction: committed on success, rolled back on error
                yield _SqliteTx(held.con)
        finally:
            held.busy = False

    def close(self) -> None:
        """Close the calling thread's kept connection (others close with their thread)."""
        held: _Held | None = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None and held.pid == os.getpid():
            held.con.close()


@dataclass
class _Held:
    """A thread's kept SQLite connection: the process that opened it, and whether a
    transaction is open on it."""

    pid: int
    con: sqlite3.Connection
    busy: bool = False


def _add_dedupe_key(con: sqlite3.Connection) -> None:
    """Give a job file from before dedupe keys their column and index."""
    columns = {row[1] for row in con.execute("PRAGMA table_info(jobs)")}
    if "dedupe_key" not in columns:
        con.execute("ALTER TABLE jobs ADD COLUMN dedupe_key TEXT")
    con.execute("CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (dedupe_key, kind)")


def open_job_store(catalog_uri: str, namespace: str, service_dir: Path) -> JobStoreBase:
    """The job store of a service: the catalog's PostgreSQL database when the catalog
    lives in one (table ``<namespace>_jobs``), else ``<service_dir>/jobs.db``."""
    if catalog_uri.startswith(("postgresql:", "postgresql+", "postgres:")):
        from service.job_store_pg import PostgresJobStore

        return PostgresJobStore(catalog_uri, namespace=namespace)
    return JobStore(service_dir / "jobs.db")
