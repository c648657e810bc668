"""vidlake's public Python API: the client of a vidlake server, and the loader.

    from vidlake import Client

    with Client("http://127.0.0.1:8321", token="...") as lake:
        lake.ingest("clips", rows, idempotency_key="clips-2026-12-01", progress=True)
        sha = lake.put_object("latents/clip-0.safetensors")
        lake.validate("recipe.yaml")
        snapshot = lake.cut("recipe.yaml", progress=True)
        table = lake.sql("SELECT count(*) AS n FROM clips")  # a pyarrow.Table

:class:`Client` (httpx, sync) and its async twin :class:`AsyncClient` (imported on
first use) need only ``pip install vidlake[loader]`` and import no FastAPI, DuckDB or
pyiceberg. Its errors are the
:class:`~vidlake.VidlakeError` subclasses re-exported here. ``SnapshotDataset`` and
``StatefulLoader`` (torch) are imported on first use. docs/client.md is the guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from catalog.errors import (
    Conflict,
    Forbidden,
    InvalidBatch,
    InvalidInput,
    InvalidRecipe,
    InvalidSQL,
    NotFound,
    Unauthorized,
    VidlakeError,
)
from service.client_errors import HashMismatch, RemoteError, Unreachable
from vidlake.client import Client

if TYPE_CHECKING:
    from loader.dataset import SnapshotDataset, StatefulLoader
    from vidlake.async_client import AsyncClient

__all__ = [
    "AsyncClient",
    "Client",
    "Conflict",
    "Forbidden",
    "HashMismatch",
    "InvalidBatch",
    "InvalidInput",
    "InvalidRecipe",
    "InvalidSQL",
    "NotFound",
    "RemoteError",
    "SnapshotDataset",
    "StatefulLoader",
    "Unauthorized",
    "Unreachable",
    "VidlakeError",
]

_LAZY = {
    "AsyncClient": "vidlake.async_client",
    "SnapshotDataset": "loader.dataset",
    "StatefulLoader": "loader.dataset",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vidlake' has no attribute {name!r}")
