"""Hard-takedown erasures: ``POST /v1/erasures`` (a background job), ``GET
/v1/erasures``, ``GET /v1/erasures/{id}``, and a version's latest erasure mark
``GET /v1/snapshots/{v}/erasure`` (the loader reads it)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from catalog.erase import get_erasure, list_erasures
from catalog.errors import NotFound
from manifests.registry import canonical_json
from service.deps import Admin, Reader, Svc
from service.erasure import ERASURE_ID_PATTERN, erasure_view, submit_erasure
from service.routers.jobs import job_public
from service.schemas import (
    ErasureCreate,
    ErasurePublic,
    ErasuresPublic,
    ErrorResponse,
    JobPublic,
)

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["erasures"])

_ERR = {"model": ErrorResponse}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: _ERR for code in (401, 403, *codes)}


@router.post(
    "/erasures",
    response_model=JobPublic,
    status_code=202,
    responses=_errors(404, 422),
    summary="Erase a hard-tombstoned asset's bytes everywhere: a background job (202 + job id)",
)
def create_erasure(
    body: ErasureCreate, services: Svc, principal: Admin, response: Response
) -> JobPublic:
    job = submit_erasure(
        services, body.asset_id, tombstone=body.tombstone, reason=body.reason, by=principal.name
    )
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_public(job)


@router.get(
    "/erasures", response_model=ErasuresPublic, responses=_errors(), summary="Every erasure"
)
def list_all(services: Svc, principal: Reader) -> ErasuresPublic:
    data = [ErasurePublic(**erasure_view(r)) for r in list_erasures(services.catalog)]
    return ErasuresPublic(data=data, count=len(data))


@router.get(
    "/erasures/{erasure_id}",
    response_model=ErasurePublic,
    responses=_errors(404, 422),
    summary="One erasure: its request and, once done, its audit record",
)
def get_one(
    services: Svc,
    principal: Reader,
    erasure_id: Annotated[str, Path(pattern=ERASURE_ID_PATTERN)],
) -> ErasurePublic:
    return ErasurePublic(**erasure_view(get_erasure(services.catalog, erasure_id)))


@router.get(
    "/snapshots/{version}/erasure",
    responses={
        200: {
            "description": "The version's latest erasure mark (manifests.erasure)",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **_errors(404, 422),
    },
    response_class=Response,
    tags=["snapshots"],
    summary="A version's latest erasure mark; 404 when no erasure touched it",
)
def get_mark(
    services: Svc,
    principal: Reader,
    version: Annotated[int, Path(ge=1, le=2**62, description="Snapshot version")],
) -> Response:
    record = services.reader.record(version)
    if not record.erasures:
        raise NotFound(f"no erasure touched version {version}", version=version)
    return Response(
        content=canonical_json(record.erasures[-1].model_dump()), media_type="application/json"
    )
