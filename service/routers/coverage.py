"""``POST /v1/recipes:coverage``: how far the backfill of a recipe's score and caption
versions has got (:func:`materializer.coverage.coverage_report`).

It reads the catalog at the recipe's pin (scope ``read``, like ``recipes:plan``) and
answers, per stream and tier, the candidate clips lacking each version, and each
requirement's coverage against the recipe's ``min_coverage``. It refuses nothing: a
coverage below its minimum is ``passed: false`` here, and a cut's 422.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from service.deps import Reader, Svc
from service.routers.snapshots import load_recipe_body
from service.schemas import ErrorResponse, SnapshotCreate

__all__ = ["CoveragePublic", "coverage_recipe", "router"]

router = APIRouter(prefix="/v1", tags=["recipes"])

_ERR = {"model": ErrorResponse}


class CoverageRequirement(BaseModel):
    """One score version, or the caption version, the recipe names."""

    key: str = Field(description="score:<name>@<version> or captions@<version>")
    kind: str = Field(description="score | captions")
    name: str
    version: str
    clips: int = Field(description="Candidate clips")
    missing: int = Field(description="Candidate clips without it")
    coverage: float = Field(description="1 - missing / clips (1.0 without candidates)")
    min_coverage: float | None
    passed: bool
    partial: int | None = Field(None, description="Captions only: some kinds, not all")


class CoverageGroup(BaseModel):
    """One (stream, tier): its candidate clips and how many lack each requirement."""

    stream: str
    tier: str
    clips: int
    missing: dict[str, int] = Field(description="requirement key -> clips without it")


class CoveragePublic(BaseModel):
    """Backfill coverage of a recipe at its pin (nothing refused, nothing published)."""

    model_config = ConfigDict(frozen=True)

    name: str
    recipe_sha256: str
    catalog_snapshot_ids: dict[str, Any] = Field(description="The resolved pin read")
    clips: int = Field(description="Candidate clips (exclusions applied, a latent, a stream)")
    passed: bool = Field(description="Every requirement reaches its min_coverage")
    requirements: list[CoverageRequirement]
    groups: list[CoverageGroup]


@router.post(
    "/recipes:coverage",
    response_model=CoveragePublic,
    responses={401: _ERR, 403: _ERR, 413: _ERR, 422: _ERR},
    summary="Backfill coverage: candidate clips lacking each score and caption version "
    "the recipe names, per stream and tier, against its min_coverage",
)
def coverage_recipe(body: SnapshotCreate, services: Svc, principal: Reader) -> CoveragePublic:
    from materializer.coverage import coverage_report

    recipe = load_recipe_body(body.recipe)
    return CoveragePublic.model_validate(coverage_report(services.catalog, recipe))
