"""A sandbox worker process: runs queries in locked-down DuckDB under hard limits.

Started by :class:`service.sql.pool.WorkerPool` as ``python -c BOOT FD MEMORY_BYTES
SCRATCH`` (:data:`BOOT` lowers the CPU priority before anything is imported). It
works in ``SCRATCH`` (an empty directory that is also its home), warms DuckDB and
pyarrow up, and before every query caps its own address space at its size then plus
``MEMORY_BYTES`` (``RLIMIT_AS``): a query can never make the process grow by more,
whether DuckDB's buffer manager sees the allocation (a join, a sort) or not (a
constant ``repeat('x', 10^9)``). An allocation past the cap fails inside the worker,
which answers ``memory`` (and exits when Python or Arrow rather than DuckDB ran out;
the pool starts a fresh one).

Protocol on the socket ``FD`` (``multiprocessing.connection`` framing): the pool sends
one pickled :class:`Job`; the worker validates its SQL (the first wall), runs it, and
answers two frames, a JSON header and a body (the encoded rows,
:mod:`service.sql.results`). The pool never unpickles anything a worker sends. A
watchdog thread interrupts DuckDB at the job's deadline; encoding checks the same
deadline; the pool kills the worker if no answer comes shortly after it.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import resource
import shutil
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import duckdb
import pyarrow as pa

from catalog.errors import InvalidSQL, VidlakeError
from service.sql.connection import sandbox_connection
from service.sql.results import Encoded, encode_arrow, encode_json
from service.sql.validate import validate_query
from service.sql.views import View

__all__ = ["BOOT", "NICE", "Job", "main"]

#: Workers yield the CPU to the server (runaway queries must not slow /v1/health);
#: set first thing, before the imports.
NICE = 10
#: The worker's ``python -c`` program: lower the priority, then import.
BOOT = (
    f"import os, sys; os.nice({NICE}); from service.sql.worker import main; "
    "sys.exit(main(sys.argv[1:]))"
)
#: Rows DuckDB hands over per Arrow batch.
_BATCH_ROWS = 2048


@dataclass(frozen=True)
class Job:
    """One query for a worker: ``sql``, validated against the view names ``allowed``,
    over ``views`` (name -> :class:`View`, at least every allowed name the text
    mentions), answered by ``deadline`` (``time.monotonic()``: one clock for every
    process of the machine); ``timeout_s`` is the configured limit behind it."""

    sql: str
    allowed: frozenset[str]
    views: dict[str, View]
    memory_limit: str
    timeout_s: float
    deadline: float
    max_rows: int
    max_bytes: int
    output: str = "json"  # or "arrow"
    threads: int = 1
    #: False only in tests of the second wall (every view registered, no first wall).
    validate: bool = True


class _Watchdog:
    """One long-lived thread (started before the address space is capped) that
    interrupts the armed connection at its deadline, and ends the process when the
    pool that started it is gone."""

    def __init__(self, scratch: str) -> None:
        self._scratch = scratch
        self._cond = threading.Condition()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._deadline = 0.0
        self.fired = False
        self._parent = os.getppid()
        threading.Thread(target=self._loop, name="sql-watchdog", daemon=True).start()

    def arm(self, con: duckdb.DuckDBPyConnection, deadline: float) -> None:
        with self._cond:
            self._con, self._deadline, self.fired = con, deadline, False
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._con = None

    def _loop(self) -> None:
        while True:
            with self._cond:
                wait = self._deadline - time.monotonic() if self._con is not None else 1.0
                self._cond.wait(timeout=max(0.0, min(wait, 1.0)))
                if self._con is not None and time.monotonic() >= self._deadline:
                    self.fired = True
                    self._con.interrupt()
                    self._con = None
            if os.getppid() != self._parent:  # the pool died: nobody will read an answer
                shutil.rmtree(self._scratch, ignore_errors=True)
                os._exit(3)


def _check(deadline: float, timeout_s: float) -> None:
    if time.monotonic() >= deadline:
        raise _timeout(timeout_s)


def _timeout(timeout_s: float) -> InvalidSQL:
    return InvalidSQL(
        f"the query ran longer than {timeout_s:g} s and was stopped",
        reason="timeout",
        limit_s=timeout_s,
    )


class _Recycle(InvalidSQL):
    """An error after which the worker exits (the pool starts a fresh one)."""


def _memory(job: Job, detail: str, *, recycle: bool = False) -> InvalidSQL:
    kind = _Recycle if recycle else InvalidSQL
    return kind(
        f"the query needs more than {job.memory_limit} of memory: {detail}",
        reason="memory",
        limit=job.memory_limit,
    )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _execute(
    job: Job, watchdog: _Watchdog, space: _AddressSpace, scratch: str
) -> tuple[Encoded, pa.Schema]:
    deadline = job.deadline
    used = _validated(job)
    con = sandbox_connection(job.memory_limit, job.threads, scratch)
    try:
        for name in sorted(used):
            con.register(name, job.views[name].dataset())
        space.rebase()
        watchdog.arm(con, deadline)
        try:
            reader = con.sql(job.sql).to_arrow_reader(_BATCH_ROWS)
            batches = _checked(reader, deadline, job.timeout_s)
            check = functools.partial(_check, deadline, job.timeout_s)
            if job.output == "arrow":
                schema = reader.schema
                encoded = encode_arrow(batches, schema, job.max_rows, job.max_bytes, check)
            else:
                encoded = encode_json(batches, job.max_rows, job.max_bytes, check)
            _check(deadline, job.timeout_s)
        finally:
            watchdog.disarm()
        return encoded, reader.schema
    except duckdb.InterruptException:
        raise _timeout(job.timeout_s) from None
    except duckdb.OutOfMemoryException as exc:
        raise _memory(job, _first_line(exc)) from None
    except (MemoryError, pa.ArrowMemoryError) as exc:
        # Python or Arrow ran out mid-way: this process may be in a bad state.
        raise _memory(job, _first_line(exc), recycle=True) from None
    except (duckdb.Error, pa.ArrowException, OSError) as exc:
        # An interrupt that lands while Arrow batches stream surfaces as an Arrow
        # error ("INTERRUPT Error"), not as duckdb.InterruptException.
        if watchdog.fired:
            raise _timeout(job.timeout_s) from None
        raise InvalidSQL(f"the query failed: {_first_line(exc)}", reason="execution") from None
    finally:
        con.close()


def _validated(job: Job) -> set[str]:
    """The first wall, here so that its cost counts against the deadline and its
    CPU is this process's, not the server's."""
    if not job.validate:
        return set(job.views)
    used = validate_query(job.sql, job.allowed)
    missing = used - set(job.views)
    if missing:
        raise InvalidSQL(
            f"the query reads {', '.join(sorted(missing))} in a way the service cannot offer",
            reason="table",
            name=sorted(missing)[0],
        )
    _check(job.deadline, job.timeout_s)
    return used


def _checked(reader: pa.RecordBatchReader, deadline: float, timeout_s: float) -> Any:
    for batch in reader:
        _check(deadline, timeout_s)
        yield batch


def _answer(
    job: Job, watchdog: _Watchdog, space: _AddressSpace, scratch: str
) -> tuple[dict[str, Any], bytes]:
    start = time.monotonic()
    try:
        encoded, schema = _execute(job, watchdog, space, scratch)
    except VidlakeError as exc:
        return {"ok": False, "error": exc.to_dict(), "recycle": isinstance(exc, _Recycle)}, b""
    return {
        "ok": True,
        "rows": encoded.rows,
        "truncated": encoded.truncated,
        "columns": [[f.name, str(f.type)] for f in schema],
        "elapsed_s": time.monotonic() - start,
    }, encoded.body


def _warm_up(scratch: str) -> None:
    """Touch everything a query touches, so the idle address space is measured
    with the libraries' lazy state already in place."""
    import pyarrow.dataset as ds

    con = sandbox_connection("64MB", 1, scratch)
    con.register("t", ds.dataset(pa.table({"x": [1, 2]})))
    reader = con.sql("SELECT x, 'a' AS s FROM t").to_arrow_reader(_BATCH_ROWS)
    encode_json(reader, 10, 1 << 20)
    con.close()


