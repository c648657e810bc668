"""Semantic-dedup centroids: ``POST /v1/dedup/centroids`` (fit a new version) and
``GET /v1/dedup/centroids`` (a family's versions); :mod:`service.dedup`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.dedup import (
    CentroidsCreate,
    CentroidsPublic,
    CentroidsVersions,
    fit_centroids,
    list_centroids,
)
from service.deps import Admin, Reader, Svc
from service.schemas import ErrorResponse

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["dedup"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorResponse} for c in (401, 403, 409, 422)
}


@router.post(
    "/dedup/centroids",
    response_model=CentroidsPublic,
    status_code=201,
    responses=_ERRORS,
    summary="Fit a new centroid version for semantic dedup (an explicit refit)",
)
def post_centroids(body: CentroidsCreate, services: Svc, principal: Admin) -> CentroidsPublic:
    return fit_centroids(services, body)


@router.get(
    "/dedup/centroids",
    response_model=CentroidsVersions,
    responses=_ERRORS,
    summary="The fitted centroid versions of one (embedding model, clustering)",
)
def get_centroids(
    services: Svc,
    principal: Reader,
    embedding_model: Annotated[str, Query(min_length=1, max_length=200)],
    num_clusters: Annotated[int | None, Query(ge=1)] = None,
    cluster_size: Annotated[int | None, Query(ge=1)] = None,
) -> CentroidsVersions:
    body = CentroidsCreate(
        embedding_model=embedding_model, num_clusters=num_clusters, cluster_size=cluster_size
    )
    return list_centroids(services, body)
