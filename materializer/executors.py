"""Executors: where a partitioned cut's tasks run (:mod:`materializer.partition`).

One seam, three implementations, chosen by a spec string (``vidlake cut --executor``):

``local``
    A process pool on this machine, one process per CPU (at most one per task). The
    default; a cut of one partition runs in this process without a pool.
``local:N``
    A pool of ``N`` processes; ``local:1`` runs every task in this process.
``ray://host:port`` or ``auto``
    Ray tasks on a cluster: the Ray Client address of an existing cluster, or
    ``auto``, which connects to the address the caller resolved (the settings read
    ``RAY_ADDRESS``; the materializer reads no environment) or else to the cluster
    running on this machine. A process that already called ``ray.init`` (a test, a
    notebook) is used as it is. Ray is the optional extra ``vidlake[ray]``.

Every executor runs ``fn(shared, task)`` for each task and returns the results in task
order; ``shared`` (what every task needs, :mod:`materializer.partition`) is sent to
each worker once, not once per task (a file the pool's workers load; ``ray.put``). The results
do not depend on the executor: the artifacts of a cut are byte-identical for every
one of them.

A task that fails fails the map, naming it (``partition i of n`` in the message, or
the map's ``label`` for ``partition``: ``asset partition i of n``; ``partition`` and
``partitions`` in the details; :func:`task_failed`): a
:class:`~catalog.errors.VidlakeError` keeps its class, anything else (a bug, a worker
out of memory or killed, which a pool reports as a broken pool and Ray as a crashed
worker) is a :class:`~catalog.errors.StorageError`. The remaining tasks are
cancelled. Ray retries a task whose worker died (``max_retries``, its default 3)
before the map fails; an exception the task raises itself is not retried.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from catalog.errors import InvalidInput, NotInstalled, StorageError, VidlakeError

__all__ = ["Executor", "ExecutorSpec", "open_executor", "parse_executor", "task_failed"]

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

_LOCAL = re.compile(r"^local(?::([1-9][0-9]{0,3}))?$")
_RAY = re.compile(r"^ray://[A-Za-z0-9._-]+:[0-9]{1,5}$")


@dataclass(frozen=True)
class ExecutorSpec:
    """A parsed ``--executor`` value.

    Attributes:
        kind: ``local`` or ``ray``.
        processes: Local pool size (None: one per CPU).
        address: The Ray address (``ray://host:port``, ``auto``), for ``ray``.
    """

    kind: str
    processes: int | None = None
    address: str | None = None

    def __str__(self) -> str:
        if self.kind == "ray":
            return str(self.address)
        return "local" if self.processes is None else f"local:{self.processes}"


def parse_executor(spec: str | None) -> ExecutorSpec:
    """``spec`` (None: ``local``) as an :class:`ExecutorSpec`.

    Raises:
        InvalidInput: Not ``local``, ``local:N`` (1..9999), ``ray://host:port`` or ``auto``.
    """
    text = (spec or "local").strip()
    if m := _LOCAL.match(text):
        return ExecutorSpec("local", int(m.group(1)) if m.group(1) else None)
    if text == "auto" or _RAY.match(text):
        return ExecutorSpec("ray", address=text)
    raise InvalidInput(
        f"executor {text!r}: expected 'local', 'local:N', 'ray://host:port' or 'auto'",
        field="executor",
        value=text,
    )


class Executor(Protocol):
    """Runs ``fn(shared, task)`` for every task; results in task order."""

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        tasks: Sequence[T],
        *,
        label: str = "partition",
    ) -> list[R]: ...


def open_executor(spec: ExecutorSpec | str | None, *, ray_address: str | None = None) -> Executor:
    """The executor ``spec`` names; ``ray_address`` is what ``auto`` connects to
    (None: the cluster on this machine)."""
    parsed = spec if isinstance(spec, ExecutorSpec) else parse_executor(spec)
    if parsed.kind == "ray":
        address = parsed.address
        if address == "auto" and ray_address:
            address = ray_address
        return RayExecutor(address or "auto")
    return LocalExecutor(parsed.processes)


class LocalExecutor:
    """A process pool of ``processes`` (None: one per CPU); 1 runs in this process.

    Inside ``with executor:`` every map reuses one pool, so that a partitioned cut's
    stages spawn (and import in) their workers once; outside, each map has its own
    pool, shut down when it returns. A map's ``shared`` is pickled once to a file of
    the pool's and loaded once per worker and map."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._size = 0
        self._depth = 0
        self._maps = 0
        self._dir: str | None = None

    def __enter__(self) -> LocalExecutor:
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._close()

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        tasks: Sequence[T],
        *,
        label: str = "partition",
    ) -> list[R]:
        workers = min(self.processes or os.cpu_count() or 1, len(tasks))
        if workers <= 1:
            return [_in_process(fn, shared, tasks, i, label) for i in range(len(tasks))]
        with self:
            pool, blob = self._open(workers), self._share(shared)
            try:
                futures = [pool.submit(_call_shared, fn, blob, t) for t in tasks]
                return [_result(f, i, futures, label) for i, f in enumerate(futures)]
            except BaseException:
                self._close()  # a failed map's pool (perhaps broken) is not reused
                raise
            finally:
                Path(blob).unlink(missing_ok=True)

    def _open(self, workers: int) -> ProcessPoolExecutor:
        if self._pool is None or workers > self._size:
            self._close()
            # spawn: the parent holds DuckDB and pyiceberg threads, which fork would copy.
            context = multiprocessing.get_context("spawn")
            self._pool, self._size = ProcessPoolExecutor(workers, mp_context=context), workers
            self._dir = tempfile.mkdtemp(prefix="vidlake-pool-")
        return self._pool

    def _share(self, shared: Any) -> str:
        assert self._dir is not None
        self._maps += 1
        path = Path(self._dir) / f"shared-{self._maps}.pickle"
        path.write_bytes(pickle.dumps(shared, protocol=5))
        return str(path)

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._size = None, 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _in_process(fn: Callable[[S, T], R], shared: S, tasks: Sequence[T], i: int, label: str) -> R:
    try:
        return fn(shared, tasks[i])
    except Exception as exc:
        raise task_failed(exc, i, len(tasks), "local", label=label) from exc


