"""Ingest: ``POST /v1/{assets,clips,latents,scores,captions,tombstones,asset-events,jobs,
embeddings}``.

A body is a JSON array of row objects (``application/json``, at most
``max_json_body_bytes``) or an Arrow IPC stream (``application/vnd.apache.arrow.stream``,
at most ``max_body_bytes``), read and decoded within bounds by :mod:`service.bodies`
(413 beyond); each table's row schema is published in the OpenAPI document
(:mod:`service.row_schemas`). One request is one catalog commit: a bad row rejects
the batch with a 422 ``invalid_batch`` that names the row and field, and nothing is
written. An ``Idempotency-Key`` header names the batch (default: the SHA-256 of its
canonical bytes); a rerun with a recorded key writes nothing and returns the first
result with ``replayed: true`` (:mod:`catalog.idempotency`).
``POST /v1/jobs`` records *curation* job rows in the catalog's ``jobs`` table; the
service's own background jobs are read with ``GET /v1/jobs``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from numpy.typing import NDArray

from catalog.errors import InvalidBatch
from catalog.table_names import INGEST_ORDER
from catalog.tables import TABLES, arrow_schema
from service.bodies import (
    ARROW_STREAM,
    BodyLimits,
    check_integral,
    check_partition_values,
    decode_batch,
    read_body,
)
from service.deps import Services, Svc, Writer
from service.row_schemas import EMBEDDING_ROW, request_body, row_schema_name
from service.schemas import ErrorResponse, IngestPublic

__all__ = ["ARROW_STREAM", "embed_batch", "ingest_batch", "router"]

#: Columns an embeddings batch materialises (clip_id, vector, model_version, ...).
_EMBEDDING_COLUMNS = 5

router = APIRouter(prefix="/v1", tags=["ingest"])

#: path -> (catalog table, catalog method), for every table (``asset_events`` at
#: ``asset-events``), in ingest order.
_TABLES: dict[str, tuple[str, str]] = {
    name.replace("_", "-"): (name, f"add_{name}") for name in INGEST_ORDER
}
_KEY_DOC = (
    "Names the batch (1-200 printable ASCII characters): a rerun with a recorded key "
    "writes nothing and returns the first result (replayed: true). Default: the "
    "SHA-256 of the batch's canonical bytes."
)
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 403, 413, 415, 422)
}


def _body_doc(description: str, row_schema: str) -> dict[str, Any]:
    return {"requestBody": request_body(description, row_schema)}


def _decode(
    services: Services, media: str, body: bytes, table: str | None
) -> pa.Table | list[dict[str, Any]]:
    """The body within the service's limits; JSON integers checked against ``table``."""
    limits = BodyLimits.from_settings(services.settings)
    tdef = TABLES.get(table) if table is not None else None
    columns = len(tdef.schema.fields) if tdef is not None else _EMBEDDING_COLUMNS
    batch = decode_batch(media, body, limits, columns)
    if tdef is not None:
        if isinstance(batch, list):
            check_integral(batch, arrow_schema(tdef.schema))
        check_partition_values(batch, tdef.partition_by)
    return batch


def _ingest(
    services: Services, path: str, media: str, body: bytes, key: str | None = None
) -> IngestPublic:
    table, _ = _TABLES[path]
    return ingest_batch(services, table, _decode(services, media, body, table), key)


def ingest_batch(
    services: Services, table: str, batch: pa.Table | list[dict[str, Any]], key: str | None
) -> IngestPublic:
    """Ingest a decoded batch into catalog table ``table`` (one commit), with metrics;
    what ``POST /v1/<table>`` answers (the CLI's in-process client calls it too)."""
    method = f"add_{table}"
    received = batch.num_rows if isinstance(batch, pa.Table) else len(batch)
    if received == 0:
        return IngestPublic(table=table, received=0, inserted=0, duplicates=0, eval=0, rejected=0)
    add: Callable[..., Any] = getattr(services.catalog, method)
    try:
        result = add(batch, idempotency_key=key)
    except InvalidBatch:
        services.metrics.observe_ingest(table, rejected=received)
        raise
    finally:
        services.forget_pin()
    if not result.replayed:  # a replay wrote nothing
        services.metrics.observe_ingest(
            table,
            inserted=result.inserted,
            duplicates=result.duplicates,
            eval=result.eval,
            rejected=result.rejected,
        )
    return IngestPublic(
        table=table,
        received=received,
        inserted=result.inserted,
        duplicates=result.duplicates,
        eval=result.eval,
        rejected=result.rejected,
        near_duplicates=getattr(result, "near_duplicates", 0),
        snapshot_id=result.snapshot_id,
        idempotency_key=result.idempotency_key,
        replayed=result.replayed,
    )


