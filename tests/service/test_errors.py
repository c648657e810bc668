"""Over HTTP an error answers its class's code, whatever details it carries."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.errors import StorageError
from tests.service.support import TestClient, World, assert_error, sha


def test_storage_error_with_a_code_detail_answers_storage_error(
    world: World, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*_: Any, **__: Any) -> None:
        raise StorageError("S3 head of s3://b/k failed: AccessDenied", key="k", code="AccessDenied")

    monkeypatch.setattr(world.catalog.objects, "head", denied)
    error = assert_error(client.get(f"/v1/objects/{sha('absent')}"), 502, "storage_error")
    assert error["details"] == {"key": "k", "code": "AccessDenied"}
