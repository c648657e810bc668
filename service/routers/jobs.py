"""The service's background jobs: ``GET /v1/jobs`` and ``GET /v1/jobs/{job_id}``.

(``POST /v1/jobs`` is an ingest endpoint: it records curation-pipeline jobs in the
catalog's ``jobs`` table; see :mod:`service.routers.ingest`.)
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from service.deps import Reader, Svc
from service.jobs import JobRecord
from service.schemas import ErrorBody, ErrorResponse, JobPublic, JobsPublic

__all__ = ["job_public", "router"]

router = APIRouter(prefix="/v1", tags=["jobs"])

_ERR = {"model": ErrorResponse}


def job_public(record: JobRecord) -> JobPublic:
    """The API view of a job record."""
    return JobPublic(
        id=record.id,
        kind=record.kind,
        state=record.state,
        stage=record.stage,
        progress=record.progress,
        params=record.params,
        result=record.result,
        error=ErrorBody.model_validate(record.error) if record.error else None,
        owner=record.owner,
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
    )


@router.get(
    "/jobs",
    response_model=JobsPublic,
    responses={401: _ERR, 403: _ERR, 422: _ERR},
    summary="Background jobs (snapshot cuts), newest first",
)
def list_jobs(
    services: Svc,
    principal: Reader,
    state: Literal["queued", "running", "succeeded", "failed"] | None = None,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JobsPublic:
    records = services.runner.store.list(state=state, kind=kind, limit=limit)
    return JobsPublic(data=[job_public(r) for r in records], count=len(records))


@router.get(
    "/jobs/{job_id}",
    response_model=JobPublic,
    responses={401: _ERR, 403: _ERR, 404: _ERR, 422: _ERR},
    summary="One job: state, stage, progress, result or error",
)
def get_job(
    services: Svc,
    principal: Reader,
    job_id: Annotated[str, Path(max_length=64)],
) -> JobPublic:
    return job_public(services.runner.store.get(job_id))
