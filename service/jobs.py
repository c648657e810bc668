"""Background jobs with persistent records.

A job is any callable ``fn(progress) -> result`` (a snapshot cut, in practice) run on
a small thread pool. ``progress(stage, fraction)`` records where it is. Every state
change is written to a SQLite file (WAL mode, one short transaction per change), so
job records outlive the process:

* states: ``queued`` → ``running`` → ``succeeded`` | ``failed``;
* a failure records the error in the service's error shape (a
  :class:`~catalog.errors.VidlakeError`'s ``to_dict()``, e.g. the ``conflict`` of a
  cut that lost the race for a version number);
* on start, a :class:`JobRunner` marks **interrupted** every queued or running job
  of this host whose process is gone (or is this process, under a runner that no
  longer exists) as failed with code ``interrupted``: after a crash or a restart, a
  job is never left "running" forever nor forgotten.

Jobs of other hosts sharing the file are left alone: their liveness cannot be told
from here.

**Once per key.** :meth:`JobRunner.submit_once` records a job under a *dedupe key*
(a cut's inputs key) inside one ``BEGIN IMMEDIATE`` transaction: if a job of that kind
and key is queued, running or has succeeded, that job is returned instead of a new
one, so identical requests arriving together share one job, across threads and
processes. :meth:`JobRunner.submit` may record a key too (a forced new cut), which
such requests then join. A failed job never absorbs later requests.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from catalog.errors import InvalidInput, NotFound, VidlakeError

__all__ = ["JOB_STATES", "JobRecord", "JobRunner", "JobState", "JobStore", "Progress"]

log = logging.getLogger("vidlake.jobs")

JobState = Literal["queued", "running", "succeeded", "failed"]
JOB_STATES: tuple[JobState, ...] = ("queued", "running", "succeeded", "failed")
Progress = Callable[[str, float], None]
JobFn = Callable[[Progress], Mapping[str, Any] | None]
FinishHook = Callable[["JobRecord"], None]

_SCHEMA = """
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
_PROGRESS_EVERY_S = 0.2
_BUSY_TIMEOUT_S = 30.0
# Runners alive in this process: a job of this pid under any other runner id was
# orphaned by a runner that closed without finishing it.
_LIVE_RUNNERS: set[str] = set()
_LIVE_LOCK = threading.Lock()


def _now() -> str:
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


def _record(row: sqlite3.Row) -> JobRecord:
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


class JobStore:
    """Job records in a SQLite file (created with its directory on first use).

    Safe to share between threads and processes: every call opens its own
    connection and changes rows in one transaction.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._ready = False
        self._ready_lock = threading.Lock()

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not self._ready:
            with self._ready_lock:
                if not self._ready:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    with sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S) as con:
                        con.execute("PRAGMA journal_mode=WAL")
                        con.executescript(_SCHEMA)
                        _add_dedupe_key(con)
                    con.close()
                    self._ready = True
        con = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S)
        con.row_factory = sqlite3.Row
        try:
            with con:  # one transaction: committed on success, rolled back on error
                yield con
        finally:
            con.close()

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
        with self._connect() as con:
            job_id = _insert(con, kind, params, owner, runner_id, key)
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
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")  # the lookup and the insert under one lock
            row = con.execute(
                "SELECT * FROM jobs WHERE dedupe_key = ? AND kind = ? AND state != 'failed'"
                " ORDER BY created_at DESC, rowid DESC LIMIT 1",
                (key, kind),
            ).fetchone()
            if row is not None:
                return _record(row), False
            job_id = _insert(con, kind, params, owner, runner_id, key)
        return self.get(job_id), True

    def get(self, job_id: str) -> JobRecord:
        """One job; NotFound when there is no such id."""
        with self._connect() as con:
            row = con.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id!r}", job_id=job_id)
        return _record(row)

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
        with self._connect() as con:
            rows = con.execute(
                f"SELECT * FROM jobs {where} ORDER BY created_at DESC, id LIMIT ?",
                (*args, int(limit)),
            ).fetchall()
        return [_record(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state (every state present, zeros included)."""
        with self._connect() as con:
            rows = con.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        found = {str(r[0]): int(r[1]) for r in rows}
        return {s: found.get(s, 0) for s in JOB_STATES}

    def start(self, job_id: str) -> None:
        with self._connect() as con:
            con.execute(
                "UPDATE jobs SET state = 'running', started_at = ?"
                " WHERE id = ? AND state = 'queued'",
                (_now(), job_id),
            )

    def progress(self, job_id: str, stage: str, fraction: float) -> None:
        with self._connect() as con:
            con.execute(
                "UPDATE jobs SET stage = ?, progress = ? WHERE id = ? AND state = 'running'",
                (stage, min(1.0, max(0.0, float(fraction))), job_id),
            )

    def finish(self, job_id: str, result: Mapping[str, Any] | None) -> None:
        with self._connect() as con:
            con.execute(
                "UPDATE jobs SET state = 'succeeded', progress = 1, result = ?, finished_at = ?"
                " WHERE id = ? AND state IN ('queued', 'running')",
                (json.dumps(dict(result or {}), sort_keys=True, default=str), _now(), job_id),
            )

    def fail(self, job_id: str, error: Mapping[str, Any]) -> None:
        with self._connect() as con:
            con.execute(
                "UPDATE jobs SET state = 'failed', error = ?, finished_at = ?"
                " WHERE id = ? AND state IN ('queued', 'running')",
                (json.dumps(dict(error), sort_keys=True, default=str), _now(), job_id),
            )

    def recover(self, live_runners: set[str]) -> int:
        """Fail this host's unfinished jobs whose process or runner is gone.

        Returns:
            How many jobs were marked failed (code ``interrupted``).
        """
        host, me = socket.gethostname(), os.getpid()
        with self._connect() as con:
            rows = con.execute(
                "SELECT id, pid, runner_id, state FROM jobs"
                " WHERE state IN ('queued', 'running') AND host = ?",
                (host,),
            ).fetchall()
            orphans = [
                r["id"]
                for r in rows
                if (r["pid"] == me and r["runner_id"] not in live_runners)
                or (r["pid"] != me and not _pid_alive(int(r["pid"])))
            ]
            error = json.dumps(
                {
                    "code": "interrupted",
                    "message": "the service stopped before this job finished; start it again",
                    "details": {},
                }
            )
            for job_id in orphans:
                con.execute(
                    "UPDATE jobs SET state = 'failed', error = ?, finished_at = ? WHERE id = ?",
                    (error, _now(), job_id),
                )
        if orphans:
            log.warning("marked %d interrupted jobs as failed", len(orphans))
        return len(orphans)


