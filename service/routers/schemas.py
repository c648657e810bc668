"""``GET /v1/schemas`` and ``/v1/schemas/{table}``: the columns a producer writes
(:mod:`service.table_schemas`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service.deps import Reader
from service.schemas import ErrorResponse
from service.table_schemas import TablePublic, TablesPublic, table_schema, table_schemas

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["schemas"])

_ERR = {"model": ErrorResponse}


@router.get(
    "/schemas",
    response_model=TablesPublic,
    responses={401: _ERR, 403: _ERR},
    summary="Every ingest table: columns, types, required, filled by the catalog, "
    "descriptions, examples",
)
def list_schemas(principal: Reader) -> TablesPublic:
    return table_schemas()


@router.get(
    "/schemas/{table}",
    response_model=TablePublic,
    responses={401: _ERR, 403: _ERR, 404: _ERR},
    summary="One ingest table's columns, an example row, and how to write it",
)
def get_schema(
    principal: Reader,
    table: Annotated[str, Path(max_length=64, description="A table name, e.g. clips")],
) -> TablePublic:
    return table_schema(table)
