"""The catalog's tables as a user reads them: ``GET /v1/schemas``, ``vidlake schema``
and ``docs/tables.md``.

One source: the types, required columns, what the catalog fills and the row rules come
from :mod:`catalog.tables` through the JSON Schemas of :mod:`service.row_schemas`
(which the OpenAPI document's typed ingest bodies reference too); the descriptions and
examples from :mod:`catalog.table_docs`. A column is *required* when a producer must
send it; *filled by the catalog* says what the catalog writes where the producer sends
nothing (``derived``, ``default: …``, ``ingest time``).

``python -m service.table_schemas`` prints ``docs/tables.md``
(``tests/service/test_schemas.py`` fails when the committed page drifts).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from catalog.errors import NotFound
from catalog.table_docs import (
    COLUMNS,
    EMBEDDING_COLUMNS,
    EMBEDDING_DESCRIPTION,
    TABLE_DESCRIPTIONS,
    Column,
    example_row,
)
from catalog.tables import PROBE_FIELDS, TABLES, TableDef, arrow_schema
from service.row_schemas import EMBEDDING_ROW, row_schema_name, row_schemas

__all__ = [
    "SCHEMA_TABLES",
    "ColumnPublic",
    "TablePublic",
    "TablesPublic",
    "render_markdown",
    "table_schema",
    "table_schemas",
]

#: Every table a producer writes, in ingest order, and the embeddings.
SCHEMA_TABLES = (*TABLES, "embeddings")

_EMBEDDING_TYPES = {
    "clip_id": "string",
    "vector": "list<float>",
    "model_version": "string",
    "asset_id": "string",
    "split": "string",
}


class ColumnPublic(BaseModel):
    """One column of a table, as a producer writes it."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: str = Field(description="The Arrow type the catalog stores")
    required: bool = Field(description="A producer must send a non-null value")
    filled_by_catalog: str | None = Field(
        None, description="What the catalog writes where the producer sends nothing"
    )
    description: str
    example: Any = None
    json_schema: dict[str, Any] = Field(description="The JSON Schema of a value in a JSON row")


class TablePublic(BaseModel):
    """One table: its columns, an example row, and how to write it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    ingest: str = Field(description="The route a batch of rows is posted to")
    row_schema: str = Field(description="The OpenAPI component of one row")
    key: list[str] = Field(description="Columns that identify a row (re-ingest: duplicate)")
    partitioned_by: list[str]
    columns: list[ColumnPublic]
    example: dict[str, Any] = Field(description="A row the catalog accepts")
    notes: list[str]


class TablesPublic(BaseModel):
    """Every table."""

    data: list[TablePublic]
    count: int


def _type_name(typ: pa.DataType) -> str:
    """A short name of a stored Arrow type (``string``, ``list<int64>``, ``timestamp``)."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "string"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return "binary"
    if pa.types.is_timestamp(typ):
        return "timestamp (UTC)" if typ.tz else "timestamp"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return f"list<{_type_name(typ.value_type)}>"
    return str(typ)


def _filled(tdef: TableDef, name: str) -> str | None:
    if name in tdef.derived:
        return "derived"
    if name in tdef.defaults:
        return f"default: {json.dumps(tdef.defaults[name])}"
    if name == tdef.time_column:
        return "ingest time"
    return None


def _notes(tdef: TableDef) -> list[str]:
    notes = []
    if "probe_width" in {f.name for f in tdef.schema.fields}:
        subs = ", ".join(PROBE_FIELDS)
        notes.append(
            f'A JSON row may nest the probe as "probe": {{{subs}}}; it is stored as '
            "the probe_* columns."
        )
    if tdef.json_columns:
        notes.append(f"JSON text columns (must parse): {', '.join(tdef.json_columns)}.")
    if tdef.time_column:
        notes.append("Timestamps are ISO 8601 strings with a zone in JSON rows (UTC stored).")
    if tdef.name == "clips":
        notes.append(COLUMNS["clips"]["clip_id"].description)
    if tdef.dedup:
        notes.append("Re-ingesting a row with the same key counts as a duplicate, not an error.")
    notes.append("Unknown columns are refused.")
    return notes


def _column(
    name: str, typ: str, doc: Column, schema: dict[str, Any], required: bool, filled: str | None
) -> ColumnPublic:
    return ColumnPublic(
        name=name,
        type=typ,
        required=required,
        filled_by_catalog=filled,
        description=doc.description,
        example=doc.example,
        json_schema=schema,
    )


