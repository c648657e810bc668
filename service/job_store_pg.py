"""Job records in the catalog's PostgreSQL database, shared by every replica.

A table of its own, ``"<namespace>_jobs"`` (so two catalogs in one database keep
their jobs apart), next to pyiceberg's ``iceberg_tables``; the columns are the SQLite
store's plus ``seq``, an insertion order for ties of ``created_at``. Every call is one
transaction (psycopg2, from the catalog's SQLAlchemy URL), so replicas on any host read
and change the same rows; the table is created on first use under an advisory lock (two
replicas starting together do not race on the DDL). Connections are kept in a small
pool per process (a job reports progress many times a second; a new connection costs
a TCP and authentication round trip): a kept one is pinged before use and replaced when
the server dropped it, one that failed mid-transaction is closed, not returned, and a
forked child starts a pool of its own.
:meth:`~service.job_store.JobStoreBase.create_once` serialises on a transaction-scoped
advisory lock of (table, kind, key).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from catalog.errors import InvalidInput
from service.job_store import JobStoreBase, Tx

if TYPE_CHECKING:
    import psycopg2.extensions

__all__ = ["PostgresJobStore", "job_table_name"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,57}")
_TABLE_WORD = re.compile(r"\bjobs\b")


def job_table_name(namespace: str) -> str:
    """The jobs table of ``namespace`` (``<namespace>_jobs``, at most 63 characters)."""
    if not _NAME.fullmatch(namespace):
        raise InvalidInput(
            f"namespace {namespace!r} cannot name a PostgreSQL jobs table: use letters, "
            "digits and '_' (58 characters at most), starting with a letter or '_'",
            field="namespace",
        )
    return f"{namespace}_jobs"


def _schema(table: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS "{table}" (
            id          TEXT PRIMARY KEY,
            kind        TEXT NOT NULL,
            state       TEXT NOT NULL,
            stage       TEXT,
            progress    DOUBLE PRECISION NOT NULL DEFAULT 0,
            params      TEXT NOT NULL,
            result      TEXT,
            error       TEXT,
            owner       TEXT,
            host        TEXT NOT NULL,
            pid         INTEGER NOT NULL,
            runner_id   TEXT NOT NULL,
            created_at  TEXT NOT NULL,
            started_at  TEXT,
            finished_at TEXT,
            dedupe_key  TEXT,
            seq         BIGSERIAL
        )""",
        f'CREATE INDEX IF NOT EXISTS "{table}_by_state" ON "{table}" (state, created_at)',
        f'CREATE INDEX IF NOT EXISTS "{table}_by_created" ON "{table}" (created_at)',
        f'CREATE INDEX IF NOT EXISTS "{table}_by_key" ON "{table}" (dedupe_key, kind)',
    ]


def connect_args(url: str) -> dict[str, Any]:
    """psycopg2 ``connect`` keywords of a SQLAlchemy PostgreSQL URL."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    args: dict[str, Any] = {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "password": parsed.password,
        "dbname": parsed.database,
    }
    args.update({k: v for k, v in parsed.query.items() if isinstance(v, str)})
    return {k: v for k, v in args.items() if v is not None}


class _PgTx:
    def __init__(self, cur: Any, table: str) -> None:
        self._cur = cur
        self._table = table

    def _sql(self, sql: str) -> str:
        return _TABLE_WORD.sub(f'"{self._table}"', sql).replace("?", "%s")

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Mapping[str, Any]]:
        self._cur.execute(self._sql(sql), args)
        return [dict(r) for r in self._cur.fetchall()]

    def run(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        self._cur.execute(self._sql(sql), args)

    def lock(self, kind: str, key: str) -> None:
        self._cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (json.dumps([self._table, kind, key]),),
        )


class PostgresJobStore(JobStoreBase):
    """Job records in table ``<namespace>_jobs`` of the PostgreSQL database at ``url``
    (a SQLAlchemy URL, the catalog's own)."""

    _NEWEST = "created_at DESC, seq DESC"

    def __init__(self, url: str, *, namespace: str = "vidlake", keep: int = 4) -> None:
        self.table = job_table_name(namespace)
        self._args = connect_args(url)
        self._ready = False
        self._ready_lock = threading.Lock()
        self._keep = keep
        self._idle: list[psycopg2.extensions.connection] = []
        self._idle_lock = threading.Lock()
        self._pid = os.getpid()

    def _open(self) -> psycopg2.extensions.connection:
        import psycopg2

        return psycopg2.connect(**self._args)

    def _take(self) -> psycopg2.extensions.connection:
        """A kept connection that still answers, else a new one."""
        import psycopg2

        with self._idle_lock:
            if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
                self._idle, self._pid = [], os.getpid()
            kept = self._idle.pop() if self._idle else None
        while kept is not None:
            try:
                with kept.cursor() as cur:
                    cur.execute("SELECT 1")
                kept.rollback()
                return kept
            except psycopg2.Error:
                _close_quietly(kept)
            with self._idle_lock:
                kept = self._idle.pop() if self._idle else None
        return self._open()

    def _give_back(self, con: psycopg2.extensions.connection, *, healthy: bool) -> None:
        if healthy and not con.closed and os.getpid() == self._pid:
            with self._idle_lock:
                if len(self._idle) < self._keep:
                    self._idle.append(con)
                    return
        _close_quietly(con)

    def close(self) -> None:
        """Close the kept connections (a transaction in flight keeps its own)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for con in idle:
            _close_quietly(con)

    def _prepare(self) -> None:
        with self._ready_lock:
            if self._ready:
                return
            con = self._open()
            try:
                with con, con.cursor() as cur:
                    cur.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (self.table,)
                    )
                    for statement in _schema(self.table):
                        cur.execute(statement)
            finally:
                con.close()
            self._ready = True

    @contextmanager
    def _connect(self) -> Iterator[Tx]:
        import psycopg2
        from psycopg2.extras import RealDictCursor

        if not self._ready:
            self._prepare()
        con = self._take()
        healthy = False
        try:
            with con, con.cursor(cursor_factory=RealDictCursor) as cur:
                yield _PgTx(cur, self.table)
            healthy = True
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            raise  # the connection may be broken: closed below, never kept
        except BaseException:
            healthy = not con.closed  # rolled back by ``with con``; the connection is fine
            raise
        finally:
            self._give_back(con, healthy=healthy)


def _close_quietly(con: psycopg2.extensions.connection) -> None:
    import psycopg2

    with suppress(psycopg2.Error):
        con.close()
