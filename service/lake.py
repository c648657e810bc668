"""The handles of one vidlake deployment, built from :class:`~service.settings.Settings`.

The service (through ``service.deps``), the CLI's embedded mode and the demo share this
one way of turning settings into a catalog, an object store and a snapshot registry.
Everything opens lazily, on first use.
"""

from __future__ import annotations

import threading
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from service.settings import Settings

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig
    from catalog.objects import ObjectStore
    from manifests.registry import Registry

__all__ = ["Lake"]


class Lake:
    """Catalog, object store and registry of one deployment (opened lazily)."""

    def __init__(self, settings: Settings, *, eval_salt: str | None = None) -> None:
        """``eval_salt``: the carve-out salt a catalog created by this lake freezes
        (None: a random one); an existing catalog with another salt is a Conflict."""
        self.settings = settings
        self._eval_salt = eval_salt
        self._lock = threading.Lock()

    @property
    def home(self) -> Path:
        return self.settings.home.resolve()

    def catalog_config(self) -> CatalogConfig:
        from catalog.config import CatalogConfig

        where = self.settings.resolved()
        return CatalogConfig(
            uri=where["catalog_uri"],
            warehouse=where["warehouse"],
            namespace=self.settings.namespace,
            objects=where["objects"],
            lance=where["lance"],
            # Only a fraction set on purpose: the catalog freezes its own at creation,
            # and a different one is a Conflict.
            eval_fraction=(
                self.settings.eval_fraction
                if "eval_fraction" in self.settings.model_fields_set
                else None
            ),
            eval_salt=self._eval_salt,
            s3_endpoint_url=self.settings.s3_endpoint(),
            s3_path_style=self.settings.s3_path_style or None,
            s3_region=self.settings.s3_region_name(),
        )

    @cached_property
    def objects(self) -> ObjectStore:
        from catalog.objects import open_store

        where = self.settings.resolved()
        return open_store(
            where["objects"],
            endpoint_url=self.settings.s3_endpoint_url,
            path_style=self.settings.s3_path_style or None,
        )

    @cached_property
    def catalog(self) -> VidlakeCatalog:
        from catalog.catalog import VidlakeCatalog

        with self._lock:
            return VidlakeCatalog.open(self.catalog_config(), objects=self.objects)

    @cached_property
    def registry(self) -> Registry:
        from manifests.registry import Registry

        return Registry(self.objects)

    def close(self) -> None:
        if "catalog" in self.__dict__:
            self.catalog.close()
