"""Settings: the one place vidlake reads its configuration.

Sources, highest first: keyword arguments, ``VIDLAKE_*`` environment variables, the
optional config file named by ``VIDLAKE_CONFIG`` (YAML or JSON), then defaults. The
defaults are the embedded mode: a SQLite catalog and local directories under
``./.vidlake/``. Nothing is created when settings are read; the catalog creates its
directories when it is first opened.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """Everything the service, the CLI and the demo need to find the catalog."""

    model_config = SettingsConfigDict(env_prefix="VIDLAKE_", extra="forbid", frozen=True)

    home: Path = Field(Path(".vidlake"), description="Root of the embedded default.")
    catalog_uri: str | None = Field(
        None,
        description="SQLAlchemy URI of the Iceberg SQL catalog (sqlite:/// or "
        "postgresql+psycopg2://), or rest:http://… for an Iceberg REST catalog. "
        "Default: sqlite:///<home>/catalog.db",
    )
    warehouse: str | None = Field(None, description="Iceberg warehouse: a directory or s3://…")
    objects: str | None = Field(None, description="Object store: a directory or s3://bucket/prefix")
    lance: str | None = Field(None, description="LanceDB directory or URI for embeddings")
    namespace: str = "vidlake"
    eval_fraction: float = Field(0.02, ge=0.0, lt=1.0)
    s3_endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint (default: AWS_ENDPOINT_URL, else AWS)"
    )
    s3_path_style: bool = False
    s3_region: str | None = Field(
        None,
        description="Region of an s3:// warehouse (default: AWS_REGION, AWS_DEFAULT_REGION; "
        "us-east-1 with a custom endpoint)",
    )

    # Service
    host: str = "127.0.0.1"
    port: int = Field(8321, ge=1, le=65535)
    tokens_file: Path | None = None
    max_body_bytes: int = Field(256 * 1024 * 1024, ge=1, description="Any request body")
    max_json_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1, description="A JSON ingest body (send Arrow for more)"
    )
    max_json_values: int = Field(
        2_000_000, ge=1, description="Values (commas + brackets) of a JSON ingest body"
    )
    max_decoded_bytes: int = Field(
        512 * 1024 * 1024, ge=1, description="Decoded bytes of an Arrow ingest body"
    )
    max_batch_cells: int = Field(50_000_000, ge=1, description="Rows x columns of one ingest batch")
    max_object_bytes: int = Field(
        64 * 1024**3,
        ge=1,
        description="One object uploaded with PUT /v1/objects/{sha256} (not max_body_bytes)",
    )
    sql_row_limit: int = 10_000
    sql_timeout_s: float = 10.0
    sql_memory_limit: str = "1GB"
    sql_workers: int = Field(4, ge=1, le=64, description="SQL worker processes (queries at once)")
    sql_result_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Most bytes of one SQL result"
    )

    # Cuts: where the selection's join runs (the artifacts do not depend on it)
    cut_executor: str = Field(
        "local",
        description="Executor of a cut's partitions: local, local:N, ray://host:port, or "
        "auto (the Ray cluster at ray_address, else the one on this machine)",
    )
    cut_partitions: int = Field(
        1, ge=1, le=65536, description="clip_id partitions of a cut's selection join"
    )
    ray_address: str | None = Field(
        None, description="The Ray cluster of the auto executor (default: RAY_ADDRESS)"
    )
    cut_scratch: Path | None = Field(
        None,
        description="Where a partitioned cut keeps its asset shards while it runs "
        "(default: the system's temp directory); on a multi-host Ray cluster, a "
        "directory every node mounts at the same path",
    )

    # Loader-side defaults for the CLI
    cache_dir: Path | None = None
    cache_budget_bytes: int = 8 * 1024**3

    # Storage operations (`vidlake storage upload/watch` write here; the dashboard reads)
    storage_status_dir: Path | None = Field(
        None,
        description="Status files of storage uploads and watches, shown on the dashboard "
        "and /metrics. Default: <home>/storage-status",
    )

    def resolved(self) -> dict[str, str]:
        """The effective locations, with the embedded defaults filled in."""
        home = self.home.resolve()
        return {
            "catalog_uri": self.catalog_uri or f"sqlite:///{home / 'catalog.db'}",
            "warehouse": self.warehouse or str(home / "warehouse"),
            "objects": self.objects or str(home / "objects"),
            "lance": self.lance or str(home / "lance"),
            "cache_dir": str(self.cache_dir or home / "cache"),
            "storage_status_dir": str(self.storage_status_dir or home / "storage-status"),
        }

    def s3_endpoint(self) -> str | None:
        """The S3 endpoint: ``s3_endpoint_url``, else boto3's ``AWS_ENDPOINT_URL``."""
        return self.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None

    def s3_region_name(self) -> str | None:
        """The warehouse bucket's region: ``s3_region``, else ``AWS_REGION`` or
        ``AWS_DEFAULT_REGION`` (the catalog itself reads no environment)."""
        env = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return self.s3_region or env or None

    def ray_cluster(self) -> str | None:
        """The Ray address ``auto`` connects to: ``ray_address``, else ``RAY_ADDRESS``."""
        return self.ray_address or os.environ.get("RAY_ADDRESS") or None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ConfigFileSource(settings_cls))


class _ConfigFileSource(PydanticBaseSettingsSource):
    """Reads the YAML/JSON file named by ``VIDLAKE_CONFIG``, if any."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("VIDLAKE_CONFIG")
        if not path:
            return {}
        text = Path(path).read_text()
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the config file must hold a mapping")
        return data


@lru_cache
def get_settings() -> Settings:
    """The process's settings (cached; tests build ``Settings(...)`` directly)."""
    return Settings()