def _catalog_table(name: str, rows: dict[str, dict[str, Any]]) -> TablePublic:
    tdef = TABLES[name]
    row = rows[row_schema_name(name)]
    required = set(row["required"])
    docs = COLUMNS[name]
    columns = [
        _column(
            f.name,
            _type_name(f.type),
            docs[f.name],
            row["properties"][f.name],
            f.name in required,
            _filled(tdef, f.name),
        )
        for f in arrow_schema(tdef.schema)
    ]
    key = [tdef.schema.find_field(i).name for i in tdef.schema.identifier_field_ids]
    return TablePublic(
        name=name,
        description=TABLE_DESCRIPTIONS[name],
        ingest=f"POST /v1/{name.replace('_', '-')}",
        row_schema=row_schema_name(name),
        key=key,
        partitioned_by=list(tdef.partition_by),
        columns=columns,
        example=example_row(name),
        notes=_notes(tdef),
    )


def _embeddings_table(rows: dict[str, dict[str, Any]]) -> TablePublic:
    row = rows[EMBEDDING_ROW]
    required = set(row["required"])
    columns = [
        _column(n, _EMBEDDING_TYPES[n], doc, row["properties"][n], n in required, None)
        for n, doc in EMBEDDING_COLUMNS.items()
    ]
    return TablePublic(
        name="embeddings",
        description=EMBEDDING_DESCRIPTION,
        ingest="POST /v1/embeddings",
        row_schema=EMBEDDING_ROW,
        key=["clip_id", "model_version"],
        partitioned_by=[],
        columns=columns,
        example=example_row("embeddings"),
        notes=[
            "Every vector of a model version has the same length.",
            "Unknown columns are refused.",
        ],
    )


def table_schema(table: str) -> TablePublic:
    """``table``'s columns, types, required and filled columns, descriptions, example.

    Raises:
        NotFound: ``table`` is not one of :data:`SCHEMA_TABLES`.
    """
    if table not in SCHEMA_TABLES:
        raise NotFound(
            f"no table {table!r}; the tables are {', '.join(SCHEMA_TABLES)}",
            table=table,
            known=list(SCHEMA_TABLES),
        )
    rows = row_schemas()
    return _embeddings_table(rows) if table == "embeddings" else _catalog_table(table, rows)


def table_schemas() -> TablesPublic:
    """Every table of :data:`SCHEMA_TABLES`."""
    data = [table_schema(name) for name in SCHEMA_TABLES]
    return TablesPublic(data=data, count=len(data))


# -- docs/tables.md ---------------------------------------------------------------------
_HEADER = """\
# Tables: what a producer writes

<!-- Generated by `python -m service.table_schemas > docs/tables.md`; do not edit.
     tests/service/test_schemas.py fails when this page drifts from the code. -->

Every table the catalog ingests, column by column. The same facts are served by
`GET /v1/schemas` and `GET /v1/schemas/{table}` (scope `read`) and printed by
`vidlake schema [TABLE]`; the OpenAPI document's ingest bodies reference the same row
schemas (`AssetsRow`, `ClipsRow`, …). *Required*: a producer must send a non-null
value. *Filled*: what the catalog writes where the producer sends nothing (`derived`
columns may be left out even when the table stores them as required).

Post rows as a JSON array or an Arrow IPC stream of these columns (`vidlake ingest
TABLE FILE`, scope `write`); upload latent objects before their rows.
"""


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table_md(t: TablePublic) -> list[str]:
    ingest = f"Ingest: `{t.ingest}` (row schema `{t.row_schema}`)"
    if t.key:
        ingest += f"; key: {', '.join(f'`{k}`' for k in t.key)}"
    if t.partitioned_by:
        ingest += f"; partitioned by {', '.join(f'`{k}`' for k in t.partitioned_by)}"
    lines = [f"## `{t.name}`", "", t.description, "", ingest + "."]
    lines += ["", "| column | type | required | filled | description | example |"]
    lines.append("|---|---|---|---|---|---|")
    for c in t.columns:
        example = "" if c.example is None else f"`{_cell(c.example)}`"
        lines.append(
            f"| `{c.name}` | `{_cell(c.type)}` | {'yes' if c.required else ''} | "
            f"{c.filled_by_catalog or ''} | {_cell(c.description)} | {example} |"
        )
    lines += ["", *[f"- {n}" for n in t.notes], "", "Example row:", "", "```json"]
    lines += [json.dumps(t.example, indent=2), "```", ""]
    return lines


def render_markdown() -> str:
    """The text of ``docs/tables.md``."""
    lines = [_HEADER]
    for t in table_schemas().data:
        lines += _table_md(t)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_markdown())
