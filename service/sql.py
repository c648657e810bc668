"""Read-only SQL over the catalog and the published snapshots.

Two walls stand between a query and anything it should not touch:

1. **sqlglot**, before DuckDB sees the text (:func:`validate_query`): at most
   :data:`MAX_QUERY_CHARS` characters; exactly one statement, a ``SELECT`` (``WITH``,
   ``UNION``… included); every table reference is one of the offered views or a CTE of
   the query, unqualified; no table functions (``read_csv``, ``glob``, ``query``…)
   except ``UNNEST``; no function from :data:`_DENIED_FUNCTIONS` or with a prefix from
   :data:`_DENIED_PREFIXES` (files, settings, environment, dynamic SQL, extensions).
2. **DuckDB locked down** (:func:`sandbox_connection`): an in-memory database per
   query with ``enable_external_access=false`` (no files, no network, no extension
   install or load, no ``ATTACH``/``COPY``), ``python_enable_replacements=false`` (no
   scans of Python variables by name), no extension autoloading, no spilling
   (``temp_directory=''``), a memory limit, then ``lock_configuration=true`` so that no
   ``SET`` can undo any of it. A timer thread interrupts a query that runs past the
   time limit; at most ``limit`` rows come back, with a ``truncated`` flag.

The views are registered as Arrow datasets over the data files of each table at the
pinned Iceberg snapshot (DuckDB pushes projections and filters into them), already
filtered of eval material unless the caller has the ``eval`` scope: the unfiltered
data is never registered under any name.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import sqlglot
from numpy.typing import NDArray
from sqlglot import exp

from catalog.errors import InvalidSQL, NotFound

__all__ = [
    "CATALOG_VIEWS",
    "MAX_QUERY_CHARS",
    "CatalogViews",
    "QueryResult",
    "Sandbox",
    "sandbox_connection",
    "to_json_rows",
    "validate_predicate",
    "validate_query",
]

MAX_QUERY_CHARS = 100_000
CATALOG_VIEWS = (
    "assets",
    "asset_events",
    "tombstones",
    "clips",
    "latents",
    "scores",
    "captions",
    "jobs",
)
_DENIED_FUNCTIONS = frozenset(
    {
        "current_setting",
        "getenv",
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
    }
)
_DENIED_PREFIXES = (
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


# -- validation -----------------------------------------------------------------------
def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return str(node.sql_name()).lower()


def _check_function(node: exp.Func) -> None:
    name = _function_name(node)
    if name in _DENIED_FUNCTIONS or name.startswith(_DENIED_PREFIXES):
        raise InvalidSQL(
            f"function {name}() is not allowed in read-only SQL", reason="function", name=name
        )


def _parse(sql: str, what: str) -> list[exp.Expr | None]:
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidSQL(f"the {what} is empty", reason="empty")
    if len(sql) > MAX_QUERY_CHARS:
        raise InvalidSQL(
            f"the {what} is {len(sql)} characters long; the limit is {MAX_QUERY_CHARS}",
            reason="too_long",
            limit=MAX_QUERY_CHARS,
        )
    try:
        return list(sqlglot.parse(sql, read="duckdb"))
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidSQL(f"the {what} does not parse: {_first_line(exc)}", reason="parse") from None
    except RecursionError:
        raise InvalidSQL(f"the {what} is nested too deeply", reason="too_deep") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _check_tree(root: exp.Expr, allowed: set[str]) -> set[str]:
    """Walk the whole tree; return the views it reads."""
    ctes = {str(cte.alias_or_name).lower() for cte in root.find_all(exp.CTE)}
    for name in ctes:
        if name.startswith("__"):
            raise InvalidSQL(f"CTE name {name!r} is reserved", reason="name", name=name)
    used: set[str] = set()
    for node in root.walk():
        if isinstance(node, _STATEMENT_TYPES):
            raise InvalidSQL(
                f"{node.key.upper()} is not allowed: only one SELECT statement",
                reason="statement",
            )
        if isinstance(node, exp.Table):
            target = node.this
            if isinstance(target, exp.Unnest):
                continue
            if not isinstance(target, exp.Identifier):
                raise InvalidSQL(
                    f"table functions are not allowed ({target.sql('duckdb')[:80]})",
                    reason="table_function",
                )
            if node.args.get("db") or node.args.get("catalog"):
                raise InvalidSQL(
                    f"qualified table names are not allowed ({node.sql('duckdb')[:80]})",
                    reason="table",
                )
            name = str(target.name).lower()
            if name in ctes:
                continue
            if name not in allowed:
                raise InvalidSQL(
                    f"unknown table {target.name!r}; tables: {', '.join(sorted(allowed))}",
                    reason="table",
                    name=str(target.name),
                )
            used.add(name)
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
    if not isinstance(root, exp.Select | exp.SetOperation):
        raise InvalidSQL(
            f"only SELECT (or WITH … SELECT) is allowed, got {root.key.upper()}",
            reason="statement",
        )
    return _check_tree(root, {v.lower() for v in views})


def _known(column: exp.Column, columns: set[str]) -> bool:
    return not column.table and str(column.name).lower() in columns


def validate_predicate(sql: str, columns: set[str] | None = None) -> str:
    """Check a boolean SQL expression (no subqueries, no tables, allowed functions
    only, known columns when ``columns`` is given); return it normalised."""
    if not isinstance(sql, str) or not sql.strip() or len(sql) > MAX_QUERY_CHARS:
        raise InvalidSQL("the predicate is empty or too long", reason="predicate")
    try:
        node = sqlglot.parse_one(sql, read="duckdb", into=exp.Condition)
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidSQL(
            f"the predicate does not parse: {_first_line(exc)}", reason="parse"
        ) from None
    except RecursionError:
        raise InvalidSQL("the predicate is nested too deeply", reason="too_deep") from None
    for sub in node.walk():
        if isinstance(sub, (exp.Query, exp.Table, exp.Subquery, *_STATEMENT_TYPES)):
            raise InvalidSQL("a predicate may not hold queries or tables", reason="predicate")
        if isinstance(sub, exp.Func):
            _check_function(sub)
        if columns is not None and isinstance(sub, exp.Column) and not _known(sub, columns):
            raise InvalidSQL(
                f"unknown column {sub.sql('duckdb')!r}; columns: {', '.join(sorted(columns))}",
                reason="column",
            )
    return str(node.sql("duckdb"))


# -- execution ------------------------------------------------------------------------
def sandbox_connection(memory_limit: str, threads: int = 2) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB that can read only what is registered into it."""
    return duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "python_enable_replacements": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "allow_unsigned_extensions": False,
            "allow_persistent_secrets": False,
            "temp_directory": "",
            "memory_limit": memory_limit,
            "threads": threads,
            # Last, so that nothing above can be changed by a query afterwards.
            "lock_configuration": True,
        },
    )


