"""``GET /v1/health`` and ``GET /metrics`` (both need no token: load balancers and
Prometheus call them, and they reveal no catalog content)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response

from catalog.errors import VidlakeError
from service.deps import Svc
from service.schemas import HealthPublic

__all__ = ["API_VERSION", "router"]

API_VERSION = "1.0.0"

router = APIRouter(tags=["operations"])
log = logging.getLogger("vidlake.service")


@router.get("/v1/health", response_model=HealthPublic, summary="Liveness and catalog status")
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
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
def metrics(services: Svc) -> Response:
    services.runner  # noqa: B018 - registers the job-state collector on first scrape
    body, content_type = services.metrics.render()
    return Response(content=body, media_type=content_type)
