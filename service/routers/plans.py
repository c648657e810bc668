"""``POST /v1/recipes:plan``: a dry run of a cut (:func:`materializer.dry_run.plan_cut`).

It reads the catalog (scope ``read``, like ``recipes:validate``), runs the selection
and the step plan in a temporary directory, and answers with the breakdown a recipe
author tunes by; it publishes nothing and starts no job. It runs while the request
waits, as a cut's first stages would.
"""

from __future__ import annotations

import tempfile
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from service.deps import Reader, Svc
from service.routers.snapshots import load_recipe_body
from service.schemas import ErrorResponse, SnapshotCreate

__all__ = ["PlanProblem", "PlanPublic", "plan_recipe", "router"]

router = APIRouter(prefix="/v1", tags=["recipes"])

_ERR = {"model": ErrorResponse}


class PlanProblem(BaseModel):
    """Why a cut of the recipe would fail now."""

    code: str
    message: str
    path: str | None = Field(None, description="Where in the recipe, when known")


class PlanPublic(BaseModel):
    """What a cut would select and plan at the recipe's pin (nothing published)."""

    model_config = ConfigDict(frozen=True)

    name: str
    recipe_sha256: str
    catalog_snapshot_ids: dict[str, int | None] = Field(
        description="The resolved pin the selection read (a cut now would read it too)"
    )
    publishable: bool = Field(description="Whether a cut would publish (no problems)")
    problems: list[PlanProblem]
    candidates: int = Field(description="Candidate samples before any drop")
    drops: dict[str, int] = Field(description="Candidate samples dropped, by reason")
    backfill: dict[str, Any] | None = Field(
        None,
        description="Candidate clips lacking each score / caption version, per stream and "
        "tier (the shape of POST /v1/recipes:coverage without name and pin)",
    )
    counts: dict[str, Any] = Field(
        description="Kept samples, clips, assets; per_stream, per_tier, per_bucket"
    )
    num_steps: int | None = None
    plan_rows: int | None = None
    tokens: int | None = None
    phases: list[dict[str, Any]] = Field(
        [], description="Per phase: steps, plan rows, tokens, target and realized shares"
    )
    stream_shares: dict[str, float] = {}
    bucket_histogram: dict[str, dict[str, int]] = {}
    stream_epochs: dict[str, int] = {}
    coverage: dict[str, float] = Field(
        {}, description="Per stream, the share of its selected samples drawn at least once"
    )
    decontamination: dict[str, Any] | None = None
    repeats_in_step: int | None = Field(
        None, description="Samples that repeat a row in their step (phases that allow it)"
    )
    quality: dict[str, Any] | None = Field(
        None,
        description="The plan quality report's headline numbers: repeated_in_step, "
        "max_share_deviation, max_autocorr_beyond_batch, passed (docs/instruments.md)",
    )


@router.post(
    "/recipes:plan",
    response_model=PlanPublic,
    responses={401: _ERR, 403: _ERR, 413: _ERR, 422: _ERR},
    summary="Dry-run a cut: resolve the pin, select, plan; report drops, counts, steps, "
    "shares and coverage; publish nothing",
)
def plan_recipe(body: SnapshotCreate, services: Svc, principal: Reader) -> PlanPublic:
    from materializer.dry_run import plan_cut

    recipe = load_recipe_body(body.recipe)
    found = plan_cut(services.catalog, recipe, workdir=tempfile.gettempdir())
    return PlanPublic.model_validate({k: v for k, v in found.items() if v is not None})
