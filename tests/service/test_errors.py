"""Over HTTP an error answers its class's code, whatever details it carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import StorageError
from service.app import create_app
from service.settings import Settings
from tests.service.support import TestClient, assert_error, sha


def test_storage_error_with_a_code_detail_answers_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0))

    def denied(*_: Any, **__: Any) -> None:
        raise StorageError("S3 head of s3://b/k failed: AccessDenied", key="k", code="AccessDenied")

    monkeypatch.setattr(catalog.objects, "head", denied)
    with TestClient(create_app(Settings(home=tmp_path), catalog=catalog)) as client:
        response = client.get(f"/v1/objects/{sha('absent')}")
    error = assert_error(response, 502, "storage_error")
    assert error["details"] == {"key": "k", "code": "AccessDenied"}
