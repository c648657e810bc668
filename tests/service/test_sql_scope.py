"""Both walls of the SQL sandbox against the CTE-scope bypass.

First wall: table references resolve in their scope, so a CTE inside a subquery does
not make an outer system catalog look like a CTE. Second wall: even a query that
skips the validator (sent straight to a worker) finds nothing in the sandbox's
system catalogs and settings that names the server's files, home or directories.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.errors import InvalidSQL
from service.app import create_app
from service.sql import CATALOG_VIEWS, View, WorkerPool, validate_query
from service.sql.worker import Job
from tests.service.support import TestClient, World, assert_error

VIEWS = frozenset({*CATALOG_VIEWS, "manifests", "plans", "snapshots"})
SYSTEM = ["pg_settings", "duckdb_databases", "sqlite_master", "duckdb_logs", "duckdb_settings"]

BYPASSES = [
    "SELECT b.name, b.setting FROM (WITH pg_settings AS (SELECT 1) SELECT 1) a, pg_settings b",
    *(f"SELECT b.* FROM (WITH {s} AS (SELECT 1) SELECT 1) a, {s} b" for s in SYSTEM),
    "SELECT (WITH sqlite_master AS (SELECT 1) SELECT 1), * FROM sqlite_master",
    "SELECT * FROM clips WHERE clip_id IN (WITH pg_settings AS (SELECT 1) SELECT 1) "
    "UNION ALL SELECT * FROM pg_settings",
    "WITH pg_settings AS (SELECT * FROM pg_settings) SELECT * FROM pg_settings",
    "WITH y AS (SELECT 1) SELECT * FROM y AS pg_settings, pg_settings",
    "WITH a AS (SELECT * FROM duckdb_databases), duckdb_databases AS (SELECT 1) SELECT * FROM a",
    "SELECT * FROM clips, LATERAL (SELECT * FROM pg_settings)",
    "SELECT * FROM (SELECT 1) t(x) JOIN (WITH s AS (SELECT 1) SELECT * FROM s) u ON true, "
    "duckdb_settings",
]
FINE = [
    "WITH pg_settings AS (SELECT 1 AS x) SELECT * FROM pg_settings",
    "WITH x AS (SELECT 1 AS a) SELECT * FROM (SELECT * FROM x) "
    "JOIN LATERAL (SELECT * FROM x) ON true",
    "WITH RECURSIVE t AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM t WHERE n < 3) SELECT * FROM t",
    "WITH a AS (SELECT 1 AS v), b AS (SELECT * FROM a) SELECT * FROM b, a",
    "SELECT * FROM (WITH c AS (SELECT clip_id FROM clips) SELECT * FROM c) sub",
]


@pytest.fixture(scope="module")
def scope_client(world: World) -> Iterator[TestClient]:
    with TestClient(create_app(world.settings(sql_workers=1), catalog=world.catalog)) as c:
        yield c


@pytest.mark.parametrize("query", BYPASSES)
def test_cte_scope_bypass_is_rejected(query: str) -> None:
    with pytest.raises(InvalidSQL) as info:
        validate_query(query, VIEWS)
    assert info.value.details["reason"] == "table", info.value.details


@pytest.mark.parametrize("query", FINE)
def test_ctes_in_scope_are_accepted(query: str) -> None:
    validate_query(query, VIEWS)


def test_the_reported_request_is_a_400(scope_client: TestClient) -> None:
    r = scope_client.post("/v1/sql", json={"query": BYPASSES[0]})
    error = assert_error(r, 400, "invalid_sql")
    assert error["details"] == {"reason": "table", "name": "pg_settings"}
    assert "secret" not in r.text and os.getcwd() not in r.text
    ok = scope_client.post("/v1/sql", json={"query": FINE[2]})
    assert ok.status_code == 200 and ok.json()["rows"] == [[1], [2], [3]]


# -- the first wall, as a property ----------------------------------------------------
NAMES = ["clips", "pg_settings", "duckdb_databases"]
#: Physical-plan operators that read something other than a registered view.
SYSTEM_SCAN = re.compile(r"DUCKDB_|PRAGMA|READ_|GLOB|SQLITE|PG_|INFORMATION")


def _queries(depth: int) -> st.SearchStrategy[str]:
    """Small queries, all of one column ``c``, that nest CTEs named like system
    catalogs at random scopes and reference those names from anywhere."""
    leaf = st.sampled_from(NAMES).map(lambda n: f"SELECT 1 AS c FROM {n}")
    if depth == 0:
        return leaf
    sub = _queries(depth - 1)
    name = st.sampled_from(NAMES)
    return st.one_of(
        leaf,
        st.tuples(name, sub, sub).map(lambda t: f"WITH {t[0]} AS ({t[1]}) {t[2]}"),
        st.tuples(sub, name).map(lambda t: f"SELECT 1 AS c FROM ({t[0]}) s, {t[1]} t"),
        st.tuples(name, sub).map(lambda t: f"SELECT 1 AS c FROM {t[0]} WHERE EXISTS ({t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"{t[0]} UNION ALL {t[1]}"),
        st.tuples(sub, sub).map(lambda t: f"SELECT 1 AS c FROM ({t[0]}) s, LATERAL ({t[1]}) t"),
    )


@settings(max_examples=150, deadline=None)
@given(query=_queries(3))
def test_accepted_queries_bind_only_views_and_ctes(query: str) -> None:
    """Whatever the nesting, a query the validator accepts is planned by DuckDB (an
    ordinary connection, with ``clips`` registered) without any system-catalog scan."""
    try:
        validate_query(query, frozenset({"clips"}))
    except InvalidSQL:
        return
    con = duckdb.connect(":memory:")
    con.register("clips", pa.table({"c": [1]}))
    try:
        plan = " ".join(str(row[1]) for row in con.execute("EXPLAIN " + query).fetchall())
    except duckdb.Error:
        return  # DuckDB could not bind it either: nothing read
    finally:
        con.close()
    assert not SYSTEM_SCAN.search(plan), (query, plan)


# -- the second wall ------------------------------------------------------------------
STRAIGHT = [
    "SELECT name, value FROM duckdb_settings()",
    "SELECT name, setting FROM pg_settings",
    "SELECT * FROM duckdb_databases()",
    "SELECT * FROM sqlite_master",
    "SELECT * FROM duckdb_logs",
    "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM duckdb_temporary_files()",
    "SELECT * FROM duckdb_extensions()",
    "SELECT * FROM information_schema.schemata",
    "SELECT current_setting('secret_directory'), current_setting('home_directory')",
    "SELECT * FROM glob('*')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_csv('{home}/catalog.db')",
    "SELECT * FROM '{home}/catalog.db'",
    "ATTACH '{home}/x.db' AS x",
    "COPY (SELECT 1) TO 'out.csv'",
    "SET enable_external_access = true",
    "SET disabled_filesystems = ''",
    "INSTALL httpfs",
]


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    made = WorkerPool("256MB", size=1)
    yield made
    made.close()


def _straight(pool: WorkerPool, sql: str) -> str:
    """Run ``sql`` in a worker without the validator; the answer text or the error."""
    job = Job(
        sql=sql,
        allowed=frozenset(),
        views={"clips": View(pa.table({"clip_id": ["c1"], "split": ["train"]}))},
        memory_limit="256MB",
        timeout_s=10.0,
        deadline=time.monotonic() + 10.0,
        max_rows=10_000,
        max_bytes=1 << 22,
        validate=False,
    )
    try:
        header, body = pool.run(job)
    except InvalidSQL as exc:
        return f"error: {exc.message}"
    return json.dumps(header) + body.decode()


def test_second_wall_discloses_no_server_path(pool: WorkerPool, world: World) -> None:
    home = str(world.home.resolve())
    secrets = [
        os.getcwd(),
        str(Path.home()),
        home,
        str(Path(home).parent),
        sys.prefix,
        "stored_secrets",
        ".duckdb",
    ]
    for template in STRAIGHT:
        sql = template.replace("{home}", home)
        answer = _straight(pool, sql)
        for secret in secrets:
            assert secret not in answer, (sql, secret, answer[:500])
    assert not (world.home / "x.db").exists()


def test_second_wall_lists_only_the_registered_views(pool: WorkerPool) -> None:
    answer = _straight(pool, "SELECT table_name FROM information_schema.tables ORDER BY 1")
    assert answer.endswith('[["clips"]]'), answer
    answer = _straight(pool, "SELECT name FROM sqlite_master")
    assert answer.endswith('[["clips"]]'), answer
    settings = _straight(
        pool, "SELECT value FROM duckdb_settings() WHERE name = 'lock_configuration'"
    )
    assert settings.endswith('[["true"]]'), settings
    for name in ("enable_external_access", "autoload_known_extensions"):
        answer = _straight(pool, f"SELECT value FROM duckdb_settings() WHERE name = '{name}'")
        assert answer.endswith('[["false"]]'), (name, answer)
    for sql in ("SELECT * FROM glob('/*')", "SELECT * FROM read_text('/etc/hostname')"):
        assert _straight(pool, sql).startswith("error: the query failed"), sql
