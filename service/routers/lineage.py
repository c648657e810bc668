"""``GET /v1/lineage/clips/{clip_id}``: where a clip came from and every snapshot
version and step that trained on it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service.deps import Reader, Svc
from service.lineage import clip_lineage
from service.schemas import ClipLineage, ErrorResponse

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["lineage"])

_ERR = {"model": ErrorResponse}


@router.get(
    "/lineage/clips/{clip_id}",
    response_model=ClipLineage,
    responses={401: _ERR, 403: _ERR, 404: _ERR, 422: _ERR},
    summary="A clip's asset, provenance, license, tombstones, scores, captions, "
    "latents, and every snapshot version and step that served it",
)
def get_clip_lineage(
    services: Svc,
    principal: Reader,
    clip_id: Annotated[str, Path(max_length=64, description="32 lowercase hex")],
) -> ClipLineage:
    found = clip_lineage(
        services.views,
        services.reader,
        clip_id,
        pin=services.pin(),
        sees_eval=principal.sees_eval,
    )
    return ClipLineage.model_validate(found)
