"""GET /v1/schemas, ``vidlake schema`` and docs/tables.md: one source, the table
declarations and their described columns."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog.tables import TABLES
from service.app import create_app
from service.client import HttpClient
from service.client_local import LocalClient
from service.row_schemas import row_schema_name
from service.table_schemas import SCHEMA_TABLES, render_markdown
from tests.service.support import TestClient, World, assert_error, bearer, serve

REPO = Path(__file__).resolve().parents[2]


def test_docs_tables_md_is_generated_from_the_code() -> None:
    committed = (REPO / "docs" / "tables.md").read_text()
    assert committed == render_markdown(), (
        "docs/tables.md drifted: run python -m service.table_schemas > docs/tables.md"
    )


def test_list_names_every_ingest_table(client: TestClient) -> None:
    r = client.get("/v1/schemas")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [t["name"] for t in body["data"]] == list(SCHEMA_TABLES)
    assert body["count"] == len(SCHEMA_TABLES)


def _columns(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in table["columns"]}


def test_clips_say_what_the_catalog_fills(client: TestClient) -> None:
    clips = client.get("/v1/schemas/clips").json()
    cols = _columns(clips)
    assert cols["clip_id"]["required"] is False
    assert cols["clip_id"]["filled_by_catalog"] == "derived"
    assert "t_start_s:.6f" in cols["clip_id"]["description"]
    assert cols["asset_id"]["required"] is True and cols["asset_id"]["filled_by_catalog"] is None
    assert cols["ingested_at"]["filled_by_catalog"] == "ingest time"
    assert cols["num_frames"]["type"] == "int32"
    assert cols["asset_id"]["json_schema"]["pattern"] == "^[0-9a-f]{64}$"
    assert clips["ingest"] == "POST /v1/clips" and clips["key"] == ["clip_id"]
    assert "clip_id" not in clips["example"]


def test_assets_document_the_nested_probe_and_defaults(client: TestClient) -> None:
    assets = client.get("/v1/schemas/assets").json()
    cols = _columns(assets)
    assert cols["opt_out"]["filled_by_catalog"] == "default: false"
    assert any('"probe"' in note for note in assets["notes"])
    assert cols["fingerprint"]["type"] == "binary"


def test_required_agrees_with_the_openapi_row_schemas(client: TestClient) -> None:
    components = client.get("/openapi.json").json()["components"]["schemas"]
    for name in TABLES:
        table = client.get(f"/v1/schemas/{name}").json()
        required = {c["name"] for c in table["columns"] if c["required"]}
        assert required == set(components[row_schema_name(name)]["required"]), name
    assert "/v1/schemas/{table}" in client.get("/openapi.json").json()["paths"]


def test_example_rows_ingest(client: TestClient) -> None:
    # The documented example asset is accepted by the real ingest route.
    example = client.get("/v1/schemas/assets").json()["example"]
    r = client.post("/v1/assets", json=[example])
    assert r.status_code == 200, r.text


def test_unknown_table_is_a_404_naming_the_tables(client: TestClient) -> None:
    err = assert_error(client.get("/v1/schemas/clip"), 404, "not_found")
    assert "clips" in err["message"] and err["details"]["known"] == list(SCHEMA_TABLES)


def test_schemas_need_the_read_scope(authed: TestClient) -> None:
    assert authed.get("/v1/schemas").status_code == 401
    ok = authed.get("/v1/schemas/latents", headers=bearer("tok-read"))
    assert ok.status_code == 200, ok.text


@pytest.fixture(scope="module")
def url(world: World) -> Iterator[str]:
    with serve(create_app(world.settings(), catalog=world.catalog)) as base:
        yield base


def test_both_clients_answer_the_same(world: World, url: str) -> None:
    with HttpClient(url) as remote, LocalClient(world.settings()) as local:
        assert remote.schema("latents") == local.schema("latents")
        assert remote.schema() == local.schema()
        with pytest.raises(Exception) as caught:
            remote.schema("nope/../assets")
        assert getattr(caught.value, "http_status", None) == 404


def _vidlake(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"VIDLAKE_HOME": str(home), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


def test_cli_schema(world: World) -> None:
    listed = _vidlake(world.home, "schema")
    assert listed.returncode == 0, listed.stderr
    assert all(name in listed.stdout for name in SCHEMA_TABLES)
    one = _vidlake(world.home, "schema", "clips", "--json")
    assert json.loads(one.stdout)["columns"][0]["name"] == "clip_id"
    shown = _vidlake(world.home, "schema", "assets")
    assert "derived" in shown.stdout and "example row" in shown.stdout
    missing = _vidlake(world.home, "schema", "clip")
    assert missing.returncode == 2 and "no table 'clip'" in missing.stderr
