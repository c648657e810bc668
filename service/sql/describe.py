"""``DESCRIBE <view>`` (and ``DESCRIBE <select>``), answered through the first wall.

DuckDB's own ``DESCRIBE`` reads its catalog, which the sandbox walls off; so a
``DESCRIBE`` is never run. :func:`describe_rewrite` turns the statement into
``SELECT * FROM <view or (select)> LIMIT 0``, which then goes through
:func:`service.sql.validate.validate_query` and the sandbox like any other query (eval
filtering, limits, the locked-down worker); :func:`describe_rows` turns that query's
column names and types into DuckDB's ``DESCRIBE`` answer, one row per column
(``column_name``, ``column_type``). Any other form (a qualified or quoted name, an
unknown view, ``DESCRIBE`` options) is left to the validator, which refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlglot
from sqlglot import exp

from service.sql.validate import MAX_QUERY_CHARS

__all__ = ["DESCRIBE_COLUMNS", "describe_rewrite", "describe_rows"]

#: The columns of a DESCRIBE answer, with their types (Arrow names, as every SQL answer has).
DESCRIBE_COLUMNS = (("column_name", "string"), ("column_type", "string"))
_OPTIONS = ("style", "expressions", "partition", "format")


def describe_rewrite(query: str, views: Iterable[str]) -> str | None:
    """The ``SELECT … LIMIT 0`` that answers ``query`` when it is one ``DESCRIBE`` of
    an offered view or of a ``SELECT``; None for any other query."""
    if len(query) > MAX_QUERY_CHARS:
        return None
    try:
        statements = [s for s in sqlglot.parse(query, read="duckdb") if s is not None]
    except (sqlglot.errors.SqlglotError, RecursionError):
        return None
    if len(statements) != 1 or not isinstance(statements[0], exp.Describe):
        return None
    node = statements[0]
    if any(node.args.get(k) for k in _OPTIONS) or node.args.get("as_json"):
        return None
    if node.args.get("kind") not in (None, "TABLE"):
        return None
    target = node.this
    if isinstance(target, exp.Table):
        return _of_view(target, {v.lower() for v in views})
    if isinstance(target, exp.Select | exp.SetOperation):
        inner = exp.Subquery(this=target.copy(), alias=exp.TableAlias(this=exp.to_identifier("_d")))
        return exp.select("*").from_(inner).limit(0).sql(dialect="duckdb")
    return None


def _of_view(table: exp.Table, views: set[str]) -> str | None:
    ident = table.this
    plain = isinstance(ident, exp.Identifier) and not ident.quoted
    if not plain or table.args.get("db") or table.args.get("catalog") or table.alias:
        return None
    name = table.name.lower()
    return f"SELECT * FROM {name} LIMIT 0" if name in views else None


def describe_rows(columns: Iterable[tuple[str, str]]) -> list[list[str]]:
    """DESCRIBE's rows for a result's ``(name, type)`` columns."""
    return [[name, typ] for name, typ in columns]
