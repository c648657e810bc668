"""The first wall: sqlglot checks a caller's SQL before DuckDB sees it.

:func:`validate_query` accepts at most :data:`MAX_QUERY_CHARS` characters holding
exactly one statement, a ``SELECT`` (``WITH``, ``UNION``… included), whose every table
reference resolves, *in its scope*, either to a CTE of the query that is visible there
or to one of the offered views (unqualified). Resolution uses sqlglot's scope
machinery (:func:`sqlglot.optimizer.scope.traverse_scope`): a CTE defined inside a
subquery does not shadow a name outside it, a non-recursive CTE does not shadow its
own name inside its body, and a FROM alias is never mistaken for a CTE. Table
functions are refused except ``UNNEST``, and so is every function in
:data:`DENIED_FUNCTIONS` or with a prefix in :data:`DENIED_PREFIXES` (files,
settings, environment, dynamic SQL, extensions).

A snapshot patch's ``where`` is not a query: :mod:`materializer.predicates` checks it,
as it checks a recipe's predicates.

The second wall (:mod:`service.sql.connection`, :mod:`service.sql.worker`) holds even
when this one has a bug.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from catalog.errors import InvalidSQL

__all__ = [
    "DENIED_FUNCTIONS",
    "DENIED_PREFIXES",
    "MAX_QUERY_CHARS",
    "check_text",
    "mentioned",
    "validate_query",
]

MAX_QUERY_CHARS = 100_000
DENIED_FUNCTIONS = frozenset(
    {
        "current_setting",
        "getenv",
        "getvariable",
        "setseed",
        "nextval",
        "currval",
        "query",
        "query_table",
        "json_execute_serialized_sql",
        "from_substrait",
        "from_substrait_json",
        "get_substrait",
        "get_substrait_json",
        "which_secret",
        "glob",
        "checkpoint",
        "force_checkpoint",
        "export_database",
        "import_database",
        "load",
        "install",
        "summary",
        "version",
        "platform",
    }
)
DENIED_PREFIXES = (
    "read_",
    "pragma",
    "duckdb_",
    "parquet_",
    "sniff_",
    "glob",
    "iceberg",
    "delta_",
    "sqlite_",
    "postgres_",
    "mysql_",
    "arrow_",
    "python_",
    "enable_",
    "disable_",
    "install_",
    "load_",
    "http",
    "s3",
    "test_",
    "icu_",
    "pg_",
    "ducklake",
    "copy",
    "set_",
)
_STATEMENT_TYPES: tuple[type[exp.Expr], ...] = tuple(
    getattr(exp, name)
    for name in (
        "Command",
        "Set",
        "Pragma",
        "Copy",
        "Attach",
        "Detach",
        "Install",
        "Create",
        "Insert",
        "Update",
        "Delete",
        "Drop",
        "Alter",
        "Merge",
        "Use",
        "Describe",
        "Summarize",
        "Transaction",
        "Commit",
        "Rollback",
        "LoadData",
        "Export",
        "Kill",
    )
    if hasattr(exp, name)
)


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return str(node.sql_name()).lower()


def _check_function(node: exp.Func) -> None:
    name = _function_name(node)
    if name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES):
        raise InvalidSQL(
            f"function {name}() is not allowed in read-only SQL", reason="function", name=name
        )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def check_text(sql: str, what: str = "query") -> None:
    """The checks that need no parse: ``sql`` is a non-blank string of at most
    :data:`MAX_QUERY_CHARS` characters."""
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidSQL(f"the {what} is empty", reason="empty")
    if len(sql) > MAX_QUERY_CHARS:
        raise InvalidSQL(
            f"the {what} is {len(sql)} characters long; the limit is {MAX_QUERY_CHARS}",
            reason="too_long",
            limit=MAX_QUERY_CHARS,
        )


def mentioned(sql: str, names: Iterable[str]) -> set[str]:
    """Which of ``names`` occur in ``sql`` as a whole word, in any case: a cheap
    superset of the views a query can read (:func:`validate_query` decides)."""
    return {n for n in names if re.search(rf"(?<![\w$]){re.escape(n)}(?![\w$])", sql, re.I)}


def _parse(sql: str, what: str) -> list[exp.Expr | None]:
    check_text(sql, what)
    try:
        return list(sqlglot.parse(sql, read="duckdb"))
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidSQL(f"the {what} does not parse: {_first_line(exc)}", reason="parse") from None
    except RecursionError:
        raise InvalidSQL(f"the {what} is nested too deeply", reason="too_deep") from None


def _cte_references(root: exp.Expr) -> set[int]:
    """``id()`` of every table node that names a CTE visible in its scope.

    A node counts only when sqlglot resolves it to a CTE scope *and* that CTE's name
    is the node's own name (``FROM y AS pg_settings, pg_settings`` must not make the
    second ``pg_settings`` a reference to the CTE ``y``).
    """
    try:
        scopes = list(traverse_scope(root))
    except RecursionError:
        raise InvalidSQL("the query is nested too deeply", reason="too_deep") from None
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidSQL(
            f"the query's table references do not resolve: {_first_line(exc)}", reason="scope"
        ) from None
    refs: set[int] = set()
    for scope in scopes:
        for table in scope.tables:
            source = scope.sources.get(table.alias_or_name)
            if not isinstance(source, Scope) or not source.is_cte:
                continue
            cte = _defining_cte(source.expression)
            if cte is not None and str(cte.alias).lower() == str(table.name).lower():
                refs.add(id(table))
    return refs


def _defining_cte(body: exp.Expr) -> exp.CTE | None:
    """The CTE whose body is ``body`` (a recursive CTE's self-reference resolves to
    the anchor branch of the body's UNION, hence the climb through set operations)."""
    node = body
    while isinstance(node.parent, exp.SetOperation):
        node = node.parent
    return node.parent if isinstance(node.parent, exp.CTE) else None


def _check_table(node: exp.Table, allowed: set[str], ctes: set[int]) -> str | None:
    """The view ``node`` reads, None for a CTE or UNNEST; raises for anything else."""
    target = node.this
    if isinstance(target, exp.Unnest):
        return None
    if not isinstance(target, exp.Identifier):
        raise InvalidSQL(
            f"table functions are not allowed ({target.sql('duckdb')[:80]})",
            reason="table_function",
        )
    if node.args.get("db") or node.args.get("catalog"):
        raise InvalidSQL(
            f"qualified table names are not allowed ({node.sql('duckdb')[:80]})", reason="table"
        )
    if id(node) in ctes:
        return None
    name = str(target.name).lower()
    if name not in allowed:
        raise InvalidSQL(
            f"unknown table {target.name!r}; tables: {', '.join(sorted(allowed))}",
            reason="table",
            name=str(target.name),
        )
    return name


def _check_tree(root: exp.Expr, allowed: set[str]) -> set[str]:
    """Walk the whole tree; return the views it reads."""
    for cte in root.find_all(exp.CTE):
        name = str(cte.alias_or_name).lower()
        if name.startswith("__"):
            raise InvalidSQL(f"CTE name {name!r} is reserved", reason="name", name=name)
    ctes = _cte_references(root)
    used: set[str] = set()
    for node in root.walk():
        if isinstance(node, _STATEMENT_TYPES):
            raise InvalidSQL(
                f"{node.key.upper()} is not allowed: only one SELECT statement",
                reason="statement",
            )
        if isinstance(node, exp.Table):
            view = _check_table(node, allowed, ctes)
            if view is not None:
                used.add(view)
        elif isinstance(node, exp.Func):
            _check_function(node)
    return used


def validate_query(sql: str, views: set[str] | frozenset[str]) -> set[str]:
    """Check that ``sql`` is one read-only SELECT over ``views``.

    Returns:
        The views the query reads (lowercase).

    Raises:
        InvalidSQL: what rule the query breaks (``reason`` names it).
    """
    statements = [s for s in _parse(sql, "query") if s is not None]
    if len(statements) != 1:
        raise InvalidSQL(
            f"exactly one statement is allowed, got {len(statements)}", reason="statements"
        )
    root = statements[0]
    if isinstance(root, exp.Describe):
        # Never run: DuckDB's DESCRIBE reads its catalog, which the sandbox walls off.
        # The SQL route answers ``DESCRIBE <view>`` itself (service.sql.describe);
        # what reaches here is another form.
        raise InvalidSQL(
            "DESCRIBE takes one offered view, unqualified and unquoted (DESCRIBE clips), "
            "or a SELECT; a table's columns, types and meaning are also at "
            "GET /v1/schemas/{table} (vidlake schema TABLE)",
            reason="statement",
        )
    if not isinstance(root, exp.Select | exp.SetOperation):
        raise InvalidSQL(
            f"only SELECT (or WITH … SELECT) is allowed, got {root.key.upper()}",
            reason="statement",
        )
    return _check_tree(root, {v.lower() for v in views})
