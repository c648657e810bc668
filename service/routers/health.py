"""``GET /v1/health`` and ``GET /metrics`` (both need no token: load balancers and
Prometheus call them, and they reveal no catalog content; an open service still
answers loopback clients only)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Response

from catalog.errors import VidlakeError
from service.deps import Svc
from service.schemas import ErrorResponse, HealthPublic
from service.version import VERSION

__all__ = ["API_VERSION", "router"]

#: The package's version (:mod:`service.version`), the one the API reports.
API_VERSION = VERSION

router = APIRouter(tags=["operations"])
log = logging.getLogger("vidlake.service")


#: An open service (no tokens) answers loopback clients only (:mod:`service.loopback`).
_OPEN_MODE_403: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorResponse, "description": "Open mode and a non-loopback client"}
}


@router.get(
    "/v1/health",
    response_model=HealthPublic,
    responses=_OPEN_MODE_403,
    summary="Liveness and catalog status",
)
def health(services: Svc) -> HealthPublic:
    catalog, latest = "ok", None
    try:
        services.catalog.pin()
        latest = services.registry.next_parent()
    except VidlakeError as exc:
        log.warning("health: catalog unavailable: %s", exc)
        catalog = f"unavailable: {exc.code}"
    return HealthPublic(
        status="ok" if catalog == "ok" else "degraded",
        version=API_VERSION,
        catalog=catalog,
        auth="open" if services.auth.open else "tokens",
        latest_snapshot=latest,
        jobs=services.runner.store.counts(),
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **_OPEN_MODE_403},
    summary="Prometheus metrics",
)
def metrics(services: Svc) -> Response:
    services.runner  # noqa: B018 - registers the job-state collector on first scrape
    body, content_type = services.metrics.render()
    return Response(content=body, media_type=content_type)
