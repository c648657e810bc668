"""Background jobs: a runner that keeps persistent records current.

A job is any callable ``fn(progress) -> result`` (a snapshot cut, in practice) run on
a small thread pool. ``progress(stage, fraction)`` records where it is. Every state
change is written to the job store (:mod:`service.job_store`: a SQLite file by
default, the catalog's PostgreSQL database when the catalog lives there, so every
replica sees every job), one short transaction per change, so job records outlive
the process:

* states: ``queued`` → ``running`` → ``succeeded`` | ``failed``;
* a failure records the error in the service's error shape (a
  :class:`~catalog.errors.VidlakeError`'s ``to_dict()``, e.g. the ``conflict`` of a
  cut that lost the race for a version number);
* on start, a :class:`JobRunner` marks **interrupted** every queued or running job
  of this host whose process is gone (or is this process, under a runner that no
  longer exists) as failed with code ``interrupted``: after a crash or a restart, a
  job is never left "running" forever nor forgotten.

Jobs of other hosts sharing the store are left alone: their liveness cannot be told
from here.

**Once per key.** :meth:`JobRunner.submit_once` records a job under a *dedupe key*
(a cut's inputs key) inside one locked transaction: if a job of that kind and key is
queued, running or has succeeded, that job is returned instead of a new one, so
identical requests arriving together share one job, across threads, processes and
replicas. :meth:`JobRunner.submit` may record a key too (a forced new cut), which
such requests then join. A failed job never absorbs later requests.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from catalog.errors import VidlakeError
from service.job_store import (
    JOB_STATES,
    JobRecord,
    JobState,
    JobStore,
    JobStoreBase,
    open_job_store,
)

__all__ = [
    "JOB_STATES",
    "JobRecord",
    "JobRunner",
    "JobState",
    "JobStore",
    "JobStoreBase",
    "Progress",
    "open_job_store",
]

log = logging.getLogger("vidlake.jobs")

Progress = Callable[[str, float], None]
JobFn = Callable[[Progress], Mapping[str, Any] | None]
FinishHook = Callable[[JobRecord], None]

_PROGRESS_EVERY_S = 0.2
# Runners alive in this process: a job of this pid under any other runner id was
# orphaned by a runner that closed without finishing it.
_LIVE_RUNNERS: set[str] = set()
_LIVE_LOCK = threading.Lock()


class JobRunner:
    """Runs job functions on a thread pool and keeps their records current.

    Args:
        store: Where records live.
        workers: Jobs run at once (more wait ``queued``).
        on_finish: Called with the final record of every job (metrics).
    """

    def __init__(
        self, store: JobStoreBase, *, workers: int = 2, on_finish: FinishHook | None = None
    ):
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