def _register(path: str) -> None:
    table = _TABLES[path][0]

    async def ingest(
        request: Request,
        services: Svc,
        principal: Writer,
        idempotency_key: Annotated[str | None, Header(description=_KEY_DOC)] = None,
    ) -> IngestPublic:
        media, body = await read_body(request, BodyLimits.from_settings(services.settings))
        return await run_in_threadpool(_ingest, services, path, media, body, idempotency_key)

    router.add_api_route(
        f"/{path}",
        ingest,
        methods=["POST"],
        response_model=IngestPublic,
        responses=_ERRORS,
        name=f"ingest_{table}",
        operation_id=f"ingest_{table}",
        summary=f"Ingest a batch of {table.replace('_', ' ')}",
        openapi_extra=_body_doc(f"Rows of the catalog's {table} table", row_schema_name(table)),
    )


for _path in _TABLES:
    _register(_path)


# -- embeddings -----------------------------------------------------------------------
def _vectors(column: pa.ChunkedArray | pa.Array, n: int) -> NDArray[np.float32]:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = arr.type
    if not (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ):
        raise InvalidBatch("vector must be a list of numbers", row=0, field="vector")
    lengths = pc.fill_null(pc.list_value_length(arr), -1).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((lengths != lengths[0]) | (lengths <= 0)) if n else np.zeros(0)
    if bad.size:
        raise InvalidBatch(
            "every vector must be a non-empty list of one length", row=int(bad[0]), field="vector"
        )
    try:
        flat = pc.cast(pc.list_flatten(arr), pa.float32()).to_numpy(zero_copy_only=False)
    except (pa.ArrowException, ValueError) as exc:
        raise InvalidBatch(f"vector values must be numbers: {exc}", row=0, field="vector") from None
    return np.asarray(flat, dtype=np.float32).reshape(n, -1) if n else np.zeros((0, 0), np.float32)


def _embedding_columns(
    batch: pa.Table | list[dict[str, Any]], model_version: str | None
) -> tuple[list[str], NDArray[np.float32], list[str]]:
    if isinstance(batch, list):
        known = {"clip_id", "vector", "model_version", "asset_id", "split"}
        for i, row in enumerate(batch):
            unknown = set(row) - known
            if unknown:
                raise InvalidBatch(f"row {i}: unknown fields {sorted(unknown)}", row=i, field=None)
        try:
            table = pa.table(
                {
                    "clip_id": pa.array([r.get("clip_id") for r in batch], pa.string()),
                    "vector": pa.array([r.get("vector") for r in batch], pa.list_(pa.float64())),
                    "model_version": pa.array([r.get("model_version") for r in batch], pa.string()),
                }
            )
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise InvalidBatch(f"bad embedding rows: {exc}", row=None, field=None) from None
    else:
        table = batch
    for name in ("clip_id", "vector"):
        if name not in table.column_names:
            raise InvalidBatch(f"column {name!r} is required", row=0, field=name)
    n = table.num_rows
    clip_ids = table.column("clip_id")
    if not pa.types.is_string(clip_ids.type) and not pa.types.is_large_string(clip_ids.type):
        raise InvalidBatch("clip_id must be a string", row=0, field="clip_id")
    if clip_ids.null_count:
        row = int(pc.index(pc.is_null(clip_ids), True).as_py())
        raise InvalidBatch("clip_id is required", row=row, field="clip_id")
    versions: list[Any] = (
        table.column("model_version").to_pylist()
        if "model_version" in table.column_names
        else [None] * n
    )
    resolved: list[str] = []
    for i, v in enumerate(versions):
        version = v if v is not None else model_version
        if not isinstance(version, str) or not version.strip():
            raise InvalidBatch(
                "model_version is required (per row or as a query parameter)",
                row=i,
                field="model_version",
            )
        resolved.append(version)
    ids: list[str] = clip_ids.to_pylist()
    return ids, _vectors(table.column("vector"), n), resolved


