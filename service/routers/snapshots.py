"""Recipes and snapshots: validate, cut (a background job), list, read, stream
artifacts, step forensics, patch, pin and diff."""

from __future__ import annotations

import tempfile
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse

from catalog.errors import InvalidInput, InvalidRecipe, InvalidSQL, NotFound
from manifests.inputs import snapshot_inputs_sha256
from manifests.registry import SnapshotRecord
from manifests.tags import tag_published
from service.cuts import submit_cut
from service.deps import Cutter, Reader, Services, Svc
from service.errors import PayloadTooLarge
from service.lineage import step_samples
from service.routers.jobs import job_public
from service.routers.objects import BYTES_RESPONSES, stream_bytes
from service.schemas import (
    DiffPublic,
    ErrorResponse,
    JobPublic,
    PatchCreate,
    PinCreate,
    PinPublic,
    RecipeValidatePublic,
    SnapshotCreate,
    SnapshotPublic,
    SnapshotsPublic,
    StepPublic,
)

__all__ = ["load_recipe_body", "router", "snapshot_public"]

router = APIRouter(prefix="/v1", tags=["snapshots"])

_ERR = {"model": ErrorResponse}
_ARTIFACT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_MAX_PATCH_ROWS = 50_000_000
VersionPath = Annotated[int, Path(ge=1, le=2**62, description="Snapshot version")]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: _ERR for code in (401, 403, *codes)}


def load_recipe_body(recipe: dict[str, Any] | str) -> Any:
    """The recipe of a request body (its text or mapping; never a file name)."""
    from materializer.recipe import load_recipe

    if isinstance(recipe, str) and len(recipe) > 1 << 20:
        raise PayloadTooLarge("a recipe is at most 1 MiB of text", limit=1 << 20)
    if (
        isinstance(recipe, str)
        and "\n" not in recipe
        and recipe.strip().lower().endswith((".yaml", ".yml", ".json"))
    ):
        # load_recipe reads a file named by a one-line string; over HTTP that would
        # let a caller read the server's files, so a file name is refused here.
        raise InvalidInput("send the recipe's text or mapping, not a file name", field="recipe")
    return load_recipe(recipe)


def snapshot_public(record: SnapshotRecord, pinned: bool = False) -> SnapshotPublic:
    """The API summary of a published version."""
    snap = record.snapshot
    recipe = snap.get("recipe")
    return SnapshotPublic(
        version=record.version,
        parent=record.parent,
        patch_of=record.patch_of,
        created_at=record.entry.created_at,
        recipe_sha256=record.entry.recipe_sha256,
        snapshot_sha256=record.entry.snapshot_sha256,
        name=recipe.get("name") if isinstance(recipe, dict) else None,
        num_steps=snap.get("num_steps"),
        plan_rows=snap.get("plan_rows"),
        counts=snap.get("counts") or {},
        stream_shares=snap.get("stream_shares") or {},
        artifacts={name: ref.model_dump() for name, ref in record.artifacts.items()},
        pinned=pinned,
        inputs_sha256=snapshot_inputs_sha256(snap),
        contains_erased_data=record.contains_erased_data,
        erasure_ids=[m.erasure_id for m in record.erasures],
    )


# -- recipes and cuts -----------------------------------------------------------------
@router.post(
    "/recipes:validate",
    response_model=RecipeValidatePublic,
    responses=_errors(413, 422),
    tags=["recipes"],
    summary="Validate a recipe (YAML/JSON text or a mapping) against the catalog, without cutting",
)
def validate_recipe(body: SnapshotCreate, services: Svc, principal: Reader) -> RecipeValidatePublic:
    from materializer.cut import check_plan_fits
    from materializer.validate import check_recipe

    recipe = load_recipe_body(body.recipe)
    # Syntax first, then every value the recipe names against the catalog at its pin,
    # then what a cut checks before it starts.
    check = check_recipe(services.catalog, recipe)
    check_plan_fits(recipe, tempfile.gettempdir())
    return RecipeValidatePublic(
        valid=True,
        name=recipe.name,
        sha256=recipe.sha256(),
        recipe=recipe.model_dump(mode="json"),
        pin=check.pin.to_dict(),
    )