def _result(future: Future[R], i: int, futures: list[Future[R]], label: str) -> R:
    try:
        return future.result()
    except Exception as exc:
        for other in futures:
            other.cancel()
        raise task_failed(exc, i, len(futures), "local", label=label) from exc


def task_failed(
    exc: BaseException, i: int, n: int, executor: str, *, label: str = "partition"
) -> VidlakeError:
    """The error a map raises when task ``i`` of ``n`` failed with ``exc``: a
    :class:`VidlakeError` of its own class gains the partition (message and details),
    anything else becomes a :class:`StorageError` that names it. ``label`` names the
    stage's tasks (``partition``, ``asset partition``)."""
    where = f"{label} {i} of {n}"
    if isinstance(exc, VidlakeError):
        exc.message = f"{where}: {exc.message}"
        exc.args = (exc.message,)
        exc.details.update(partition=i, partitions=n)
        return exc
    if isinstance(exc, BrokenProcessPool | WorkerDied):
        cause = "its worker process died (killed, or out of memory)"
    else:
        cause = f"{type(exc).__name__}: {exc}"
    return StorageError(
        f"{where} failed on executor {executor!r}: {cause}; nothing was published",
        partition=i,
        partitions=n,
        executor=executor,
    )


class WorkerDied(Exception):
    """A task's worker process died (Ray's ``WorkerCrashedError``, its OOM kill)."""


#: In a pool worker: the path of the map's shared value last loaded, and the value.
_SHARED: dict[str, Any] = {}


def _call_shared(fn: Callable[[Any, Any], Any], blob: str, task: Any) -> Any:
    if blob not in _SHARED:
        _SHARED.clear()
        _SHARED[blob] = pickle.loads(Path(blob).read_bytes())
    return fn(_SHARED[blob], task)


class RayExecutor:
    """Ray tasks (one CPU each) on the cluster at ``address``; a task whose worker
    died is retried ``max_retries`` times (Ray's default, 3) before the map fails."""

    def __init__(self, address: str, *, max_retries: int = 3) -> None:
        self.address = address
        self.max_retries = max_retries

    def map(
        self,
        fn: Callable[[S, T], R],
        shared: S,
        tasks: Sequence[T],
        *,
        label: str = "partition",
    ) -> list[R]:
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise StorageError(
                    f"cannot connect to the Ray cluster at {self.address!r}: {exc}",
                    executor=self.address,
                ) from exc
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries)(fn)
        ref = ray.put(shared)
        refs = [remote.remote(ref, t) for t in tasks]
        results: list[R] = []
        for i, task_ref in enumerate(refs):
            try:
                results.append(ray.get(task_ref))
            except Exception as exc:
                for other in refs[i + 1 :]:
                    ray.cancel(other, force=True)
                cause = _ray_cause(exc, ray)
                raise task_failed(cause, i, len(refs), self.address, label=label) from exc
        return results


def _ray_cause(exc: Exception, ray: Any) -> BaseException:
    """The task's own exception inside Ray's ``RayTaskError``; a worker that died (after
    Ray's retries of the task) as :class:`WorkerDied`; else ``exc``."""
    died = (ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError)
    if isinstance(exc, died):
        return WorkerDied(str(exc))
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise NotInstalled(
            "the ray executor needs Ray: pip install 'vidlake[ray]'", field="executor"
        ) from exc
    return ray
