"""The vidlake REST service: ``create_app(settings)`` and the ASGI app ``app``.

``uvicorn service.app:app`` serves the app built from :func:`get_settings`; the
module attribute ``app`` is built on first access, so that importing this module
reads no settings and opens nothing. The catalog, registry and job store are
opened on first use (:class:`service.deps.Services`); the lifespan removes temp
files of dead processes (:func:`service.gc.startup_clean`), checks that an open
(token-less) API is bound to loopback (the ``host`` setting and the sockets the
process listens on, :mod:`service.loopback`), and on shutdown lets running jobs
finish. In open mode every request from a non-loopback client is a 403, however the
app was started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from catalog.errors import VidlakeError
from service.deps import CutFn, Services
from service.errors import PayloadTooLarge, install_error_handlers
from service.gc import startup_clean
from service.loopback import OpenModeGuard, check_listening, watch_listening
from service.metrics import MetricsMiddleware
from service.routers import (
    coverage,
    dashboard,
    dedup,
    drift,
    erasures,
    health,
    ingest,
    jobs,
    lineage,
    maintenance,
    objects,
    plans,
    quality,
    schemas,
    snapshots,
    sql,
    tags,
)
from service.routers.health import API_VERSION
from service.row_schemas import row_schemas
from service.settings import Settings, get_settings

__all__ = ["BodyLimitMiddleware", "create_app"]

log = logging.getLogger("vidlake.service")

_DESCRIPTION = """\
vidlake's data plane API: ingest curation results into the catalog, cut and read
snapshots, stream artifacts and objects to loaders, run read-only SQL, and trace
lineage. Every error has the shape `{"error": {"code", "message", "details"}}`.
"""


def _object_upload(scope: Scope) -> bool:
    return scope.get("method") == "PUT" and str(scope.get("path", "")).startswith("/v1/objects/")


class BodyLimitMiddleware:
    """413 for request bodies over ``limit`` bytes, declared or streamed.

    A declared ``Content-Length`` over the limit is refused before the body is read.
    A streamed body that grows past it makes ``receive`` raise
    :class:`~service.errors.PayloadTooLarge`; whatever response the app then starts
    (FastAPI turns body-read failures into a 400) is replaced by the 413.

    Object uploads (``PUT /v1/objects/…``) are exempt: they stream to disk under
    their own ``max_object_bytes`` (:mod:`service.object_upload`).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _response(self) -> JSONResponse:
        exc = PayloadTooLarge(
            f"the request body is larger than {self.limit} bytes", limit=self.limit
        )
        # Close the connection: otherwise the server drains a declared body it refused.
        return JSONResponse(
            {"error": exc.to_dict()}, status_code=413, headers={"Connection": "close"}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _object_upload(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._response()(scope, receive, send)
            return
        state = {"total": 0, "exceeded": False, "replaced": False}

        async def limited_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["total"] += len(message.get("body", b""))
                if state["total"] > self.limit:
                    state["exceeded"] = True
                    raise PayloadTooLarge(
                        f"the request body is larger than {self.limit} bytes", limit=self.limit
                    )
            return message

        async def guarded_send(message: Message) -> None:
            if state["replaced"]:
                return
            starting = message["type"] == "http.response.start"
            if starting and state["exceeded"] and message["status"] != 413:
                state["replaced"] = True
                await self._response()(scope, receive, send)
                return
            await send(message)

        await self.app(scope, limited_receive, guarded_send)


def create_app(
    settings: Settings,
    *,
    catalog: Any = None,
    cut: CutFn | None = None,
) -> FastAPI:
    """Build the ASGI app.

    Args:
        settings: Where the catalog lives, auth, limits.
        catalog: An open ``VidlakeCatalog`` to serve instead of opening one (tests).
        cut: The cut function jobs run (default ``materializer.cut.cut_snapshot``).
    """
    services = Services(settings, catalog=catalog, cut=cut)

    def is_open() -> bool:
        return services.auth.open

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services.check_startup()
        await asyncio.to_thread(startup_clean, services)
        check_listening(is_open())
        watcher = asyncio.create_task(watch_listening(is_open))
        try:
            yield
        finally:
            watcher.cancel()
            services.close()

    app = FastAPI(
        title="vidlake",
        version=API_VERSION,
        description=_DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/openapi.json",
    )
    app.state.services = services
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    install_error_handlers(app)
    for module in (
        ingest,
        snapshots,
        quality,
        plans,
        coverage,
        schemas,
        erasures,
        maintenance,
        jobs,
        sql,
        lineage,
        objects,
        tags,
        dedup,
        drift,
        health,
        dashboard,
    ):
        app.include_router(module.router)
    static = resources.files("service").joinpath("static")
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    # Outermost last: metrics see every request, open mode refuses other machines
    # before anything else, the body limit applies before routing.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(OpenModeGuard, is_open=is_open)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the per-table ingest row schemas it references."""
    if app.openapi_schema is None:
        doc = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        doc.setdefault("components", {}).setdefault("schemas", {}).update(row_schemas())
        doc["components"]["schemas"] = dict(sorted(doc["components"]["schemas"].items()))
        app.openapi_schema = doc
    return app.openapi_schema


def __getattr__(name: str) -> Any:
    # `uvicorn service.app:app` looks the attribute up; build it then, not at import.
    if name == "app":
        try:
            built = create_app(get_settings())
        except VidlakeError:
            log.exception("cannot build the app")
            raise
        globals()["app"] = built
        return built
    raise AttributeError(f"module 'service.app' has no attribute {name!r}")