class _AddressSpace:
    """The worker's memory cap: ``RLIMIT_AS`` at the current size plus ``extra``.

    :meth:`rebase` sets it right before a query runs (after its views are built, so a
    file system client's one-time set-up counts as the base, not against the query).
    Only this code can move the limit: SQL has no way to call ``setrlimit``. A worker
    that stays much larger than it started after a query exits instead
    (:meth:`bloated`), so that re-basing cannot let it creep.
    """

    def __init__(self, extra: int) -> None:
        self.extra = extra
        self.start_rss = _statm()[1]

    def rebase(self) -> int:
        cap = _statm()[0] + self.extra
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
        return cap

    def bloated(self) -> bool:
        return _statm()[1] > self.start_rss + self.extra // 2


def _statm() -> tuple[int, int]:
    """(virtual size, resident size) of this process in bytes."""
    with open("/proc/self/statm") as f:
        size, resident = f.read().split()[:2]
    page = os.sysconf("SC_PAGE_SIZE")
    return int(size) * page, int(resident) * page


def _serve(conn: Connection, watchdog: _Watchdog, space: _AddressSpace, scratch: str) -> None:
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            job = pickle.loads(data)
            header, body = _answer(job, watchdog, space, scratch)
        except MemoryError:
            header, body = {"ok": False, "error": None, "recycle": True}, b""
        except Exception as exc:  # a bug here must not look like a memory failure
            error = InvalidSQL(f"the sandbox failed: {_first_line(exc)}", reason="internal")
            header, body = {"ok": False, "error": error.to_dict(), "recycle": True}, b""
        header["recycle"] = header.get("recycle") or space.bloated()
        conn.send_bytes(json.dumps(header).encode())
        conn.send_bytes(body)
        if header["recycle"]:
            return


def main(argv: list[str]) -> int:
    fd, extra, scratch = int(argv[0]), int(argv[1]), argv[2]
    os.chdir(scratch)
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    conn = Connection(fd)
    watchdog = _Watchdog(scratch)
    _warm_up(scratch)
    space = _AddressSpace(extra)
    cap = space.rebase()
    conn.send_bytes(json.dumps({"ready": True, "pid": os.getpid(), "cap": cap}).encode())
    try:
        _serve(conn, watchdog, space, scratch)
    finally:  # the pool also removes it, unless the pool itself died
        shutil.rmtree(scratch, ignore_errors=True)
    return 0
