"""The SQL sandbox: run a caller's query in a worker process under hard limits.

:meth:`Sandbox.run` is the one way the service runs SQL text from a caller (the SQL
endpoint, patch predicates). It builds the views whose names the text mentions and
hands query, views and limits to the worker pool (:mod:`service.sql.pool`). The
worker validates the text (:mod:`service.sql.validate`) before DuckDB sees it and
registers only the views the validated query reads, so validation runs inside the
deadline and on the worker's CPU, never holding the server's interpreter. The answer
comes back already encoded (JSON rows or an Arrow IPC stream) and capped in rows and
bytes.

Limits, each enforced where it cannot be bypassed:

* **time**: one deadline, ``timeout_s`` after the call, covers validation, waiting
  for a busy worker, execution and encoding (starting a new worker process does not
  count: that is the service's overhead); the worker interrupts DuckDB at the deadline
  and stops encoding past it; the pool kills the worker if no answer arrives
  :data:`~service.sql.pool.GRACE_S` later (a constant DuckDB cannot interrupt).
* **memory**: DuckDB's ``memory_limit`` for operators, and the worker's address-space
  cap (limit + headroom) for everything else, expression evaluation included.
* **result size**: at most ``row_limit`` rows and ``max_bytes`` bytes, ``truncated``
  set when more matched.
* **cancellation**: a set ``cancel`` event kills the worker at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds

from service.sql.pool import WorkerPool
from service.sql.validate import check_text, mentioned
from service.sql.views import Source, View
from service.sql.worker import Job

__all__ = ["DEFAULT_MAX_BYTES", "QueryResult", "Sandbox"]

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class QueryResult:
    """An encoded answer: ``body`` is a JSON array of row arrays (``format`` json) or
    an Arrow IPC stream (``format`` arrow) of ``row_count`` rows."""

    columns: tuple[tuple[str, str], ...]
    body: bytes
    format: str
    row_count: int
    truncated: bool
    elapsed_s: float

    @property
    def table(self) -> pa.Table:
        """The rows as an Arrow table (arrow format only)."""
        if self.format != "arrow":
            raise ValueError("only an arrow result has a table")
        return pa.ipc.open_stream(self.body).read_all()


def _as_view(made: View | ds.Dataset | pa.Table) -> View:
    """``made`` as a :class:`View` that pickles (an in-memory dataset does not; its
    table does)."""
    view = made if isinstance(made, View) else View(made)
    if isinstance(view.data, ds.InMemoryDataset):
        return View(view.data.to_table(), view.where)
    return view


class Sandbox:
    """Runs validated queries in locked-down DuckDB, in worker processes.

    Args:
        memory_limit: Memory of one query (DuckDB ``memory_limit`` and the worker's
            address-space cap above its idle size, e.g. ``1GB``).
        timeout_s: Wall-clock limit of one query.
        row_limit: Most rows a query returns.
        workers: Most queries running at once (one worker process each).
        max_bytes: Most bytes of an encoded result.
    """

    def __init__(
        self,
        memory_limit: str,
        timeout_s: float,
        row_limit: int,
        *,
        workers: int = 4,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.memory_limit = memory_limit
        self.timeout_s = timeout_s
        self.row_limit = row_limit
        self.max_bytes = max_bytes
        self._pool_lock = threading.Lock()
        self._workers = workers
        self._pool: WorkerPool | None = None

    @property
    def pool(self) -> WorkerPool:
        """The worker pool, created (no process started yet) on first use."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = WorkerPool(self.memory_limit, self._workers)
            return self._pool

    def run(
        self,
        sql: str,
        sources: Mapping[str, Source],
        limit: int | None = None,
        *,
        output: str = "arrow",
        cancel: threading.Event | None = None,
        row_cap: int | None = None,
        max_bytes: int | None = None,
    ) -> QueryResult:
        """Validate and run ``sql`` over ``sources`` (view name -> factory; only the
        views the query reads are built).

        Args:
            limit: Most rows (at most the row cap).
            output: ``json`` or ``arrow`` (see :class:`QueryResult`).
            cancel: Set it to stop the query (the worker is killed).
            row_cap: Most rows for this call instead of ``row_limit`` (the service's
                own queries, e.g. a patch predicate's matching rows).
            max_bytes: Most result bytes (default: the sandbox's).

        Raises:
            InvalidSQL: the query breaks a rule, fails in DuckDB, runs out of time or
                memory, or its first row alone is too large (``reason``: ``timeout``,
                ``memory``, ``execution``, ``result_too_large``, ``cancelled``…).
            SandboxBusy: every worker stayed busy until the deadline.
        """
        deadline = time.monotonic() + self.timeout_s  # validation and waiting count too
        check_text(sql)
        # The worker validates (its CPU, inside the deadline); the server only builds
        # the views whose names the text mentions.
        used = mentioned(sql, sources)
        most = self.row_limit if row_cap is None else row_cap
        cap = most if limit is None else max(1, min(limit, most))
        job = Job(
            sql=sql,
            allowed=frozenset(sources),
            views={name: _as_view(sources[name]()) for name in sorted(used)},
            memory_limit=self.memory_limit,
            timeout_s=self.timeout_s,
            deadline=deadline,
            max_rows=cap,
            max_bytes=self.max_bytes if max_bytes is None else max_bytes,
            output=output,
        )
        header, body = self.pool.run(job, cancel=cancel)
        return QueryResult(
            columns=tuple((str(n), str(t)) for n, t in header["columns"]),
            body=body,
            format=output,
            row_count=int(header["rows"]),
            truncated=bool(header["truncated"]),
            elapsed_s=float(header["elapsed_s"]),
        )

    def close(self) -> None:
        """Stop the worker processes."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
