"""Lake maintenance over HTTP: ``POST /v1/maintenance`` (compaction, manifest rewrite,
snapshot expiry, orphan removal) and ``POST /v1/gc`` (crash debris), each a background
job (202 + job id; progress and the report at ``GET /v1/jobs/{id}``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from catalog.maintenance import MaintainOptions
from service.deps import Admin, Svc
from service.gc import GcOptions, submit_gc
from service.maintenance import submit_maintenance
from service.routers.jobs import job_public
from service.schemas import ErrorResponse, JobPublic

__all__ = ["GcCreate", "MaintenanceCreate", "router"]

router = APIRouter(prefix="/v1", tags=["maintenance"])

_ERR = {"model": ErrorResponse}
_DAY = 86400.0
_MAX_S = 100 * 365 * _DAY  # a century: bounds every age and retention


class MaintenanceCreate(BaseModel):
    """What a maintain run may do (defaults: see ``docs/operations.md``)."""

    model_config = ConfigDict(extra="forbid")

    retention_s: float = Field(
        7 * _DAY, ge=0, le=_MAX_S, description="Expire snapshots older than this"
    )
    retain_last: int = Field(1, ge=1, le=10_000, description="Newest snapshots always kept")
    orphan_age_s: float = Field(
        _DAY, ge=0, le=_MAX_S, description="Unreferenced files younger stay"
    )
    target_file_bytes: int = Field(
        128 * 2**20, ge=2**16, le=2**34, description="Size compacted files aim at"
    )
    tables: list[str] = Field(default_factory=list, max_length=16, description="Default: all")

    def options(self) -> MaintainOptions:
        return MaintainOptions(
            retention_s=self.retention_s,
            retain_last=self.retain_last,
            orphan_age_s=self.orphan_age_s,
            target_file_bytes=self.target_file_bytes,
            tables=tuple(self.tables),
        )


class GcCreate(BaseModel):
    """What a gc run may delete: nothing unless ``apply``."""

    model_config = ConfigDict(extra="forbid")

    apply: bool = Field(False, description="Delete (default: report only)")
    tmp_age_s: float = Field(_DAY, ge=0, le=_MAX_S, description="Temp files older than this go")
    upload_age_s: float = Field(
        _DAY, ge=0, le=_MAX_S, description="Multipart uploads older are aborted"
    )
    object_age_s: float = Field(
        7 * _DAY, ge=0, le=_MAX_S, description="Unreferenced objects younger stay"
    )

    def options(self) -> GcOptions:
        return GcOptions(
            apply=self.apply,
            tmp_age_s=self.tmp_age_s,
            upload_age_s=self.upload_age_s,
            object_age_s=self.object_age_s,
        )


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: _ERR for code in (401, 403, *codes)}


@router.post(
    "/maintenance",
    response_model=JobPublic,
    status_code=202,
    responses=_errors(422),
    summary="Compact, rewrite manifests, expire snapshots, remove orphans: a job (202)",
)
def create_maintenance(
    body: MaintenanceCreate, services: Svc, principal: Admin, response: Response
) -> JobPublic:
    job = submit_maintenance(services, body.options(), by=principal.name)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_public(job)


@router.post(
    "/gc",
    response_model=JobPublic,
    status_code=202,
    responses=_errors(422),
    summary="Find (and with apply, delete) crash debris and unreferenced objects: a job",
)
def create_gc(body: GcCreate, services: Svc, principal: Admin, response: Response) -> JobPublic:
    job = submit_gc(services, body.options(), by=principal.name)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_public(job)