@router.post(
    "/snapshots",
    response_model=JobPublic,
    status_code=202,
    responses={
        200: {
            "model": SnapshotPublic,
            "description": "A published version already has these inputs (recipe, resolved "
            "pin, code version); Location names it",
        },
        202: {
            "description": "A cut job was started, or an identical one joined (Location: the job)"
        },
        **_errors(413, 422),
    },
    summary="Cut a snapshot: a background job (202 + job id), or the version these inputs "
    "already made (200)",
)
def create_snapshot(
    body: SnapshotCreate, services: Svc, principal: Cutter, response: Response
) -> Any:
    recipe = load_recipe_body(body.recipe)
    outcome = submit_cut(
        services,
        recipe,
        new_version=body.new_version,
        owner=principal.name,
        executor=body.executor,
        partitions=body.partitions,
    )
    if outcome.record is not None:
        pinned = any(p.version == outcome.record.version for p in services.registry.pins())
        return JSONResponse(
            snapshot_public(outcome.record, pinned).model_dump(mode="json"),
            status_code=200,
            headers={"Location": f"/v1/snapshots/{outcome.record.version}"},
        )
    assert outcome.job is not None
    response.headers["Location"] = f"/v1/jobs/{outcome.job.id}"
    return job_public(outcome.job)


# -- reading --------------------------------------------------------------------------
@router.get(
    "/snapshots", response_model=SnapshotsPublic, responses=_errors(), summary="Every version"
)
def list_snapshots(
    services: Svc,
    principal: Reader,
    limit: int = Query(100, ge=1, le=10_000),
    offset: int = Query(0, ge=0),
) -> SnapshotsPublic:
    reader = services.reader
    versions = sorted(reader.versions(), reverse=True)
    pinned = {p.version for p in services.registry.pins()}
    page = versions[offset : offset + limit]
    data = [snapshot_public(reader.record(v), v in pinned) for v in page]
    return SnapshotsPublic(data=data, count=len(versions))


