"""``vidlake schema [TABLE]``: the columns a producer writes
(:mod:`service.table_schemas`, as ``GET /v1/schemas`` serves them)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, open_client, out

__all__ = ["COMMANDS", "schema"]


def _render_tables(data: dict[str, Any]) -> None:
    table = Table("table", "ingest", "columns", "required", "description")
    for t in data["data"]:
        required = [c["name"] for c in t["columns"] if c["required"]]
        table.add_row(
            t["name"], t["ingest"], str(len(t["columns"])), ", ".join(required), t["description"]
        )
    out.print(table)
    out.print("Columns of one table: vidlake schema TABLE")


def _render_table(t: dict[str, Any]) -> None:
    out.print(f"[bold]{t['name']}[/bold]: {t['description']}")
    out.print(f"ingest: {t['ingest']} (row schema {t['row_schema']})")
    table = Table("column", "type", "required", "filled", "description")
    table.add_column("example", overflow="fold")  # ids whole, never cut with "…"
    for c in t["columns"]:
        example = "" if c["example"] is None else json.dumps(c["example"])
        table.add_row(
            c["name"],
            c["type"],
            "yes" if c["required"] else "",
            c["filled_by_catalog"] or "",
            c["description"],
            example,
        )
    out.print(table)
    for note in t["notes"]:
        out.print(f"- {note}", highlight=False)
    out.print("example row:")
    out.print_json(json.dumps(t["example"]))


def schema(
    table: Annotated[str | None, typer.Argument(help="A table (omit to list every table).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the ingest tables, or one table's columns: type, whether a producer must
    send it, what the catalog fills, a description and an example, then an example row
    (as GET /v1/schemas serves them; docs/tables.md is the same page)."""
    with open_client(url, token) as client:
        data = client.schema(table)
    emit(data, as_json, _render_tables if table is None else _render_table)


COMMANDS = (schema,)
