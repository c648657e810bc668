"""``vidlake storage …`` opens its bucket with the settings' endpoint and path style
(the S3 store reads no environment variable of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.cli_storage import _bucket_store
from service.settings import get_settings


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_bucket_store_takes_path_style_and_endpoint_from_the_settings(
    fresh_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIDLAKE_S3_PATH_STYLE", "true")
    monkeypatch.setenv("VIDLAKE_S3_ENDPOINT_URL", "http://minio.internal:9000")
    store = _bucket_store("lake", "backup", None)
    assert (store.bucket, store.prefix) == ("lake", "backup")
    assert store.path_style is True
    assert store.endpoint_url == "http://minio.internal:9000"
    assert _bucket_store("lake", "", "http://other:9000").endpoint_url == "http://other:9000"


def test_bucket_store_without_settings_leaves_boto3_its_defaults(
    fresh_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VIDLAKE_S3_PATH_STYLE", raising=False)
    monkeypatch.delenv("VIDLAKE_S3_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("VIDLAKE_CONFIG", raising=False)
    store = _bucket_store("lake", "", None)
    assert store.path_style is None and store.endpoint_url is None