@router.get(
    "/snapshots/{version}",
    responses={
        200: {
            "description": "The version's snapshot.json, byte for byte",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **_errors(404, 422),
    },
    response_class=Response,
    summary="A version's snapshot.json (the loader reads this)",
)
def get_snapshot(services: Svc, principal: Reader, version: VersionPath) -> Response:
    reader = services.reader
    record = reader.record(version)
    return Response(
        content=reader.snapshot_bytes(version),
        media_type="application/json",
        headers={"X-Vidlake-SHA256": record.entry.snapshot_sha256},
    )


@router.get(
    "/snapshots/{version}/artifacts/{name}",
    response_class=StreamingResponse,
    responses=BYTES_RESPONSES,
    summary="Stream an artifact (plan.arrow, index.arrow, …) with Range support",
)
def get_artifact(
    services: Svc,
    principal: Reader,
    version: VersionPath,
    name: str = Path(pattern=_ARTIFACT_NAME),
    range_header: str | None = Header(None, alias="Range"),
) -> Response:
    ref = services.reader.record(version).artifacts.get(name)
    if ref is None:
        raise NotFound(f"version {version} has no artifact {name!r}", version=version, name=name)
    services.eval_versions.require(principal, services.pin(), version)
    return stream_bytes(
        services.registry.store,
        ref.sha256,
        ref.size,
        range_header,
        metrics=services.metrics,
        kind="artifact",
        name=name if name in ("plan.arrow", "index.arrow", "manifest.parquet") else "other",
    )


@router.get(
    "/snapshots/{version}/steps/{step}",
    response_model=StepPublic,
    responses=_errors(404, 422),
    summary="The exact samples of a step, with lineage (forensics after a loss spike)",
)
def get_step(
    services: Svc,
    principal: Reader,
    version: VersionPath,
    step: int = Path(ge=0, le=2**62),
) -> StepPublic:
    found = step_samples(
        services.views,
        services.reader,
        version,
        step,
        latest=services.pin,
        sees_eval=principal.sees_eval,
    )
    return StepPublic.model_validate(found)


@router.get(
    "/snapshots/{a}/diff/{b}",
    response_model=DiffPublic,
    responses=_errors(404, 422),
    summary="What changed from version a to version b",
)
def diff_snapshots(
    services: Svc,
    principal: Reader,
    a: VersionPath,
    b: VersionPath,
    max_clips: int = Query(1000, ge=0, le=1_000_000),
) -> DiffPublic:
    services.eval_versions.require(principal, services.pin(), a, b)
    diff = services.registry.diff(a, b, max_clips=max_clips)
    return DiffPublic.model_validate(diff, from_attributes=True)


# -- changing -------------------------------------------------------------------------
def _checked_predicate(where: str, manifest: pa.Schema) -> str:
    """``where`` checked by the recipe predicate rules (an allowlist) against the
    manifest's columns; a refusal is request SQL's 400, not a recipe error."""
    from materializer.predicates import schema_columns, validate_predicate

    try:
        return validate_predicate(where, schema_columns(manifest), "where")
    except InvalidRecipe as exc:
        reason = "column" if "column" in exc.details else "predicate"
        raise InvalidSQL(exc.message, reason=reason, **exc.details) from None


def _rows_matching(services: Services, version: int, where: str) -> list[int]:
    """Manifest rows of ``version`` where ``where`` holds, resolved in the sandbox."""
    path = services.reader.local(version, "manifest.parquet")
    predicate = _checked_predicate(where, pq.read_schema(str(path)))
    # The shared sandbox: the service's deadline, memory cap and worker processes hold
    # for a predicate exactly as for POST /v1/sql.
    result = services.sandbox.run(
        f'SELECT "row" FROM manifest WHERE {predicate}',
        {"manifest": lambda: ds.dataset(str(path), format="parquet")},
        row_cap=_MAX_PATCH_ROWS,
        max_bytes=8 * _MAX_PATCH_ROWS + (1 << 20),
    )
    if result.truncated:
        raise InvalidInput(f"the predicate matches more than {_MAX_PATCH_ROWS} rows", field="where")
    return [int(r) for r in result.table.column(0).to_pylist()]


@router.post(
    "/snapshots/{version}/patch",
    response_model=SnapshotPublic,
    status_code=201,
    responses=_errors(400, 404, 409, 413, 422),
    summary="Publish a patch of a version that skips clips, assets, rows or a predicate",
)
def patch_snapshot(
    body: PatchCreate, services: Svc, principal: Cutter, version: VersionPath
) -> SnapshotPublic:
    from manifests.patch import patch

    services.reader.record(version)  # NotFound before any work
    rows = list(body.exclude_rows)
    if body.where is not None:
        rows.extend(_rows_matching(services, version, body.where))
    record = patch(
        services.registry,
        version,
        exclude_clip_ids=body.exclude_clip_ids or None,
        exclude_asset_ids=body.exclude_asset_ids or None,
        exclude_rows=rows or None,
        reason=body.reason,
        by=body.by if services.auth.open and body.by else principal.name,
    )
    tag_published(services.catalog, services.registry, record.version)
    return snapshot_public(record)


@router.post(
    "/snapshots/{version}/pin",
    response_model=PinPublic,
    responses=_errors(404, 422),
    summary="Pin a version (its objects survive GC, its Iceberg tags never expire)",
)
def pin_snapshot(
    body: PinCreate, services: Svc, principal: Cutter, version: VersionPath
) -> PinPublic:
    registry = services.registry
    already = any(p.version == version for p in registry.pins())
    pin = registry.pin(version, body.reason, by=principal.name)
    tag_published(services.catalog, registry, version)  # its tags now never expire
    return PinPublic(
        version=version, pinned=True, changed=not already, reason=pin.reason, by=pin.by, at=pin.at
    )


@router.delete(
    "/snapshots/{version}/pin",
    response_model=PinPublic,
    responses=_errors(404, 422),
    summary="Unpin a version",
)
def unpin_snapshot(
    services: Svc,
    principal: Cutter,
    version: VersionPath,
    reason: str | None = Query(None, max_length=2000),
) -> PinPublic:
    changed = services.registry.unpin(version, by=principal.name, reason=reason)
    if changed:  # its tags now age from this unpin
        tag_published(services.catalog, services.registry, version)
    return PinPublic(version=version, pinned=False, changed=changed, by=principal.name)
