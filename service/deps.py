"""The service's shared state and the dependencies routers declare.

:class:`Services` holds everything a request may need — settings, the catalog, the
snapshot registry and reader, the job runner, the SQL sandbox, metrics, auth — and
creates each on first use, so that importing or building the app opens nothing and
a request that needs no catalog never waits for one.

Routers take what they need through the ``Annotated`` aliases at the bottom
(``Svc``, ``Reader``, ``Writer``, ``Cutter``, …), in the style of FastAPI's
full-stack template.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth import Authenticator, Principal, check_bind, load_tokens
from service.eval_objects import EvalObjects
from service.eval_versions import EvalVersions
from service.jobs import JobRecord, JobRunner, open_job_store
from service.metrics import Metrics
from service.settings import Settings
from service.snapshot_reader import SnapshotReader
from service.sql import CatalogViews, Sandbox
from service.storage_status import read_statuses, status_dir

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin
    from manifests.registry import Registry, SnapshotRecord
    from materializer.recipe import Recipe
    from materializer.select import Execution
    from service.jobs import Progress

__all__ = [
    "PIN_TTL_S",
    "Admin",
    "CutFn",
    "Cutter",
    "Reader",
    "Services",
    "Svc",
    "Writer",
    "get_services",
    "require",
]

#: How long a read may use a cached catalog pin: writes by other processes show up
#: within this time; writes through this service at once.
PIN_TTL_S = 1.0


class CutFn(Protocol):
    """What a cut job runs: cut ``recipe`` at ``pin`` (resolved when the request came)
    and publish it as the next version."""

    def __call__(
        self,
        catalog: VidlakeCatalog,
        registry: Registry,
        recipe: Recipe,
        progress: Progress,
        *,
        pin: Pin | None = None,
    ) -> SnapshotRecord: ...


def _default_cut(
    catalog: VidlakeCatalog,
    registry: Registry,
    recipe: Recipe,
    progress: Progress,
    *,
    pin: Pin | None = None,
    execution: Execution | None = None,
) -> SnapshotRecord:
    """``materializer.cut.cut_snapshot``; ``execution`` is passed only when a cut is
    partitioned (:func:`service.cuts.cut_execution`)."""
    from materializer.cut import cut_snapshot

    return cut_snapshot(catalog, registry, recipe, progress=progress, pin=pin, execution=execution)


class Services:
    """Lazily created collaborators of one app.

    Args:
        settings: The service's settings.
        catalog: Use this catalog instead of opening one from ``settings`` (tests).
        cut: The cut function (default: ``materializer.cut.cut_snapshot``).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        catalog: VidlakeCatalog | None = None,
        cut: CutFn | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.storage_status_dir = status_dir(settings)
        self.metrics.watch_storage(lambda: read_statuses(self.storage_status_dir))
        self.cut: CutFn = cut or _default_cut
        self.sandbox = Sandbox(
            settings.sql_memory_limit,
            settings.sql_timeout_s,
            settings.sql_row_limit,
            workers=settings.sql_workers,
            max_bytes=settings.sql_result_bytes,
        )
        self._lock = threading.RLock()
        self._catalog = catalog
        self._owns_catalog = catalog is None
        self._registry: Registry | None = None
        self._reader: SnapshotReader | None = None
        self._views: CatalogViews | None = None
        self._eval_objects: EvalObjects | None = None
        self._eval_versions: EvalVersions | None = None
        self._runner: JobRunner | None = None
        self._auth: Authenticator | None = None
        self._pin: tuple[float, Pin] | None = None
        self.service_dir = Path(settings.home).absolute() / "service"

    # -- auth ---------------------------------------------------------------------
    @property
    def auth(self) -> Authenticator:
        with self._lock:
            if self._auth is None:
                path = self.settings.tokens_file
                self._auth = Authenticator(load_tokens(path) if path is not None else {})
            return self._auth

    def check_startup(self) -> None:
        """Refuse an open API on a non-loopback bind (:func:`service.auth.check_bind`)."""
        check_bind(self.settings)

    # -- catalog and snapshots ----------------------------------------------------
    @property
    def catalog(self) -> VidlakeCatalog:
        with self._lock:
            if self._catalog is None:
                from catalog.catalog import VidlakeCatalog
                from service.lake import Lake

                config = Lake(self.settings).catalog_config()
                self._catalog = VidlakeCatalog.open(config)
            return self._catalog

    def pin(self) -> Pin:
        """The catalog's current state, cached for :data:`PIN_TTL_S` (reading it loads
        every table's metadata); ingest through this service refreshes it at once."""
        now = time.monotonic()
        with self._lock:
            cached = self._pin
            if cached is not None and now - cached[0] < PIN_TTL_S:
                return cached[1]
        pin = self.catalog.pin()
        with self._lock:
            self._pin = (now, pin)
        return pin

    def forget_pin(self) -> None:
        """Drop the cached pin (after this service changed the catalog)."""
        with self._lock:
            self._pin = None

    @property
    def catalog_opened(self) -> bool:
        return self._catalog is not None

    @property
    def registry(self) -> Registry:
        with self._lock:
            if self._registry is None:
                from manifests.registry import Registry

                self._registry = Registry(self.catalog.objects)
            return self._registry

    @property
    def reader(self) -> SnapshotReader:
        with self._lock:
            if self._reader is None:
                self._reader = SnapshotReader(self.registry, self.service_dir / "artifacts")
            return self._reader

    @property
    def views(self) -> CatalogViews:
        with self._lock:
            if self._views is None:
                self._views = CatalogViews(self.catalog)
            return self._views

    @property
    def eval_objects(self) -> EvalObjects:
        """The eval-only objects index (:mod:`service.eval_objects`)."""
        with self._lock:
            if self._eval_objects is None:
                self._eval_objects = EvalObjects(self.views)
            return self._eval_objects

    @property
    def eval_versions(self) -> EvalVersions:
        """Which snapshot versions hold eval material (:mod:`service.eval_versions`)."""
        with self._lock:
            if self._eval_versions is None:
                self._eval_versions = EvalVersions(self.views, self.reader)
            return self._eval_versions

    # -- jobs -----------------------------------------------------------------------
    @property
    def runner(self) -> JobRunner:
        with self._lock:
            if self._runner is None:
                store = open_job_store(
                    self.settings.resolved()["catalog_uri"],
                    self.settings.namespace,
                    self.service_dir,
                )
                self._runner = JobRunner(store, workers=2, on_finish=self._job_finished)
                self.metrics.watch_jobs(store.counts)
            return self._runner

    def _job_finished(self, record: JobRecord) -> None:
        if record.kind == "cut" and record.duration_s is not None:
            self.metrics.cut_seconds.labels(record.state).observe(record.duration_s)

    def close(self) -> None:
        """Let running jobs finish, stop the SQL workers, then release the catalog."""
        self.sandbox.close()
        with self._lock:
            if self._runner is not None:
                self._runner.close(wait=True)
                self._runner.store.close()
                self._runner = None
            if self._catalog is not None and self._owns_catalog:
                self._catalog.close()
                self._catalog = None


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


_bearer = HTTPBearer(auto_error=False, description="A token from the tokens file")


def require(scope: str, *alternatives: str) -> Callable[..., Principal]:
    """A dependency: the authenticated caller, who must hold ``scope`` (or one of
    ``alternatives``)."""

    def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        services = get_services(request)
        principal = services.auth.authenticate(request.headers.get("authorization"))
        if not any(principal.has(other) for other in alternatives):
            principal.require(scope)
        request.state.principal = principal
        return principal

    dependency.__name__ = "require_" + "_or_".join((scope, *alternatives))
    return dependency


Svc = Annotated[Services, Depends(get_services)]
Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]
Cutter = Annotated[Principal, Depends(require("cut"))]
Admin = Annotated[Principal, Depends(require("admin"))]