Source = Callable[[], ds.Dataset | pa.Table]


@dataclass(frozen=True)
class QueryResult:
    """Rows of a query (at most the limit) and whether more matched."""

    table: pa.Table
    truncated: bool
    elapsed_s: float


class Sandbox:
    """Runs validated queries in locked-down DuckDB.

    Args:
        memory_limit: DuckDB ``memory_limit`` (e.g. ``1GB``).
        timeout_s: Wall-clock limit; the query is interrupted past it.
        row_limit: Most rows a query returns.
        threads: DuckDB worker threads per query.
    """

    def __init__(
        self, memory_limit: str, timeout_s: float, row_limit: int, threads: int = 2
    ) -> None:
        self.memory_limit = memory_limit
        self.timeout_s = timeout_s
        self.row_limit = row_limit
        self.threads = threads

    def run(self, sql: str, sources: Mapping[str, Source], limit: int | None = None) -> QueryResult:
        """Validate and run ``sql`` over ``sources`` (view name -> dataset factory;
        only the views the query reads are built).

        Raises:
            InvalidSQL: the query breaks a rule, fails in DuckDB, runs out of time or
                memory (``reason``: ``timeout``, ``memory``, ``execution``).
        """
        used = validate_query(sql, frozenset(sources))
        cap = self.row_limit if limit is None else max(1, min(limit, self.row_limit))
        start = time.perf_counter()
        con = sandbox_connection(self.memory_limit, self.threads)
        timer = threading.Timer(self.timeout_s, con.interrupt)
        timed_out = threading.Event()
        try:
            for name in sorted(used):
                con.register(name, sources[name]())
            timer.start()
            try:
                reader = con.sql(sql).to_arrow_reader(min(cap + 1, 100_000))
                batches, rows = [], 0
                for batch in reader:
                    batches.append(batch)
                    rows += batch.num_rows
                    if rows > cap:
                        break
            except duckdb.InterruptException:
                timed_out.set()
                raise InvalidSQL(
                    f"the query ran longer than {self.timeout_s:g} s and was stopped",
                    reason="timeout",
                    limit_s=self.timeout_s,
                ) from None
            except duckdb.OutOfMemoryException as exc:
                raise InvalidSQL(
                    f"the query needs more than {self.memory_limit} of memory: {_first_line(exc)}",
                    reason="memory",
                    limit=self.memory_limit,
                ) from None
            except duckdb.Error as exc:
                raise InvalidSQL(
                    f"the query failed: {_first_line(exc)}", reason="execution"
                ) from None
        finally:
            timer.cancel()
            con.close()
        table = pa.Table.from_batches(batches, schema=reader.schema)
        truncated = table.num_rows > cap
        return QueryResult(table.slice(0, cap), truncated, time.perf_counter() - start)


