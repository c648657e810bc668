"""``POST /v1/sql``: one read-only query over the catalog and the snapshots.

Views: the catalog tables (``assets``, ``asset_events``, ``tombstones``, ``clips``,
``latents``, ``scores``, ``captions``, ``jobs``) at the request's pin, eval material
removed unless the caller has the ``eval`` scope; ``manifests`` (every published
version's ``manifest.parquet`` rows with a ``version`` column), ``plans`` (every
version's ``plan.arrow`` steps with a ``version`` column) and ``snapshots`` (one row
per version). JSON out by default; an Arrow IPC stream when the ``Accept`` header
asks for ``application/vnd.apache.arrow.stream``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from fastapi import APIRouter, Header, Response

from catalog.errors import InvalidInput, NotFound
from service.deps import Reader, Services, Svc
from service.routers.ingest import ARROW_STREAM
from service.schemas import ErrorResponse, SqlColumn, SqlRequest, SqlResult
from service.sql import Source, to_json_rows

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["sql"])

_ERR = {"model": ErrorResponse}


def _pin(services: Services, body: SqlRequest) -> Any:
    from catalog.catalog import Pin

    catalog = services.catalog
    if body.snapshot is not None:
        ids = services.reader.record(body.snapshot).snapshot.get("catalog_snapshot_ids")
        if not isinstance(ids, dict):
            raise InvalidInput(f"snapshot {body.snapshot} names no catalog pin", field="snapshot")
        pin = Pin.from_dict(ids)
    elif body.pin == "latest":
        return services.pin()
    else:
        pin = Pin.from_dict(body.pin)
    for table, sid in pin.items():
        if sid is not None and catalog.iceberg_table(table).metadata.snapshot_by_id(sid) is None:
            raise NotFound(f"{table} has no snapshot {sid}", table=table, snapshot_id=sid)
    return pin


def _sources(services: Services, pin: Any, include_eval: bool) -> dict[str, Source]:
    reader = services.reader
    sources = services.views.sources(pin, include_eval)
    sources["manifests"] = lambda: reader.version_dataset(
        "manifest.parquet", "parquet", reader.versions()
    )
    sources["plans"] = lambda: reader.version_dataset("plan.arrow", "ipc", reader.versions())
    sources["snapshots"] = reader.snapshots_table
    return sources


@router.post(
    "/sql",
    response_model=SqlResult,
    responses={
        200: {"content": {ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}}},
        400: _ERR,
        401: _ERR,
        403: _ERR,
        404: _ERR,
        413: _ERR,
        422: _ERR,
    },
    summary="Run one read-only SELECT in the SQL sandbox",
)
def run_sql(
    body: SqlRequest,
    services: Svc,
    principal: Reader,
    accept: str | None = Header(None),
) -> Any:
    pin = _pin(services, body)
    result = services.sandbox.run(
        body.query, _sources(services, pin, principal.sees_eval), body.limit
    )
    table = result.table
    if accept is not None and ARROW_STREAM in accept.lower():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return Response(
            content=sink.getvalue().to_pybytes(),
            media_type=ARROW_STREAM,
            headers={
                "X-Vidlake-Truncated": "true" if result.truncated else "false",
                "X-Vidlake-Row-Count": str(table.num_rows),
            },
        )
    return SqlResult(
        columns=[SqlColumn(name=f.name, type=str(f.type)) for f in table.schema],
        rows=to_json_rows(table),
        row_count=table.num_rows,
        truncated=result.truncated,
        elapsed_ms=round(result.elapsed_s * 1000, 3),
        pin=dict(pin.to_dict()),
    )
