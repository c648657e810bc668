"""DESCRIBE in the SQL endpoint: ``DESCRIBE <view>`` and ``DESCRIBE <select>`` are
answered by a checked ``SELECT * … LIMIT 0`` (never by DuckDB's DESCRIBE, which reads
its walled-off catalog); every other form is refused with a pointer to /v1/schemas."""

from __future__ import annotations

import pyarrow as pa
import pytest

from catalog.errors import InvalidSQL
from service.sql.describe import describe_rewrite
from service.sql.validate import validate_query
from tests.service.support import TestClient, assert_error

ARROW = "application/vnd.apache.arrow.stream"


def _sql(client: TestClient, query: str, **headers: str) -> object:
    return client.post("/v1/sql", json={"query": query}, headers=headers)


def test_describe_a_view_lists_its_columns_and_types(client: TestClient) -> None:
    r = _sql(client, "DESCRIBE clips")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["name"] for c in body["columns"]] == ["column_name", "column_type"]
    probe = client.post("/v1/sql", json={"query": "SELECT * FROM clips LIMIT 0"}).json()
    assert body["rows"] == [[c["name"], c["type"]] for c in probe["columns"]]
    assert body["row_count"] == len(body["rows"]) > 0 and ["clip_id", "string"] in body["rows"]


def test_describe_a_select_and_as_arrow(client: TestClient) -> None:
    r = _sql(client, "describe SELECT clip_id, num_frames * 2 AS n FROM clips")
    assert r.status_code == 200, r.text
    assert [row[0] for row in r.json()["rows"]] == ["clip_id", "n"]
    arrow = client.post("/v1/sql", json={"query": "DESCRIBE clips;"}, headers={"Accept": ARROW})
    assert arrow.status_code == 200 and arrow.headers["content-type"].startswith(ARROW)
    table = pa.ipc.open_stream(arrow.content).read_all()
    assert table.column_names == ["column_name", "column_type"]
    assert "clip_id" in table["column_name"].to_pylist()


@pytest.mark.parametrize(
    "query",
    [
        "DESCRIBE main.clips",
        'DESCRIBE "clips"',
        "DESCRIBE duckdb_settings",
        "DESCRIBE information_schema.tables",
        "DESCRIBE clips; SELECT 1",
    ],
)
def test_other_describes_are_refused_with_a_pointer(client: TestClient, query: str) -> None:
    err = assert_error(_sql(client, query), 400, "invalid_sql")
    assert "DESCRIBE" in err["message"] or "statement" in err["message"]


def test_a_described_select_is_checked_like_any_query(client: TestClient) -> None:
    err = assert_error(
        _sql(client, "DESCRIBE SELECT * FROM read_csv('/etc/passwd')"), 400, "invalid_sql"
    )
    assert "read_csv" in err["message"].lower()
    assert describe_rewrite("DESCRIBE SELECT * FROM read_csv('x')", {"clips"}) is not None


def test_the_validator_alone_refuses_describe_naming_the_schemas() -> None:
    with pytest.raises(InvalidSQL) as caught:
        validate_query("DESCRIBE clips", {"clips"})
    assert "/v1/schemas" in caught.value.message
