"""The checked-in OpenAPI document: it matches the app, and the app honours it
(schemathesis over every operation of that document: no 5xx, documented statuses)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    status_code_conformance,
)

from service.app import create_app
from service.openapi_dump import openapi_text
from service.row_schemas import row_schema_name
from tests.service.support import TestClient, World, assert_error, build_world

DOCUMENT = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_checked_in_document_matches_the_app() -> None:
    assert DOCUMENT.is_file(), "run `make openapi` to create openapi/openapi.json"
    assert DOCUMENT.read_text() == openapi_text(), (
        "openapi/openapi.json is stale: run `make openapi` and commit the result"
    )


def test_every_operation_documents_the_error_shape() -> None:
    doc = json.loads(DOCUMENT.read_text())
    assert "ErrorResponse" in doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path.startswith("/v1/") and path != "/v1/health":
                codes = set(op["responses"])
                assert codes & {"401", "403", "404", "422"}, (method, path)


@pytest.fixture(scope="module")
def fuzz_world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def api_schema(fuzz_world: World) -> Iterator[Any]:
    settings_ = fuzz_world.settings(sql_timeout_s=2.0, sql_row_limit=100)
    app = create_app(settings_, catalog=fuzz_world.catalog)
    loaded = schemathesis.openapi.from_dict(json.loads(DOCUMENT.read_text()))
    loaded.app = _from_loopback(app)
    yield loaded
    app.state.services.close()


def _from_loopback(app: Any) -> Any:
    """The app as called from 127.0.0.1 (schemathesis' client host is ``testclient``,
    which an open service refuses)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "client": ("127.0.0.1", 50000)}
        await app(scope, receive, send)

    return wrapped


# Admin jobs that delete by design (gc --apply, maintenance with zero ages) would wreck
# the shared fuzz world for the operations after them; tests/service/test_maintenance.py
# covers their 4xx and their jobs on a lake of their own.
DESTRUCTIVE = frozenset({"/v1/gc", "/v1/maintenance"})


# One test per operation and generation mode of the checked-in document (read here,
# so that a stale document shows up as the drift test's failure, not as a collection
# error). Negative mode needs something to break: parameters or a body.
def _cases() -> list[tuple[str, str, GenerationMode]]:
    if not DOCUMENT.is_file():
        return []
    cases = []
    for path, item in json.loads(DOCUMENT.read_text()).get("paths", {}).items():
        if path in DESTRUCTIVE:
            continue
        for method, op in item.items():
            cases.append((method.upper(), path, GenerationMode.POSITIVE))
            if op.get("parameters") or op.get("requestBody"):
                cases.append((method.upper(), path, GenerationMode.NEGATIVE))
    return sorted(cases, key=lambda c: (c[1], c[0], c[2].value))


@pytest.mark.parametrize(("method", "path", "mode"), _cases())
def test_api_honours_its_document(
    api_schema: Any, method: str, path: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        case.call_and_validate(
            checks=[not_a_server_error, status_code_conformance, content_type_conformance]
        )

    run()


# -- the published contract (issue 15, item 6) ------------------------------------------
def test_options_and_405_name_every_allowed_method(fuzz_world: World) -> None:
    app = create_app(fuzz_world.settings(), catalog=fuzz_world.catalog)
    with TestClient(app) as client:
        for path, allowed in {
            "/v1/snapshots": {"GET", "POST"},
            "/v1/jobs": {"GET", "POST"},
            "/v1/objects/" + "0" * 64: {"GET", "HEAD", "PUT"},
            "/v1/snapshots/1/pin": {"POST", "DELETE"},
            "/": {"GET"},
        }.items():
            r = client.options(path)
            assert r.status_code == 204, (path, r.status_code, r.text)
            assert set(r.headers["allow"].split(", ")) == allowed | {"OPTIONS"}, path
            r = client.patch(path, json={})
            error = assert_error(r, 405, "method_not_allowed")
            assert set(r.headers["allow"].split(", ")) == allowed | {"OPTIONS"}, path
            assert set(error["details"]["allow"]) == allowed | {"OPTIONS"}
        assert_error(client.options("/v1/no/such/route"), 404, "not_found")


def test_the_dashboard_documents_its_auth_errors() -> None:
    responses = json.loads(DOCUMENT.read_text())["paths"]["/"]["get"]["responses"]
    assert {"200", "401", "403"} <= set(responses)
    assert "text/html" in responses["200"]["content"]


def test_ingest_bodies_are_typed_per_table() -> None:
    doc = json.loads(DOCUMENT.read_text())
    schemas = doc["components"]["schemas"]
    from catalog.tables import TABLES

    for path, table in {**{t.replace("_", "-"): t for t in TABLES}, "embeddings": None}.items():
        body = doc["paths"][f"/v1/{path}"]["post"]["requestBody"]["content"]
        name = "EmbeddingsRow" if table is None else row_schema_name(table)
        ref = {"$ref": f"#/components/schemas/{name}"}
        assert body["application/json"]["schema"] == {"type": "array", "items": ref}, path
        assert body["application/vnd.apache.arrow.stream"]["x-vidlake-columns"] == ref
        assert schemas[name]["additionalProperties"] is False
    clips = schemas["ClipsRow"]["properties"]
    assert clips["clip_id"]["pattern"] == "^[0-9a-f]{32}$"
    assert clips["asset_id"]["pattern"] == "^[0-9a-f]{64}$"
    assert clips["num_frames"]["exclusiveMinimum"] == 0
    assert set(schemas["ClipsRow"]["required"]) == {
        "asset_id",
        "t_start_s",
        "t_end_s",
        "split_version",
        "num_frames",
        "width",
        "height",
    }
    assets = schemas["AssetsRow"]["properties"]
    assert assets["source_tier"]["enum"] == ["licensed", "crawl", "synthetic"]
    assert assets["size"]["type"] == "integer" and assets["size"]["minimum"] == 0
    assert assets["duplicate_of"] == {
        "type": "null",
        "description": assets["duplicate_of"]["description"],
    }
    latents = schemas["LatentsRow"]["properties"]
    assert latents["format"]["enum"] == ["safetensors", "pt", "npy"]
    assert latents["object_sha256"]["pattern"] == "^[0-9a-f]{64}$"
    assert latents["shapes"]["items"]["items"]["type"] == "integer"
    assert schemas["EmbeddingsRow"]["properties"]["clip_id"]["pattern"] == "^[0-9a-f]{32}$"
