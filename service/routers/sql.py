"""``POST /v1/sql``: one read-only query over the catalog and the snapshots.

Views: the catalog tables (``assets``, ``asset_events``, ``tombstones``, ``clips``,
``latents``, ``scores``, ``captions``, ``jobs``) at the request's pin, eval material
removed unless the caller has the ``eval`` scope (whatever the pin names, see
:mod:`service.sql.views`); ``manifests`` (every published version's
``manifest.parquet`` rows with a ``version`` column), ``plans`` (every version's
``plan.arrow`` steps with a ``version`` column) and ``snapshots`` (one row per
version). JSON out by default; an Arrow IPC stream when the ``Accept`` header asks
for ``application/vnd.apache.arrow.stream``. ``DESCRIBE <view>`` (or ``DESCRIBE
<select>``) is answered by a checked ``SELECT … LIMIT 0`` (:mod:`service.sql.describe`).

The query runs in a sandbox worker process (:mod:`service.sql.sandbox`) under the
service's time, memory, row and byte limits; the worker encodes the answer, so the
handler only splices bytes. The handler itself never blocks the event loop (the work
runs in a thread), and a client that disconnects cancels its query: the worker is
killed at once.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Header, Request, Response

from catalog.errors import InvalidInput, NotFound
from service.deps import Reader, Services, Svc
from service.routers.ingest import ARROW_STREAM
from service.schemas import ErrorResponse, SqlRequest, SqlResult
from service.sql import QueryResult, Source, View
from service.sql.describe import DESCRIBE_COLUMNS, describe_rewrite, describe_rows

__all__ = ["answer", "router", "run_cancellable"]

router = APIRouter(prefix="/v1", tags=["sql"])

_ERR = {"model": ErrorResponse}
_DISCONNECT_POLL_S = 0.1
T = TypeVar("T")


async def run_cancellable(request: Request, work: Callable[[threading.Event], T]) -> T:
    """Run ``work(cancel)`` in a worker thread; set ``cancel`` when the client
    disconnects before it returns (``work`` is expected to stop soon after)."""
    cancel = threading.Event()

    async def watch() -> None:
        while not cancel.is_set():
            if await request.is_disconnected():
                cancel.set()
                return
            await anyio.sleep(_DISCONNECT_POLL_S)

    outcome: list[T] = []
    failure: list[Exception] = []

    async def call() -> None:
        try:
            outcome.append(await anyio.to_thread.run_sync(functools.partial(work, cancel)))
        except Exception as exc:  # re-raised below, outside the task group's wrapping
            failure.append(exc)
        finally:
            cancel.set()  # also ends the watcher

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        await call()
    if failure:
        raise failure[0]
    return outcome[0]


def _pin(services: Services, body: SqlRequest) -> Any:
    from catalog.pins import Pin

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
        if sid is not None and not catalog.has_snapshot(table, sid):
            raise NotFound(f"{table} has no snapshot {sid}", table=table, snapshot_id=sid)
    return pin


def _sources(services: Services, pin: Any, include_eval: bool) -> dict[str, Source]:
    reader, views = services.reader, services.views
    sources = views.sources(pin, include_eval)

    def manifests() -> View:
        data = reader.version_dataset("manifest.parquet", "parquet", reader.versions())
        if include_eval or "clip_id" not in data.schema.names:
            return View(data)
        # A training cut never holds eval clips; this keeps any other registry honest.
        return View(data, views.clip_filter(pin))

    sources["manifests"] = manifests
    sources["plans"] = lambda: reader.version_dataset("plan.arrow", "ipc", reader.versions())
    sources["snapshots"] = reader.snapshots_table
    return sources


def answer(
    services: Services, body: SqlRequest, sees_eval: bool, arrow: bool, cancel: threading.Event
) -> Response:
    """Run ``body`` in the sandbox: the :class:`SqlResult` JSON, or an Arrow stream."""
    pin = _pin(services, body)
    sources = _sources(services, pin, sees_eval)
    described = describe_rewrite(body.query, sources)
    if described is not None:  # answered by a checked SELECT … LIMIT 0
        result = services.sandbox.run(described, sources, 1, output="json", cancel=cancel)
        return _describe_response(result, dict(pin.to_dict()), arrow)
    result = services.sandbox.run(
        body.query, sources, body.limit, output="arrow" if arrow else "json", cancel=cancel
    )
    if arrow:
        return Response(
            content=result.body,
            media_type=ARROW_STREAM,
            headers={
                "X-Vidlake-Truncated": "true" if result.truncated else "false",
                "X-Vidlake-Row-Count": str(result.row_count),
            },
        )
    return Response(content=_json_body(result, dict(pin.to_dict())), media_type="application/json")


def _describe_response(result: QueryResult, pin: dict[str, int | None], arrow: bool) -> Response:
    """DESCRIBE's answer (one row per column: name, type) from a LIMIT 0 result."""
    rows = describe_rows(result.columns)
    if arrow:
        import pyarrow as pa

        names = [name for name, _ in DESCRIBE_COLUMNS]
        table = pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        headers = {"X-Vidlake-Truncated": "false", "X-Vidlake-Row-Count": str(len(rows))}
        return Response(sink.getvalue().to_pybytes(), media_type=ARROW_STREAM, headers=headers)
    head = {
        "columns": [{"name": n, "type": t} for n, t in DESCRIBE_COLUMNS],
        "rows": rows,
        "row_count": len(rows),
        "truncated": False,
        "elapsed_ms": round(result.elapsed_s * 1000, 3),
        "pin": pin,
    }
    return Response(content=json.dumps(head).encode(), media_type="application/json")


def _json_body(result: QueryResult, pin: dict[str, int | None]) -> bytes:
    """The :class:`SqlResult` document, with the worker's encoded rows spliced in."""
    head = {
        "columns": [{"name": n, "type": t} for n, t in result.columns],
        "row_count": result.row_count,
        "truncated": result.truncated,
        "elapsed_ms": round(result.elapsed_s * 1000, 3),
        "pin": pin,
    }
    return json.dumps(head, separators=(",", ":")).encode()[:-1] + b',"rows":' + result.body + b"}"


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
        503: _ERR,
    },
    summary="Run one read-only SELECT in the SQL sandbox",
)
async def run_sql(
    request: Request,
    body: SqlRequest,
    services: Svc,
    principal: Reader,
    accept: str | None = Header(None),
) -> Any:
    arrow = accept is not None and ARROW_STREAM in accept.lower()
    work = functools.partial(answer, services, body, principal.sees_eval, arrow)
    return await run_cancellable(request, work)
