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
from tests.service.support import World, build_world

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
    loaded.app = app
    yield loaded
    app.state.services.close()


# One test per operation and generation mode of the checked-in document (read here,
# so that a stale document shows up as the drift test's failure, not as a collection
# error). Negative mode needs something to break: parameters or a body.
def _cases() -> list[tuple[str, str, GenerationMode]]:
    if not DOCUMENT.is_file():
        return []
    cases = []
    for path, item in json.loads(DOCUMENT.read_text()).get("paths", {}).items():
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
