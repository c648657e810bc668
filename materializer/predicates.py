"""Recipe predicates: pure SQL expressions over the documented clip view.

A recipe's tier rules and streams select clips with a ``where`` string. The selection
step splices that string into a DuckDB query, so it must be impossible to smuggle
anything but a row-level boolean expression through it. :func:`validate_predicate`
parses the text with sqlglot (DuckDB dialect), walks the tree against an *allowlist*
of node types and functions, checks every column against the view, and returns
sqlglot's own rendering of the checked tree. The returned string is therefore built
from allowlisted nodes only, with literals re-escaped by the generator; the input
text never reaches DuckDB.

The clip view (one row per clip at one latent rung, after joins; see
``docs/recipes.md``) has the columns of :data:`CLIP_VIEW_COLUMNS` plus one DOUBLE
column ``score_<name>`` per score the recipe names (``NULL`` when a clip has none).
``tier`` is assigned by the tier rules, so it is usable in stream predicates only.

This is vidlake's only predicate validator. A snapshot patch's ``where`` uses it too,
over the columns of the version's ``manifest.parquet`` (:func:`schema_columns`); the
service answers its refusals as ``invalid_sql``.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp

from catalog.errors import InvalidRecipe

__all__ = [
    "ALLOWED_FUNCTIONS",
    "CLIP_VIEW_COLUMNS",
    "MAX_PREDICATE_CHARS",
    "clip_view_columns",
    "schema_columns",
    "score_column",
    "validate_predicate",
]

#: Columns of the clip view (name -> DuckDB type) before per-recipe score columns.
CLIP_VIEW_COLUMNS: Mapping[str, str] = MappingProxyType(
    {
        "clip_id": "VARCHAR",
        "asset_id": "VARCHAR",
        "t_start_s": "DOUBLE",
        "t_end_s": "DOUBLE",
        "duration_s": "DOUBLE",
        "fps": "DOUBLE",
        "num_frames": "INTEGER",
        "width": "INTEGER",
        "height": "INTEGER",
        "aspect": "DOUBLE",
        "source": "VARCHAR",
        "source_tier": "VARCHAR",
        "license_id": "VARCHAR",
        "territory": "VARCHAR",
        "pii_class": "VARCHAR",
        "codec": "VARCHAR",
        "bitrate": "BIGINT",
        "rung": "VARCHAR",
        "latent_frames": "INTEGER",
        "tokens": "BIGINT",
        "caption_count": "INTEGER",
        "tier": "VARCHAR",
    }
)

MAX_PREDICATE_CHARS = 4096
_MAX_NODES = 2000

# Function nodes a predicate may call, keyed by sqlglot class (exact type, so a
# subclass sqlglot adds later is not let in by accident) -> the name users write.
_FUNCTIONS: Mapping[type[exp.Expr], str] = MappingProxyType(
    {
        exp.Abs: "abs",
        exp.Round: "round",
        exp.Floor: "floor",
        exp.Ceil: "ceil",
        exp.Least: "least",
        exp.Greatest: "greatest",
        exp.Lower: "lower",
        exp.Upper: "upper",
        exp.Length: "length",
        exp.StartsWith: "starts_with",
        exp.EndsWith: "ends_with",
        exp.Contains: "contains",
        exp.RegexpLike: "regexp_matches",
        exp.Coalesce: "coalesce",
        exp.Cast: "cast",
        exp.TryCast: "try_cast",
    }
)

#: What a predicate may call (besides operators and CASE).
ALLOWED_FUNCTIONS: frozenset[str] = frozenset(_FUNCTIONS.values())

# Operators and leaves. ``If`` is CASE's WHEN branch (and DuckDB's ``if(c, a, b)``).
_STRUCTURAL: frozenset[type[exp.Expr]] = frozenset(
    {
        exp.Column,
        exp.Identifier,
        exp.Literal,
        exp.Boolean,
        exp.Null,
        exp.Paren,
        exp.And,
        exp.Or,
        exp.Not,
        exp.EQ,
        exp.NEQ,
        exp.GT,
        exp.GTE,
        exp.LT,
        exp.LTE,
        exp.NullSafeEQ,
        exp.NullSafeNEQ,
        exp.Is,
        exp.In,
        exp.Between,
        exp.Like,
        exp.ILike,
        exp.Escape,
        exp.Add,
        exp.Sub,
        exp.Mul,
        exp.Div,
        exp.IntDiv,
        exp.Mod,
        exp.Neg,
        exp.DPipe,
        exp.Case,
        exp.If,
        exp.DataType,
        exp.DataTypeParam,
    }
)

_CAST_TYPES = frozenset(
    {
        exp.DataType.Type.BOOLEAN,
        exp.DataType.Type.TINYINT,
        exp.DataType.Type.SMALLINT,
        exp.DataType.Type.INT,
        exp.DataType.Type.BIGINT,
        exp.DataType.Type.FLOAT,
        exp.DataType.Type.DOUBLE,
        exp.DataType.Type.DECIMAL,
        exp.DataType.Type.VARCHAR,
        exp.DataType.Type.TEXT,
    }
)

# Nodes that always yield a boolean, so they may stand as a whole predicate.
_BOOLEAN_NODES: tuple[type[exp.Expr], ...] = (
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
    exp.Is,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.Boolean,
    exp.StartsWith,
    exp.EndsWith,
    exp.Contains,
    exp.RegexpLike,
)


def score_column(name: str) -> str:
    """The clip-view column that carries score ``name``."""
    return f"score_{name}"


def clip_view_columns(
    score_names: Iterable[str] = (), *, include_tier: bool = True
) -> dict[str, str]:
    """The clip view's columns for a recipe that names ``score_names``.

    Args:
        score_names: Score names declared by the recipe (filters and ``scores``).
        include_tier: False for tier rules, which run before ``tier`` exists.

    Returns:
        Column name -> DuckDB type, in view order.
    """
    columns = {k: v for k, v in CLIP_VIEW_COLUMNS.items() if include_tier or k != "tier"}
    for name in score_names:
        columns[score_column(name)] = "DOUBLE"
    return columns


def schema_columns(schema: pa.Schema) -> dict[str, str]:
    """The columns of a table (e.g. ``manifest.parquet``) as a predicate may use them:
    name -> DuckDB type, of which only ``BOOLEAN`` changes what is accepted (a boolean
    column may stand as a whole predicate)."""
    return {f.name: _duckdb_type(f.type) for f in schema}


def _duckdb_type(kind: pa.DataType) -> str:
    if pa.types.is_boolean(kind):
        return "BOOLEAN"
    if pa.types.is_integer(kind):
        return "BIGINT"
    if pa.types.is_floating(kind):
        return "DOUBLE"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "VARCHAR"
    return str(kind).upper()


def validate_predicate(sql: str, columns: Mapping[str, str], path: str) -> str:
    """Check that ``sql`` is one pure boolean expression over ``columns``.

    Args:
        sql: The predicate as written in the recipe.
        columns: Column name -> DuckDB type it may use (:func:`clip_view_columns`,
            :func:`schema_columns`).
        path: Where the predicate sits in the recipe (or request), for error messages.

    Returns:
        The normalised DuckDB SQL for the expression (column names canonical,
        literals re-escaped), safe to splice into ``WHERE (...)``.

    Raises:
        InvalidRecipe: With ``path`` set, for anything but one allowlisted expression:
            statements, subqueries, parameters, comments, aggregates, window or
            unknown functions, unknown or qualified columns (``column`` names it),
            non-boolean results, or text that does not parse.
    """
    if not isinstance(sql, str):
        raise _error(path, f"a predicate must be a string, got {type(sql).__name__}")
    if not sql.strip():
        raise _error(path, "empty predicate")
    if len(sql) > MAX_PREDICATE_CHARS:
        raise _error(path, f"predicate longer than {MAX_PREDICATE_CHARS} characters")
    tree = _parse_one(sql, path)
    lowered = {name.lower(): name for name in columns}
    _check_tree(tree, columns, lowered, path)
    offender = _non_boolean(tree, columns)
    if offender is not None:
        raise _error(path, f"a predicate must be a boolean expression, got {_describe(offender)}")
    out = tree.sql(dialect="duckdb")
    # The output is what runs; make sure it reads back as itself, so that a recipe's
    # canonical form (and its SHA-256) is a fixed point of load -> dump -> load.
    again = _parse_one(out, path)
    if again.sql(dialect="duckdb") != out:
        raise _error(path, "predicate has no stable normal form; simplify it")
    _duckdb_reads(out, path)
    return out


def _duckdb_reads(out: str, path: str) -> None:
    """Refuse what sqlglot accepts but DuckDB's own parser does not (e.g. the chained
    comparison ``0 = 0 = 0``): the predicate would otherwise fail later, inside a cut."""
    import duckdb  # here, not at import: recipe loading stays light for the CLI

    try:
        statements = _parser().extract_statements(f"SELECT 1 WHERE ({out})")
    except duckdb.Error as exc:
        raise _error(path, f"does not parse in DuckDB: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise _error(path, "expected one expression; ';' separates statements")


_PARSERS = threading.local()


def _parser() -> Any:
    """This thread's parse-only DuckDB connection (opening one costs ~20 ms: once, not
    once per predicate)."""
    con = getattr(_PARSERS, "con", None)
    if con is None:
        import duckdb

        con = _PARSERS.con = duckdb.connect(config={"enable_external_access": False})
    return con


def _parse_one(sql: str, path: str) -> exp.Expr:
    try:
        statements = sqlglot.parse(sql, read="duckdb")
    except Exception as exc:  # hostile text may trip any of the parser's errors
        raise _error(path, f"does not parse: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise _error(path, "expected one expression; ';' separates statements")
    tree = statements[0]
    if tree is None:
        raise _error(path, "empty predicate")
    return tree


def _check_tree(
    tree: exp.Expr, columns: Mapping[str, str], lowered: Mapping[str, str], path: str
) -> None:
    for count, node in enumerate(tree.walk(), start=1):
        if count > _MAX_NODES:
            raise _error(path, f"predicate has more than {_MAX_NODES} nodes")
        if node.comments:
            raise _error(path, "comments are not allowed in predicates (use YAML comments)")
        kind = type(node)
        if kind is exp.Column:
            _check_column(node, columns, lowered, path)
        elif kind is exp.DataType:
            if node.this not in _CAST_TYPES:
                raise _error(path, f"cast to {node.sql(dialect='duckdb')} is not allowed")
        elif kind not in _STRUCTURAL and kind not in _FUNCTIONS:
            raise _error(path, _why_not(node))


def _listing(columns: Mapping[str, str], most: int = 40) -> str:
    """`` (columns: a, b, …)`` for an error with no close match: what the user may use."""
    names = sorted(columns)
    shown = ", ".join(names[:most]) + (f", … {len(names) - most} more" if len(names) > most else "")
    return f" (columns: {shown})" if names else ""


def _check_column(
    node: exp.Expr, columns: Mapping[str, str], lowered: Mapping[str, str], path: str
) -> None:
    ident = node.this
    if not isinstance(ident, exp.Identifier) or node.args.get("table") is not None:
        raise _error(path, f"only plain column names are allowed, got {node.sql(dialect='duckdb')}")
    name = ident.name
    # DuckDB resolves unquoted names case-insensitively; quoted ones must match.
    canonical = name if name in columns else (None if ident.quoted else lowered.get(name.lower()))
    if canonical is None:
        close = difflib.get_close_matches(name.lower(), list(columns), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else _listing(columns)
        if name.lower() == "tier" and "tier" not in columns:
            hint = " (tier is assigned by the tier rules; use it in stream predicates)"
        raise _error(path, f"unknown column {name!r}{hint}", column=name)
    # Re-emit the canonical, unquoted name: every view column is a plain identifier.
    ident.set("this", canonical)
    ident.set("quoted", False)


def _why_not(node: exp.Expr) -> str:
    if isinstance(node, exp.Query | exp.Subquery | exp.Exists):
        return "subqueries are not allowed"
    if isinstance(node, exp.Window):
        return "window functions are not allowed"
    if isinstance(node, exp.Placeholder | exp.Parameter | exp.SessionParameter):
        return "parameters are not allowed"
    if isinstance(node, exp.AggFunc):
        return f"aggregate function {_func_name(node)} is not allowed"
    if isinstance(node, exp.Func):
        allowed = ", ".join(sorted(ALLOWED_FUNCTIONS))
        return f"function {_func_name(node)} is not allowed (allowed: {allowed})"
    if isinstance(node, exp.Star):
        return "'*' is not allowed"
    return f"{_describe(node)} is not allowed in a predicate"


def _non_boolean(node: exp.Expr, columns: Mapping[str, str]) -> exp.Expr | None:
    """The first part of ``node`` that cannot be a boolean, or None when it is one."""
    if isinstance(node, exp.Paren | exp.Not | exp.Escape):
        return _non_boolean(node.this, columns)
    if isinstance(node, exp.And | exp.Or):
        return _non_boolean(node.left, columns) or _non_boolean(node.right, columns)
    if isinstance(node, (*_BOOLEAN_NODES, exp.Null)):
        return None
    if isinstance(node, exp.Column):
        return None if columns.get(node.name, "").upper() == "BOOLEAN" else node
    if isinstance(node, exp.Cast | exp.TryCast):
        return None if node.to.this == exp.DataType.Type.BOOLEAN else node
    if isinstance(node, exp.Case):
        branches = [b.args.get("true") for b in node.args.get("ifs") or []]
        branches.append(node.args.get("default"))
    elif isinstance(node, exp.If):
        branches = [node.args.get("true"), node.args.get("false")]
    elif isinstance(node, exp.Coalesce):
        branches = [node.this, *node.expressions]
    else:
        return node
    for branch in branches:
        bad = None if branch is None else _non_boolean(branch, columns)
        if bad is not None:
            return bad
    return None


def _describe(node: exp.Expr) -> str:
    if isinstance(node, exp.Func):
        return f"function {_func_name(node)}"
    if isinstance(node, exp.Literal):
        return "a string literal" if node.is_string else "a number literal"
    if isinstance(node, exp.Column):
        return f"column {node.name!r}"
    return type(node).__name__


def _func_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return type(node).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _error(path: str, message: str, **details: object) -> InvalidRecipe:
    errors = [{"path": path, "message": message}]
    return InvalidRecipe(
        f"{path}: {message}" if path else message, path=path, errors=errors, **details
    )
