"""Prometheus metrics of one app (its own registry, so that several apps in one
process — tests — do not collide).

==================================== ======================================================
``vidlake_requests_total``           requests by method, route template and status
``vidlake_request_seconds``          request latency by method and route template
``vidlake_ingest_rows_total``        ingested rows by table and outcome (inserted,
                                     duplicates, eval, rejected)
``vidlake_cut_seconds``              wall time of finished cut jobs, by outcome
``vidlake_jobs``                     jobs by state (read from the job store at scrape)
``vidlake_served_bytes_total``       bytes of artifacts and objects streamed to clients
                                     (what loaders pull), by kind and artifact name
``vidlake_storage_op_*``             per storage upload/watch (``kind``, ``name``; read
                                     from the status files at scrape:
                                     :mod:`service.storage_status`): ``running`` (1/0),
                                     ``files_done``, ``files_total``, ``bytes_done``,
                                     ``bytes_total``, ``rate_bytes_per_second``,
                                     ``eta_seconds``, ``backlog_files``,
                                     ``backlog_bytes``, ``failed_files``,
                                     ``seconds_since_update``
==================================== ======================================================
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from service.storage_status import StorageOp

__all__ = ["Metrics", "MetricsMiddleware"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_CUT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600, 7200)


class _JobStates(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("vidlake_jobs", "Background jobs by state", labels=["state"])
        try:
            counts = self._counts()
        except Exception:  # a scrape must not fail because the job store is busy
            counts = {}
        for state, n in sorted(counts.items()):
            family.add_metric([state], n)
        yield family


_STORAGE_GAUGES: tuple[tuple[str, str, Callable[[StorageOp], float | None]], ...] = (
    ("running", "1 while the operation is live", lambda o: float(o.live)),
    ("files_done", "Files uploaded or already receipted", lambda o: o.files_done),
    ("files_total", "Files the operation covers", lambda o: o.files_total),
    ("bytes_done", "Bytes done (an upload: incl. receipted before)", lambda o: o.bytes_done),
    ("bytes_total", "Bytes the upload covers", lambda o: o.bytes_total),
    ("rate_bytes_per_second", "Upload rate", lambda o: o.rate_mb_s * 1e6),
    ("eta_seconds", "Estimated seconds left (live operations)", lambda o: o.eta_s),
    ("backlog_files", "Files a watch has not shipped yet", lambda o: o.backlog_files),
    ("backlog_bytes", "Bytes a watch has not shipped yet", lambda o: o.backlog_bytes),
    ("failed_files", "Files that failed", lambda o: o.failed_count),
    ("seconds_since_update", "Age of the status file", lambda o: o.age_s),
)


class _StorageOps(Collector):
    def __init__(self, read: Callable[[], Sequence[StorageOp]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        try:
            ops = [o for o in self._read() if o.state != "unreadable"]
        except Exception:  # a scrape must not fail because a status directory is odd
            ops = []
        for suffix, doc, value in _STORAGE_GAUGES:
            family = GaugeMetricFamily(
                f"vidlake_storage_op_{suffix}", f"Storage operation: {doc}", labels=["kind", "name"]
            )
            for op in ops:
                v = value(op)
                if v is not None:
                    family.add_metric([op.kind, op.name], float(v))
            yield family


class Metrics:
    """The app's metric instruments and their registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "vidlake_requests",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "vidlake_request_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ingest_rows = Counter(
            "vidlake_ingest_rows",
            "Ingested rows by outcome",
            ["table", "outcome"],
            registry=self.registry,
        )
        self.cut_seconds = Histogram(
            "vidlake_cut_seconds",
            "Wall time of finished snapshot cuts",
            ["outcome"],
            buckets=_CUT_BUCKETS,
            registry=self.registry,
        )
        self.served_bytes = Counter(
            "vidlake_served_bytes",
            "Bytes of artifacts and objects streamed to clients",
            ["kind", "name"],
            registry=self.registry,
        )
        self._job_collector: _JobStates | None = None
        self._storage_collector: _StorageOps | None = None

    def watch_jobs(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Report job counts by state, read from ``counts()`` at every scrape."""
        if self._job_collector is None:
            self._job_collector = _JobStates(counts)
            self.registry.register(self._job_collector)

    def watch_storage(self, read: Callable[[], Sequence[StorageOp]]) -> None:
        """Report storage operations, read from ``read()`` at every scrape."""
        if self._storage_collector is None:
            self._storage_collector = _StorageOps(read)
            self.registry.register(self._storage_collector)

    def observe_ingest(self, table: str, **outcomes: int) -> None:
        for outcome, n in outcomes.items():
            if n:
                self.ingest_rows.labels(table, outcome).inc(n)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Counts requests and times them, labelled by route *template* (so that
    ``/v1/jobs/{job_id}`` is one series, not one per id)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "GET")
            self.metrics.requests.labels(method, template, str(status[0])).inc()
            self.metrics.latency.labels(method, template).observe(time.perf_counter() - start)
