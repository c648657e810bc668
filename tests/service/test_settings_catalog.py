"""Settings are read in service.settings only: the catalog gets its S3 values passed down."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.backends import io_properties
from catalog.config import CatalogConfig
from service.lake import Lake
from service.settings import Settings


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env-endpoint:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)


def test_the_catalog_reads_no_environment(aws_env: None) -> None:
    props = io_properties(CatalogConfig(warehouse="s3://bucket/warehouse"))
    assert "s3.endpoint" not in props and "s3.region" not in props
    given = CatalogConfig(
        warehouse="s3://bucket/warehouse", s3_endpoint_url="http://given:1", s3_region="r1"
    )
    assert io_properties(given) == {"s3.endpoint": "http://given:1", "s3.region": "r1"}


def test_settings_pass_the_aws_environment_down(aws_env: None, tmp_path: Path) -> None:
    config = Lake(Settings(home=tmp_path, warehouse="s3://bucket/wh")).catalog_config()
    assert config.s3_endpoint_url == "http://env-endpoint:9000"
    assert config.s3_region == "eu-west-3"
    assert io_properties(config) == {
        "s3.endpoint": "http://env-endpoint:9000",
        "s3.region": "eu-west-3",
    }
    mine = Settings(home=tmp_path, s3_endpoint_url="http://mine:1", s3_region="ap-south-1")
    config = Lake(mine).catalog_config()
    assert (config.s3_endpoint_url, config.s3_region) == ("http://mine:1", "ap-south-1")


def test_a_custom_endpoint_without_a_region_is_us_east_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(home=tmp_path, warehouse="s3://b/w", s3_endpoint_url="http://m:9")
    props = io_properties(Lake(settings).catalog_config())
    assert props == {"s3.endpoint": "http://m:9", "s3.region": "us-east-1"}
