"""Version tags: ``GET /v1/tags`` and ``POST /v1/tags/backfill`` (:mod:`service.tags`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.deps import Admin, Reader, Svc
from service.schemas import ErrorResponse
from service.tags import TagsBackfillPublic, TagsPublic, backfill_tags, list_tags

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["tags"])

_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorResponse} for c in (401, 403, 409)}


@router.get(
    "/tags",
    response_model=TagsPublic,
    responses=_ERRORS,
    summary="Every table's vidlake-v{N} Iceberg tags (version -> snapshot id)",
)
def get_tags(services: Svc, principal: Reader) -> TagsPublic:
    return list_tags(services)


@router.post(
    "/tags/backfill",
    response_model=TagsBackfillPublic,
    responses=_ERRORS,
    summary="Tag every registered version's snapshots (idempotent; repairs missing tags)",
)
def post_tags_backfill(services: Svc, principal: Admin) -> TagsBackfillPublic:
    return backfill_tags(services)
