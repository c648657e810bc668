"""POST /v1/sql: the sandbox rejects hostile SQL (400, no trace), answers read-only
queries over the pinned views, limits rows and time, and speaks JSON or Arrow."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from catalog.errors import InvalidSQL
from service.app import create_app
from service.sql import CATALOG_VIEWS, sandbox_connection, validate_query
from tests.service.support import TestClient, World, assert_error

ARROW = "application/vnd.apache.arrow.stream"
VIEWS = frozenset({*CATALOG_VIEWS, "manifests", "plans", "snapshots"})

HOSTILE = [
    "COPY (SELECT 1) TO '{tmp}/out.csv'",
    "COPY clips TO '{tmp}/out.parquet' (FORMAT parquet)",
    "ATTACH '{tmp}/x.db' AS x",
    "ATTACH ':memory:' AS m",
    "DETACH m",
    "INSTALL httpfs",
    "LOAD httpfs",
    "LOAD '{tmp}/evil.duckdb_extension'",
    "FORCE INSTALL '{tmp}/evil.duckdb_extension'",
    "SELECT * FROM read_csv('{tmp}/secret.csv')",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_parquet('{tmp}/secret.parquet')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_blob('{tmp}/secret.csv')",
    "SELECT * FROM read_json_auto('{tmp}/x.json')",
    "SELECT * FROM '{tmp}/secret.csv'",
    'SELECT * FROM "/etc/passwd"',
    "FROM read_csv('{tmp}/secret.csv')",
    "SELECT * FROM clips, read_csv('{tmp}/secret.csv')",
    "SELECT * FROM clips JOIN glob('/tmp/*') ON true",
    "WITH x AS (SELECT * FROM read_csv('{tmp}/secret.csv')) SELECT * FROM x",
    "SELECT (SELECT count(*) FROM read_text('/etc/passwd'))",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM glob('{tmp}/*')",
    "SELECT * FROM sqlite_scan('{tmp}/x.db', 't')",
    "SELECT * FROM iceberg_scan('{tmp}/warehouse')",
    "SELECT * FROM parquet_metadata('{tmp}/secret.parquet')",
    "SELECT * FROM sniff_csv('{tmp}/secret.csv')",
    "SET enable_external_access = true",
    "SET memory_limit = '100GB'",
    "RESET lock_configuration",
    "SET VARIABLE x = 1",
    "PRAGMA enable_profiling",
    "PRAGMA database_list",
    "CALL pragma_version()",
    "SELECT * FROM pragma_database_list()",
    "SELECT current_setting('enable_external_access')",
    "SELECT current_setting('lock_configuration'), clip_id FROM clips",
    "SELECT getenv('HOME')",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM duckdb_extensions()",
    "SELECT load_extension('x')",
    "SELECT which_secret('s3://x', 's3')",
    "CREATE SECRET (TYPE s3, KEY_ID 'x', SECRET 'y')",
    "SELECT 1; SELECT 2",
    "SELECT 1; DROP VIEW clips",
    "CREATE TABLE t AS SELECT 1",
    "CREATE VIEW v AS SELECT * FROM clips",
    "CREATE MACRO m(x) AS x",
    "INSERT INTO clips SELECT * FROM clips",
    "UPDATE clips SET split = 'train'",
    "DELETE FROM clips",
    "DROP VIEW clips",
    "ALTER VIEW clips RENAME TO c",
    "EXPORT DATABASE '{tmp}/dump'",
    "IMPORT DATABASE '{tmp}/dump'",
    "CHECKPOINT",
    "VACUUM",
    "BEGIN TRANSACTION",
    "USE memory",
    "DESCRIBE main.clips",  # DESCRIBE clips is answered (tests/service/test_sql_describe.py)
    "DESCRIBE SELECT * FROM read_csv('{tmp}/secret.csv')",
    "SUMMARIZE clips",
    "SHOW TABLES",
    "SELECT * FROM query('SELECT 42')",
    "SELECT * FROM query_table('clips')",
    "SELECT json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM main.clips",
    "SELECT * FROM memory.main.clips",
    "SELECT * FROM not_a_view",
    "WITH __raw AS (SELECT 1) SELECT * FROM __raw",
    "SELECT setseed(0.5)",
    "SELECT nextval('s')",
    "SELECT 1 " + "UNION ALL SELECT 1 " * 6000,
    "SELECT " + "(" * 3000 + "1" + ")" * 3000,
    "",
    "   ",
    "-- only a comment",
    "SELEC 1",
]


@pytest.fixture(scope="module")
def sql_client(world: World) -> Iterator[TestClient]:
    settings = world.settings(sql_row_limit=50, sql_timeout_s=1.0, sql_memory_limit="256MB")
    with TestClient(create_app(settings, catalog=world.catalog)) as c:
        yield c


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_validator_accepts_ordinary_reads() -> None:
    for ok in [
        "SELECT 1",
        "select split, count(*) from clips group by 1",
        "WITH c AS (SELECT * FROM clips) SELECT c.clip_id FROM c JOIN scores s USING (clip_id)",
        "SELECT 1 UNION ALL SELECT 2",
        "SELECT p.step, r FROM plans p, unnest(p.rows) AS t(r) WHERE p.version = 1",
        "SELECT * FROM (SELECT clip_id FROM clips) sub",
        "SELECT unnest(range(3)), lower('X'), list_transform([1, 2], x -> x + 1)",
        "FROM manifests SELECT version, count(*) GROUP BY version",
    ]:
        validate_query(ok, VIEWS)


def test_hostile_sql_is_rejected_and_leaves_no_trace(
    sql_client: TestClient, world: World, tmp_path: Path
) -> None:
    (tmp_path / "secret.csv").write_text("password\nhunter2\n")
    (tmp_path / "secret.parquet").write_bytes(b"PAR1")
    before_tmp, before_home = listing(tmp_path), listing(world.home)
    for template in HOSTILE:
        query = template.replace("{tmp}", str(tmp_path))
        r = sql_client.post("/v1/sql", json={"query": query})
        error = assert_error(r, 400, "invalid_sql")
        assert "hunter2" not in r.text, query
        assert error["details"].get("reason"), (query, error)
    assert listing(tmp_path) == before_tmp
    assert listing(world.home) == before_home
    # The service still answers, and its sandbox is still locked down.
    ok = sql_client.post("/v1/sql", json={"query": "SELECT count(*) AS n FROM clips"})
    assert ok.status_code == 200, ok.text


def test_duckdb_wall_holds_without_the_validator(tmp_path: Path) -> None:
    """Bypassing sqlglot, the locked-down connection itself refuses file access and
    configuration changes, and its settings stay as set."""
    (tmp_path / "secret.csv").write_text("password\nhunter2\n")
    before = listing(tmp_path)
    con = sandbox_connection("128MB")
    hidden = pa.table({"x": [1]})  # noqa: F841 - a replacement scan would find it by name
    for stmt in [
        f"SELECT * FROM read_csv('{tmp_path}/secret.csv')",
        f"SELECT * FROM '{tmp_path}/secret.csv'",
        f"COPY (SELECT 1) TO '{tmp_path}/out.csv'",
        f"ATTACH '{tmp_path}/x.db'",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "SET memory_limit = '64GB'",
        "SELECT * FROM hidden",
        f"SELECT * FROM glob('{tmp_path}/*')",
    ]:
        with pytest.raises(duckdb.Error):
            con.execute(stmt).fetchall()
    settings = dict(
        con.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ("
            "'enable_external_access', 'lock_configuration', 'python_enable_replacements',"
            "'memory_limit', 'temp_directory', 'autoload_known_extensions')"
        ).fetchall()
    )
    assert settings["enable_external_access"] == "false"
    assert settings["lock_configuration"] == "true"
    assert settings["python_enable_replacements"] == "false"
    assert settings["autoload_known_extensions"] == "false"
    assert settings["temp_directory"] == ""
    assert settings["memory_limit"].startswith("122")  # 128 MB in MiB units
    con.close()
    assert listing(tmp_path) == before


def test_row_limit_sets_truncated(sql_client: TestClient) -> None:
    body = sql_client.post("/v1/sql", json={"query": "SELECT unnest(range(200)) AS i"}).json()
    assert (body["row_count"], body["truncated"]) == (50, True)
    assert [r[0] for r in body["rows"]] == list(range(50))
    body = sql_client.post(
        "/v1/sql", json={"query": "SELECT unnest(range(200)) AS i", "limit": 7}
    ).json()
    assert (body["row_count"], body["truncated"]) == (7, True)
    body = sql_client.post("/v1/sql", json={"query": "SELECT 1 AS one"}).json()
    assert (body["rows"], body["truncated"]) == ([[1]], False)


def test_time_limit_interrupts(sql_client: TestClient) -> None:
    query = (
        "SELECT sum(a * b) FROM (SELECT unnest(range(30000)) AS a) x, "
        "(SELECT unnest(range(30000)) AS b) y"
    )
    start = time.monotonic()
    error = assert_error(sql_client.post("/v1/sql", json={"query": query}), 400, "invalid_sql")
    assert error["details"]["reason"] == "timeout"
    assert time.monotonic() - start < 10


def test_execution_errors_are_400(sql_client: TestClient) -> None:
    error = assert_error(
        sql_client.post("/v1/sql", json={"query": "SELECT no_such_column FROM clips"}), 400
    )
    assert error["details"]["reason"] == "execution"


def test_arrow_output(sql_client: TestClient, world: World) -> None:
    r = sql_client.post(
        "/v1/sql",
        json={"query": "SELECT clip_id, split FROM clips ORDER BY clip_id"},
        headers={"Accept": ARROW},
    )
    assert r.status_code == 200 and r.headers["content-type"] == ARROW
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.column_names == ["clip_id", "split"]
    assert table.num_rows == int(r.headers["x-vidlake-row-count"]) == len(world.clips)
    assert r.headers["x-vidlake-truncated"] == "false"


def test_manifests_plans_and_snapshots_views(sql_client: TestClient, world: World) -> None:
    body = sql_client.post(
        "/v1/sql",
        json={"query": "SELECT version, count(*) FROM manifests GROUP BY 1 ORDER BY 1"},
    ).json()
    assert [r[0] for r in body["rows"]] == world.versions
    clip = world.train_clips[0]
    body = sql_client.post(
        "/v1/sql",
        json={
            "query": "SELECT DISTINCT p.version, p.step FROM plans p, unnest(p.rows) AS t(r) "
            f"JOIN manifests m ON m.version = p.version AND m.row = t.r "
            f"WHERE m.clip_id = '{clip}' ORDER BY 1, 2"
        },
    ).json()
    assert body["rows"] and all(v in world.versions for v, _ in body["rows"])
    names = sql_client.post(
        "/v1/sql", json={"query": "SELECT version, name FROM snapshots ORDER BY version"}
    ).json()
    assert names["rows"] == [[v, f"fake-{v - 1}"] for v in world.versions]


def test_pins(sql_client: TestClient, world: World) -> None:
    at_v1 = sql_client.post(
        "/v1/sql", json={"query": "SELECT count(*) FROM clips", "snapshot": 1}
    ).json()
    assert at_v1["pin"]["clips"] is not None
    explicit = sql_client.post(
        "/v1/sql", json={"query": "SELECT count(*) FROM clips", "pin": {"clips": None}}
    ).json()
    assert explicit["rows"] == [[0]]  # an empty table at that pin
    assert_error(
        sql_client.post("/v1/sql", json={"query": "SELECT 1", "snapshot": 99}), 404, "not_found"
    )
    assert_error(
        sql_client.post("/v1/sql", json={"query": "SELECT 1", "pin": {"nope": 1}}),
        422,
        "invalid_input",
    )
    assert_error(
        sql_client.post("/v1/sql", json={"query": "SELECT 1", "pin": {"clips": 12345}}),
        404,
        "not_found",
    )


def test_validate_query_names_the_reason() -> None:
    with pytest.raises(InvalidSQL) as info:
        validate_query("SELECT * FROM read_parquet('x')", VIEWS)
    assert info.value.details["reason"] == "table_function"
    with pytest.raises(InvalidSQL) as info:
        validate_query("SELECT current_setting('threads')", VIEWS)
    assert info.value.details == {"reason": "function", "name": "current_setting"}
