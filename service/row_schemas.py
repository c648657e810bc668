"""JSON Schemas of ingest rows, generated from the catalog's table definitions.

One schema per table (``AssetsRow``, ``ClipsRow``, …, and ``EmbeddingsRow``), built
from :data:`catalog.tables.TABLES` in their Arrow form (pyiceberg stays inside
``catalog``): the field types (integer widths, numbers, booleans, ``date-time``
strings, lists), which fields are required (non-nullable,
neither derived by the catalog nor filled with a default or the ingest time), their
docs, and the row rules the catalog runs that JSON Schema can say — hex-id patterns
(``_hex``), enums (``_one_of``), bounds (``_cmp``), non-empty strings (``_nonempty``),
name patterns and versions (``_named``, ``_version``) — read from the rules themselves
so that they cannot drift (a rule of another kind only leaves the schema looser than
the server, never stricter). Unknown columns are refused
(``additionalProperties: false``), as the catalog does.

The ingest routes reference these schemas for ``application/json`` bodies and name
them for Arrow IPC bodies (``x-vidlake-columns``), whose columns are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from catalog.tables import PROBE_FIELDS, TABLES, TableDef, arrow_schema

__all__ = ["EMBEDDING_ROW", "request_body", "row_schema_name", "row_schemas"]

EMBEDDING_ROW = "EmbeddingsRow"
_ARROW = "application/vnd.apache.arrow.stream"
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def row_schema_name(table: str) -> str:
    """The component name of ``table``'s row schema (``asset_events`` → ``AssetEventsRow``)."""
    return "".join(part.capitalize() for part in table.split("_")) + "Row"


def _type_schema(typ: pa.DataType) -> dict[str, Any]:
    """The JSON Schema of a column of Arrow type ``typ`` (the catalog's Arrow form of
    its Iceberg schema: :func:`catalog.tables.arrow_schema`)."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return {"type": "string"}
    if pa.types.is_timestamp(typ) and typ.tz is not None:
        return {"type": "string", "format": "date-time"}
    if pa.types.is_int32(typ) or pa.types.is_int64(typ):
        low, high = _INT32 if pa.types.is_int32(typ) else _INT64
        return {"type": "integer", "minimum": low, "maximum": high}
    if pa.types.is_float64(typ):
        return {"type": "number"}
    if pa.types.is_boolean(typ):
        return {"type": "boolean"}
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        # a perceptual-hash sequence: 64-bit frame hashes
        return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return {"type": "array", "items": _type_schema(typ.value_type)}
    return {}


def _closure(check: Callable[..., Any]) -> dict[str, Any]:
    code = getattr(check, "__code__", None)
    cells = getattr(check, "__closure__", None) or ()
    if code is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells, strict=False)}


def _rule(check: Callable[..., Any]) -> dict[str, Any]:
    """What JSON Schema can say of one of :mod:`catalog.tables`' row rules."""
    kind = getattr(check, "__qualname__", "").split(".")[0]
    env = _closure(check)
    if kind == "_hex" and isinstance(env.get("n"), int):
        return {"pattern": f"^[0-9a-f]{{{env['n']}}}$"}
    if kind == "_one_of" and env.get("values"):
        return {"enum": list(env["values"])}
    if kind == "_nonempty":
        return {"minLength": 1, "pattern": r"\S"}
    if kind == "_named" and isinstance(env.get("pattern"), str):  # catalog.names patterns
        return {"pattern": env["pattern"]}
    if kind == "_version":
        return {"minLength": 1, "pattern": r"\S", **_version_length()}
    if kind == "_absent":  # set by the catalog, never by a producer
        return {"type": "null"}
    if kind == "_fingerprint_ok":
        return {"minItems": 1}
    if kind == "_cmp" and isinstance(env.get("value"), int | float):
        strict = getattr(env.get("fn"), "__name__", "") == "greater"
        return {"exclusiveMinimum" if strict else "minimum": env["value"]}
    return {}


def _version_length() -> dict[str, Any]:
    try:
        from catalog import names  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return {}
    longest = getattr(names, "VERSION_MAX_LENGTH", None)
    return {"maxLength": longest} if isinstance(longest, int) else {}


def _required(tdef: TableDef, name: str, nullable: bool) -> bool:
    filled = name in tdef.derived or name in tdef.defaults or name == tdef.time_column
    return not nullable and not filled


def _row_schema(tdef: TableDef) -> dict[str, Any]:
    rules: dict[str, dict[str, Any]] = {}
    for name, check in tdef.checks:
        rules.setdefault(name, {}).update(_rule(check))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for fld in arrow_schema(tdef.schema):
        schema = {**_type_schema(fld.type), **rules.get(fld.name, {})}
        if "exclusiveMinimum" in schema:
            schema.pop("minimum", None)
        if schema.get("type") == "null":
            schema = {"type": "null"}
        doc = (fld.metadata or {}).get(b"doc")
        if doc:
            schema["description"] = doc.decode()
        if _required(tdef, fld.name, fld.nullable):
            required.append(fld.name)
        else:
            schema = _nullable(schema)
        properties[fld.name] = schema
    if "probe_width" in properties:
        probe = {sub: properties[f"probe_{sub}"] for sub in PROBE_FIELDS}
        properties["probe"] = _nullable(
            {
                "type": "object",
                "properties": probe,
                "additionalProperties": False,
                "description": "probe_* fields as one object (stored flattened)",
            }
        )
    return {
        "type": "object",
        "title": row_schema_name(tdef.name),
        "description": f"One row of the catalog's {tdef.name} table",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "enum" in schema:
        schema = {**schema, "enum": [*schema["enum"], None]}
    typ = schema.get("type")
    if isinstance(typ, str) and typ != "null":
        return {**schema, "type": [typ, "null"]}
    return schema


def _embedding_row() -> dict[str, Any]:
    clip = TABLES["clips"]
    clip_rules = {k: v for name, c in clip.checks if name == "clip_id" for k, v in _rule(c).items()}
    return {
        "type": "object",
        "title": EMBEDDING_ROW,
        "description": "One clip embedding; the clip's asset and split come from the catalog",
        "properties": {
            "clip_id": {"type": "string", **clip_rules},
            "vector": {"type": "array", "items": {"type": "number"}, "minItems": 1},
            "model_version": {"type": ["string", "null"], "minLength": 1, "maxLength": 200},
            "asset_id": {"type": ["string", "null"], "description": "ignored"},
            "split": {"type": ["string", "null"], "description": "ignored"},
        },
        "required": ["clip_id", "vector"],
        "additionalProperties": False,
    }


def row_schemas() -> dict[str, dict[str, Any]]:
    """Component name -> JSON Schema of one ingest row, for every ingest table."""
    schemas = {row_schema_name(name): _row_schema(tdef) for name, tdef in TABLES.items()}
    schemas[EMBEDDING_ROW] = _embedding_row()
    return schemas


def request_body(description: str, row_schema: str) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of an ingest route whose rows are ``row_schema``."""
    ref = {"$ref": f"#/components/schemas/{row_schema}"}
    return {
        "required": True,
        "description": description,
        "content": {
            "application/json": {"schema": {"type": "array", "items": ref}},
            _ARROW: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": f"An Arrow IPC stream whose columns are those of {row_schema}",
                },
                "x-vidlake-columns": ref,
            },
        },
    }
