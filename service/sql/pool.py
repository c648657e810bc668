"""A pool of sandbox worker processes (:mod:`service.sql.worker`).

Each worker is a separate Python process with its own address-space cap, so a query
that outgrows its memory limit takes down only its worker, never the server. The
pool hands a job to an idle worker (starting one when fewer than ``size`` run),
waits for the answer while watching the deadline and the caller's cancel event, and
kills the worker (``SIGKILL``) when the deadline plus a grace period passes without an
answer, when the caller cancels, or when the worker dies. A killed or recycled worker
is replaced in the background so that the next query finds one ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from catalog.errors import InvalidSQL, VidlakeError
from service.sql.worker import BOOT, Job

__all__ = ["SandboxBusy", "WorkerPool", "parse_bytes"]

log = logging.getLogger("vidlake.sql")

#: How long past its deadline a worker may take to answer before it is killed.
GRACE_S = 0.5
#: Address space a worker may add beyond DuckDB's memory limit (Arrow batches, the
#: encoded result, Python objects of one chunk).
HEADROOM_BYTES = 256 * 1024 * 1024
_START_TIMEOUT_S = 120.0
_WORKER_COMMAND = (sys.executable, "-c", BOOT)
_POLL_S = 0.05
_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


class SandboxBusy(VidlakeError):
    """Every sandbox worker stayed busy for the whole wait (``workers`` of them)."""

    code = "sql_busy"
    http_status = 503


def parse_bytes(text: str) -> int:
    """Bytes of a DuckDB-style size (``512MB``, ``1GiB``, ``2 GB``; KB = 1000 B)."""
    raw = text.strip().lower().replace(" ", "")
    digits = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(digits) :] or "b"
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not value > 0:
        raise InvalidSQL(f"not a memory size: {text!r} (e.g. 1GB, 512MiB)", reason="config")
    return int(value * _UNITS[unit])


class _Worker:
    """One worker process and the parent's end of its socket."""

    def __init__(self, memory_bytes: int) -> None:
        self.scratch = tempfile.mkdtemp(prefix="vidlake-sql-")
        parent, child = socket.socketpair()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([_code_root(), os.environ.get("PYTHONPATH", "")]),
            "HOME": self.scratch,
            "TMPDIR": self.scratch,
            "MALLOC_ARENA_MAX": "2",
            "ARROW_DEFAULT_MEMORY_POOL": "system",
            "OMP_NUM_THREADS": "1",
        }
        try:
            self.proc = subprocess.Popen(
                [*_WORKER_COMMAND, str(child.fileno()), str(memory_bytes), self.scratch],
                pass_fds=[child.fileno()],
                cwd=self.scratch,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.ready = False

    def wait_ready(self) -> None:
        if not self.conn.poll(_START_TIMEOUT_S):
            raise RuntimeError("a sandbox worker did not start")
        hello = json.loads(self.conn.recv_bytes())
        if not hello.get("ready"):
            raise RuntimeError(f"a sandbox worker failed to start: {hello}")
        self.ready = True

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def kill(self, *, wait: bool = True) -> None:
        """SIGKILL the process; reap it and remove its scratch directory now, or
        (``wait=False``) in a background thread, so that tearing down a large
        process does not delay the answer."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        if wait:
            self._reap()
        else:
            threading.Thread(target=self._reap, name="sql-reaper", daemon=True).start()

    def _reap(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self.conn.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _code_root() -> str:
    """The directory holding the ``service`` package this process runs."""
    return str(Path(__file__).resolve().parents[2])


def _shutdown(workers: list[_Worker]) -> None:
    for worker in list(workers):
        worker.kill()
    workers.clear()


class WorkerPool:
    """Up to ``size`` sandbox workers, each capped at ``memory_limit`` plus
    :data:`HEADROOM_BYTES` of address space.

    Args:
        memory_limit: DuckDB ``memory_limit`` of every query (e.g. ``1GB``).
        size: Most workers alive at once (= most queries running at once).
    """

    def __init__(self, memory_limit: str, size: int = 4) -> None:
        if size < 1:
            raise InvalidSQL("the SQL pool needs at least one worker", reason="config")
        self.memory_limit = memory_limit
        self.memory_bytes = parse_bytes(memory_limit)
        self.size = size
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._starting = 0
        self._closed = False
        self.stats = {"started": 0, "killed": 0, "recycled": 0, "cancelled": 0}
        self._finalizer = weakref.finalize(self, _shutdown, self._all)

    # -- public -------------------------------------------------------------------------
    def run(
        self, job: Job, *, cancel: threading.Event | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """Run ``job`` in a worker; return its header and body.

        Raises:
            InvalidSQL: ``timeout`` (no answer by the deadline), ``memory`` (the worker
                died or ran out of memory), ``cancelled``, or the worker's own error.
            SandboxBusy: no worker came free within the job's timeout.
        """
        worker, started_s = self._acquire(job, cancel)
        if started_s:
            # Starting a worker is the service's overhead, not the query's time.
            job = dataclasses.replace(job, deadline=job.deadline + started_s)
        healthy = False
        try:
            header, body = self._exchange(worker, job, cancel)
            healthy = not header.get("recycle")
            if not healthy:
                self.stats["recycled"] += 1
        finally:
            self._release(worker, healthy)
        if not header.get("ok"):
            error = header.get("error") or {"message": "out of memory", "details": {}}
            details = dict(error.get("details") or {})
            if header.get("recycle"):
                details.setdefault("reason", "memory")
            raise InvalidSQL(str(error.get("message")), **details)
        return header, body

    def pids(self) -> list[int]:
        """Process ids of the live workers (for RSS accounting)."""
        with self._cond:
            return [w.pid for w in self._all]

    def warm(self, count: int = 1) -> None:
        """Start workers until ``count`` are idle or starting (at most ``size``)."""
        with self._cond:
            todo = min(count - len(self._idle) - self._starting, self.size - self._alive())
            self._starting += max(0, todo)
        for _ in range(max(0, todo)):
            threading.Thread(target=self._start_idle, daemon=True).start()

    def close(self) -> None:
        """Kill every worker; later runs raise."""
        with self._cond:
            self._closed = True
            self._idle.clear()
            self._cond.notify_all()
        self._finalizer()

    # -- workers ------------------------------------------------------------------------
    def _alive(self) -> int:
        return len(self._all) + self._starting

    def _acquire(self, job: Job, cancel: threading.Event | None) -> tuple[_Worker, float]:
        """An idle worker, else a new one; with the seconds spent starting it."""
        with self._cond:
            while True:
                if self._closed:
                    raise InvalidSQL("the SQL sandbox is shut down", reason="closed")
                if cancel is not None and cancel.is_set():
                    raise _cancelled()
                while self._idle:
                    worker = self._idle.pop()
                    if worker.proc.poll() is None:
                        return worker, 0.0
                    self._all.remove(worker)  # died while idle (the OOM killer, say)
                    worker.kill(wait=False)
                if self._alive() < self.size:
                    self._starting += 1
                    break
                left = job.deadline - time.monotonic()
                if left <= 0:
                    raise SandboxBusy(
                        f"all {self.size} SQL workers stayed busy past the query's "
                        f"{job.timeout_s:g} s deadline; retry later",
                        workers=self.size,
                    )
                self._cond.wait(min(left, _POLL_S * 4))
        begun = time.monotonic()
        worker = self._start()
        return worker, time.monotonic() - begun

    def _start(self) -> _Worker:
        """A new worker (the caller counted it in ``_starting``)."""
        try:
            worker = _Worker(self.memory_bytes + HEADROOM_BYTES)
            try:
                worker.wait_ready()
            except BaseException:
                worker.kill()
                raise
        finally:
            with self._cond:
                self._starting -= 1
        with self._cond:
            self._all.append(worker)
            self.stats["started"] += 1
        return worker

    def _start_idle(self) -> None:
        try:
            worker = self._start()
        except Exception:  # a failed background start leaves the next run to retry
            log.warning("starting a spare SQL sandbox worker failed", exc_info=True)
            return
        self._release(worker, healthy=True)

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            if worker in self._all:
                self._all.remove(worker)
        worker.kill(wait=False)
        if not self._closed:
            self.warm(1)

    def _exchange(
        self, worker: _Worker, job: Job, cancel: threading.Event | None
    ) -> tuple[dict[str, Any], bytes]:
        try:
            worker.conn.send_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
            self._wait(worker, job, cancel)
            header = json.loads(worker.conn.recv_bytes())
            body = worker.conn.recv_bytes()
        except (EOFError, OSError, ValueError):
            self.stats["killed"] += 1
            return {"ok": False, "error": _died(job).to_dict(), "recycle": True}, b""
        return header, body

    def _wait(self, worker: _Worker, job: Job, cancel: threading.Event | None) -> None:
        """Return once an answer is ready; kill the worker past the deadline or on
        cancel (raising), or when it dies (the next read raises EOFError)."""
        deadline = job.deadline + GRACE_S
        while not worker.conn.poll(_POLL_S):
            if cancel is not None and cancel.is_set():
                self._kill(worker, "cancelled")
                raise _cancelled()
            if time.monotonic() >= deadline:
                self._kill(worker, "killed")
                raise InvalidSQL(
                    f"the query ran longer than {job.timeout_s:g} s and was stopped",
                    reason="timeout",
                    limit_s=job.timeout_s,
                )
            if worker.proc.poll() is not None:
                return

    def _kill(self, worker: _Worker, stat: str) -> None:
        self.stats[stat] += 1
        with self._cond:
            if worker in self._all:
                self._all.remove(worker)
        worker.kill(wait=False)


def _cancelled() -> InvalidSQL:
    return InvalidSQL("the request was cancelled; its query was stopped", reason="cancelled")


def _died(job: Job) -> InvalidSQL:
    return InvalidSQL(
        f"the query's sandbox worker died, most likely past the memory limit of "
        f"{job.memory_limit}; it was replaced",
        reason="memory",
        limit=job.memory_limit,
    )