def _ingest_embeddings(
    services: Services, media: str, body: bytes, model_version: str | None
) -> IngestPublic:
    return embed_batch(services, _decode(services, media, body, None), model_version)


def embed_batch(
    services: Services, batch: pa.Table | list[dict[str, Any]], model_version: str | None
) -> IngestPublic:
    """Add a decoded batch of clip embeddings to LanceDB (one table per model version);
    what ``POST /v1/embeddings`` answers (the CLI's in-process client calls it too)."""
    from catalog.embeddings import EmbeddingIndex

    received = batch.num_rows if isinstance(batch, pa.Table) else len(batch)
    if received == 0:
        return IngestPublic(
            table="embeddings", received=0, inserted=0, duplicates=0, eval=0, rejected=0
        )
    try:
        clip_ids, vectors, versions = _embedding_columns(batch, model_version)
        catalog = services.catalog
        known = _clip_splits(services, clip_ids)
        for i, clip_id in enumerate(clip_ids):
            if clip_id not in known:
                raise InvalidBatch(
                    f"row {i}: clip {clip_id!r} is not in the catalog", row=i, field="clip_id"
                )
    except InvalidBatch:
        services.metrics.observe_ingest("embeddings", rejected=received)
        raise
    inserted = duplicates = 0
    for version in sorted(set(versions)):
        at = [i for i, v in enumerate(versions) if v == version]
        ids = [clip_ids[i] for i in at]
        result = EmbeddingIndex(catalog.config.lance, version).add(
            ids, [known[c][0] for c in ids], [known[c][1] for c in ids], vectors[at]
        )
        inserted += result.inserted
        duplicates += result.duplicates
    eval_rows = sum(1 for c in clip_ids if known[c][1] == "eval")
    services.metrics.observe_ingest(
        "embeddings", inserted=inserted, duplicates=duplicates, eval=eval_rows
    )
    return IngestPublic(
        table="embeddings",
        received=received,
        inserted=inserted,
        duplicates=duplicates,
        eval=eval_rows,
        rejected=0,
    )


def _clip_splits(services: Services, clip_ids: list[str]) -> Mapping[str, tuple[str, str]]:
    """clip id -> (asset id, split) for the ids the catalog knows (the split is the
    catalog's, never the producer's: eval stays eval)."""
    data = services.views.dataset("clips", services.pin(), include_eval=True)
    wanted = pa.array(sorted(set(clip_ids)), pa.large_string())
    got = data.to_table(
        columns=["clip_id", "asset_id", "split"], filter=pc.field("clip_id").isin(wanted)
    )
    return {
        c: (a, s)
        for c, a, s in zip(
            got.column("clip_id").to_pylist(),
            got.column("asset_id").to_pylist(),
            got.column("split").to_pylist(),
            strict=True,
        )
    }


@router.post(
    "/embeddings",
    response_model=IngestPublic,
    responses=_ERRORS,
    summary="Ingest clip embeddings (LanceDB, one table per model version)",
    openapi_extra=_body_doc(
        "Rows {clip_id, vector, model_version?}; the clip's asset and split come from the catalog",
        EMBEDDING_ROW,
    ),
)
async def ingest_embeddings(
    request: Request,
    services: Svc,
    principal: Writer,
    model_version: str | None = Query(
        None, min_length=1, max_length=200, description="For rows that name none"
    ),
) -> IngestPublic:
    media, body = await read_body(request, BodyLimits.from_settings(services.settings))
    return await run_in_threadpool(_ingest_embeddings, services, media, body, model_version)