# -- JSON output ----------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def to_json_rows(table: pa.Table) -> list[list[Any]]:
    """Rows of ``table`` as JSON-ready lists (times ISO 8601, bytes hex, NaN null)."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [[_jsonable(col[r]) for col in columns] for r in range(table.num_rows)]


# -- catalog views --------------------------------------------------------------------
class _KeyIndex:
    """The sorted values of one key column of one (immutable) data file, and the row
    groups that hold them: a point lookup reads one row group, not the file."""

    def __init__(self, fragment: ds.ParquetFileFragment, column: str) -> None:
        values = fragment.to_table(columns=[column]).column(column).combine_chunks()
        keys = _fixed_width_bytes(values)
        self.order = np.argsort(keys, kind="stable").astype(np.int64)
        self.keys = keys[self.order]
        meta = fragment.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.order.nbytes)

    def rows(self, wanted: NDArray[Any]) -> NDArray[np.int64]:
        """File row numbers whose key is in ``wanted`` (sorted fixed-width bytes)."""
        lo = np.searchsorted(self.keys, wanted, side="left")
        hi = np.searchsorted(self.keys, wanted, side="right")
        hits = [self.order[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]
        return np.sort(np.concatenate(hits)) if hits else np.zeros(0, np.int64)


def _fixed_width_bytes(values: pa.Array) -> NDArray[Any]:
    """A string column as a numpy ``S<n>`` array (zero-copy when every value has one
    length, as hex ids do)."""
    if len(values) == 0:
        return np.zeros(0, dtype="S1")
    if values.null_count == 0 and (
        pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    ):
        offset_type = np.int64 if pa.types.is_large_string(values.type) else np.int32
        offsets = np.frombuffer(values.buffers()[1], dtype=offset_type)
        offsets = offsets[values.offset : values.offset + len(values) + 1]
        widths = np.diff(offsets)
        if widths.size and widths.min() == widths.max() and widths[0] > 0:
            raw = np.frombuffer(values.buffers()[2], dtype=np.uint8)
            raw = raw[int(offsets[0]) : int(offsets[-1])]
            return raw.view(f"S{int(widths[0])}").copy()
    return np.array([v or "" for v in values.to_pylist()], dtype="S")


_CLIP_KEYED = ("latents", "scores", "captions")
_ASSET_KEYED = ("tombstones", "asset_events")
_CACHE_ENTRIES = 128
_INDEX_BYTES = 512 * 1024 * 1024  # key indexes kept in memory, LRU beyond


class CatalogViews:
    """Arrow datasets of catalog tables at a pin, eval material filtered out unless
    asked for. Datasets of a (table, snapshot id) are cached: an Iceberg snapshot
    never changes."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, int | None, bool], ds.Dataset] = OrderedDict()
        self._eval: dict[tuple[str, int | None], pa.Array] = {}
        self._indexes: OrderedDict[tuple[str, str], _KeyIndex] = OrderedDict()
        self._index_bytes = 0

    def sources(self, pin: Mapping[str, int | None], include_eval: bool) -> dict[str, Source]:
        """View name -> a factory of its dataset at ``pin``."""
        return {
            name: (lambda n=name: self.dataset(n, pin, include_eval))  # type: ignore[misc]
            for name in CATALOG_VIEWS
        }

    def dataset(self, table: str, pin: Mapping[str, int | None], include_eval: bool) -> ds.Dataset:
        sid = pin.get(table)
        key = (table, sid, include_eval)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        data = self._raw(table, sid)
        if not include_eval:
            data = self._without_eval(table, data, pin)
        with self._lock:
            self._cache[key] = data
            while len(self._cache) > _CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return data

    def read(
        self,
        table: str,
        pin: Mapping[str, int | None],
        where: pc.Expression,
        columns: list[str] | None = None,
    ) -> pa.Table:
        """Rows of ``table`` at ``pin`` where ``where`` holds, eval rows included (the
        caller decides what the principal may see)."""
        return self.dataset(table, pin, include_eval=True).to_table(columns=columns, filter=where)

    def lookup(
        self, table: str, pin: Mapping[str, int | None], column: str, values: list[str]
    ) -> pa.Table:
        """Rows of ``table`` at ``pin`` whose ``column`` is one of ``values`` (eval rows
        included), reading only the row groups that hold them: each data file gets a
        cached index of its keys on first use (data files never change)."""
        data = self.dataset(table, pin, include_eval=True)
        if not isinstance(data, ds.FileSystemDataset):
            return data.to_table(filter=pc.field(column).isin(values))
        wanted = np.sort(np.array(values, dtype="S"))
        parts = []
        for fragment in data.get_fragments():
            index = self._key_index(fragment, column)
            rows = index.rows(wanted)
            if not rows.size:
                continue
            groups = np.searchsorted(index.starts, rows, side="right") - 1
            for group in np.unique(groups).tolist():
                part = fragment.subset(row_group_ids=[group]).to_table(schema=data.schema)
                local = rows[groups == group] - index.starts[group]
                parts.append(part.take(pa.array(local)))
        if not parts:
            return data.schema.empty_table()
        return pa.concat_tables(parts)

    def _key_index(self, fragment: ds.ParquetFileFragment, column: str) -> _KeyIndex:
        key = (fragment.path, column)
        with self._lock:
            hit = self._indexes.get(key)
            if hit is not None:
                self._indexes.move_to_end(key)
                return hit
        made = _KeyIndex(fragment, column)
        with self._lock:
            self._indexes[key] = made
            self._index_bytes += made.nbytes
            while self._index_bytes > _INDEX_BYTES and len(self._indexes) > 1:
                _, old = self._indexes.popitem(last=False)
                self._index_bytes -= old.nbytes
        return made

    def _without_eval(
        self, table: str, data: ds.Dataset, pin: Mapping[str, int | None]
    ) -> ds.Dataset:
        if table in ("assets", "clips"):
            return data.filter(pc.field("split") != "eval")
        if table in _CLIP_KEYED:
            ids = self.eval_ids("clips", "clip_id", pin.get("clips"))
            return data.filter(~pc.field("clip_id").isin(ids)) if len(ids) else data
        if table in _ASSET_KEYED:
            ids = self.eval_ids("assets", "asset_id", pin.get("assets"))
            return data.filter(~pc.field("asset_id").isin(ids)) if len(ids) else data
        return data

    def eval_ids(self, table: str, key: str, sid: int | None) -> pa.Array:
        """Ids (``key``) of the eval rows of ``table`` (assets or clips) at ``sid``."""
        with self._lock:
            hit = self._eval.get((table, sid))
        if hit is not None:
            return hit
        raw = self._raw(table, sid)
        got = raw.to_table(columns=[key], filter=pc.field("split") == "eval")
        ids = pc.unique(got.column(key).combine_chunks())
        with self._lock:
            self._eval[(table, sid)] = ids
        return ids

    def _raw(self, table: str, sid: int | None) -> ds.Dataset:
        key = (table, sid, True)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                return hit
        made = self._files_dataset(table, sid)
        with self._lock:
            self._cache[key] = made
        return made

    def _files_dataset(self, table: str, sid: int | None) -> ds.Dataset:
        from catalog.tables import arrow_schema

        tbl = self.catalog.iceberg_table(table)
        if sid is None:
            return ds.dataset(arrow_schema(tbl.schema()).empty_table())
        if tbl.metadata.snapshot_by_id(sid) is None:
            raise NotFound(f"{table} has no snapshot {sid}", table=table, snapshot_id=sid)
        io = tbl.io
        tasks = list(tbl.scan(snapshot_id=sid).plan_files())
        fs_by_scheme = getattr(io, "fs_by_scheme", None)
        if fs_by_scheme is None or any(t.delete_files for t in tasks) or not tasks:
            # Not a pyarrow FileIO (or deletes to apply): let pyiceberg read it.
            from catalog.catalog import Pin

            pin = Pin({table: sid})
            return ds.dataset(self.catalog.scan(table, pin, include_eval=True))
        locations = [io.parse_location(t.file.file_path, io.properties) for t in tasks]
        scheme, netloc = locations[0][0], locations[0][1]
        filesystem = fs_by_scheme(scheme, netloc)
        return ds.dataset(
            [path for _, _, path in locations], format="parquet", filesystem=filesystem
        )
