"""``GET /v1/snapshots/{version}/quality``: a version's plan quality report."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from service.deps import Reader, Svc
from service.quality import quality_of
from service.schemas import ErrorResponse

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["snapshots"])

_ERR = {"model": ErrorResponse}
VersionPath = Annotated[int, Path(ge=1, le=2**62, description="Snapshot version")]


@router.get(
    "/snapshots/{version}/quality",
    responses={
        200: {
            "description": "The version's quality.json (docs/instruments.md, Plan quality)",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **{code: _ERR for code in (401, 403, 404, 422)},
    },
    summary="A version's plan quality report: shares vs targets, repeats, autocorrelation",
)
def get_quality(services: Svc, principal: Reader, version: VersionPath) -> dict[str, Any]:
    """404 for an unknown version and for one without a report (cut before reports
    existed, or a patch: ``details.reason`` is ``no_quality_report``)."""
    services.reader.record(version)  # NotFound for an unknown version, first
    services.eval_versions.require(principal, services.pin(), version)
    return quality_of(services.reader, version)
