"""``GET /v1/drift/{filter}`` (:func:`service.drift.drift_report`) and
``GET /v1/reference-slice`` (:func:`service.drift.reference_slice`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from service.deps import Reader, Svc
from service.drift import MAX_BINS, DriftPublic, ReferenceSlicePublic, drift_report, reference_slice
from service.schemas import ErrorResponse

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["instruments"])

_ERR = {"model": ErrorResponse}


@router.get(
    "/drift/{filter_name}",
    response_model=DriftPublic,
    responses={401: _ERR, 403: _ERR, 404: _ERR, 422: _ERR},
    summary="Two versions of a filter on the frozen reference slice: histograms, "
    "quantiles, KS statistic, coverage, kill rate, kill rate per source per day",
)
def get_drift(
    services: Svc,
    principal: Reader,
    filter_name: Annotated[str, Path(max_length=64, description="The filter (score) name")],
    a: Annotated[str, Query(min_length=1, max_length=200, description="Version A")],
    b: Annotated[str, Query(min_length=1, max_length=200, description="Version B")],
    threshold: Annotated[
        float | None, Query(description="Kill threshold: scores below it are killed")
    ] = None,
    bins: Annotated[int, Query(ge=1, le=MAX_BINS, description="Histogram bins")] = 20,
) -> DriftPublic:
    found = drift_report(services, filter_name, a, b, threshold=threshold, bins=bins)
    return DriftPublic.model_validate(found)


@router.get(
    "/reference-slice",
    response_model=ReferenceSlicePublic,
    responses={401: _ERR, 403: _ERR},
    summary="The frozen reference slice's train assets (and clips): score them with "
    "every filter version, never filter them out",
)
def get_reference_slice(
    services: Svc,
    principal: Reader,
    clips: Annotated[bool, Query(description="List the slice's clip ids too")] = False,
) -> ReferenceSlicePublic:
    return ReferenceSlicePublic.model_validate(reference_slice(services, clips=clips))