def _add_dedupe_key(con: sqlite3.Connection) -> None:
    """Give a job file from before dedupe keys their column and index."""
    columns = {row[1] for row in con.execute("PRAGMA table_info(jobs)")}
    if "dedupe_key" not in columns:
        con.execute("ALTER TABLE jobs ADD COLUMN dedupe_key TEXT")
    con.execute("CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (dedupe_key, kind)")


def _insert(
    con: sqlite3.Connection,
    kind: str,
    params: Mapping[str, Any],
    owner: str | None,
    runner_id: str,
    key: str | None,
) -> str:
    job_id = f"job_{uuid.uuid4().hex[:20]}"
    con.execute(
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
            _now(),
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


class JobRunner:
    """Runs job functions on a thread pool and keeps their records current.

    Args:
        store: Where records live.
        workers: Jobs run at once (more wait ``queued``).
        on_finish: Called with the final record of every job (metrics).
    """

    def __init__(self, store: JobStore, *, workers: int = 2, on_finish: FinishHook | None = None):
        self.store = store
        self.runner_id = uuid.uuid4().hex
        self._on_finish = on_finish
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vidlake-job")
        with _LIVE_LOCK:
            _LIVE_RUNNERS.add(self.runner_id)
            live = set(_LIVE_RUNNERS)
        self.recovered = store.recover(live)

    def submit(
        self,
        kind: str,
        fn: JobFn,
        params: Mapping[str, Any],
        *,
        owner: str | None = None,
        key: str | None = None,
    ) -> JobRecord:
        """Record a queued job and schedule ``fn``; returns the queued record. With
        ``key``, later :meth:`submit_once` calls with that key join this job."""
        record = self.store.create(kind, params, owner=owner, runner_id=self.runner_id, key=key)
        self._pool.submit(self._run, record.id, fn)
        return record

    def submit_once(
        self,
        kind: str,
        fn: JobFn,
        params: Mapping[str, Any],
        *,
        key: str,
        owner: str | None = None,
    ) -> tuple[JobRecord, bool]:
        """Like :meth:`submit`, unless a job of ``kind`` with dedupe ``key`` is queued,
        running or succeeded: then that job, not run again. Returns (record, created)."""
        record, created = self.store.create_once(
            kind, params, key=key, owner=owner, runner_id=self.runner_id
        )
        if created:
            self._pool.submit(self._run, record.id, fn)
        return record, created

    def _run(self, job_id: str, fn: JobFn) -> None:
        self.store.start(job_id)
        last_at, last_stage = 0.0, ""

        def progress(stage: str, fraction: float) -> None:
            # Throttled: a cut may report thousands of times; SQLite needs a few.
            nonlocal last_at, last_stage
            now = time.monotonic()
            if stage != last_stage or fraction >= 1.0 or now - last_at >= _PROGRESS_EVERY_S:
                last_at, last_stage = now, stage
                self.store.progress(job_id, str(stage), fraction)

        try:
            result = fn(progress)
        except VidlakeError as exc:
            log.info("job %s failed: %s", job_id, exc)
            self.store.fail(job_id, exc.to_dict())
        except Exception as exc:  # a bug in the job: keep the record honest, log the trace
            log.exception("job %s crashed", job_id)
            self.store.fail(
                job_id,
                {
                    "code": "internal_error",
                    "message": f"{type(exc).__name__}: {exc}",
                    "details": {},
                },
            )
        else:
            self.store.finish(job_id, result)
        if self._on_finish is not None:
            try:
                self._on_finish(self.store.get(job_id))
            except Exception:  # metrics must never break a job
                log.exception("on_finish hook failed for job %s", job_id)

    def close(self, *, wait: bool = True) -> None:
        """Stop taking jobs; with ``wait``, let running ones finish."""
        self._pool.shutdown(wait=wait, cancel_futures=True)
        with _LIVE_LOCK:
            _LIVE_RUNNERS.discard(self.runner_id)
            live = set(_LIVE_RUNNERS)
        if wait:
            # Jobs cancelled while still queued would otherwise stay queued until the
            # next runner starts.
            self.store.recover(live)
