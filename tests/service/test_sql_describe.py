"""DESCRIBE is refused by the SQL sandbox with a pointer to /v1/schemas and to the
query that does answer it (SELECT * … LIMIT 0 returns the columns and their types)."""

from __future__ import annotations

import pytest

from catalog.errors import InvalidSQL
from service.sql.validate import validate_query
from tests.service.support import TestClient, assert_error


@pytest.mark.parametrize("sql", ["DESCRIBE clips", "describe assets;", "DESCRIBE SELECT 1"])
def test_describe_points_at_the_schemas(sql: str) -> None:
    with pytest.raises(InvalidSQL) as caught:
        validate_query(sql, {"clips", "assets"})
    assert "/v1/schemas" in caught.value.message and "LIMIT 0" in caught.value.message


def test_the_pointed_query_answers_columns_and_types(client: TestClient) -> None:
    err = assert_error(client.post("/v1/sql", json={"query": "DESCRIBE clips"}), 400, "invalid_sql")
    assert "/v1/schemas" in err["message"]
    r = client.post("/v1/sql", json={"query": "SELECT * FROM clips LIMIT 0"})
    assert r.status_code == 200, r.text
    columns = {c["name"]: c["type"] for c in r.json()["columns"]}
    assert "clip_id" in columns and columns["num_frames"]
