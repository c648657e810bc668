"""Whether a snapshot version holds eval material, for the endpoints that expose a
version's rows whole (artifacts, diffs).

A training cut never holds eval clips: the materializer carves them out. A registry
can still hold such a version (a foreign writer, a bug), and then its ``index.arrow``
and ``manifest.parquet`` name eval clips and their latent objects. The server decides
from its own eval id set at the latest catalog state (eval ids only grow: the split
is fixed at ingest), caching the answer per (version, clips snapshot id).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow.compute as pc

from catalog.errors import Forbidden, NotFound

if TYPE_CHECKING:
    from service.auth import Principal
    from service.snapshot_reader import SnapshotReader
    from service.sql import CatalogViews

__all__ = ["EvalVersions"]


class EvalVersions:
    """Cached "does version v name an eval clip" answers.

    Args:
        views: Catalog datasets (for the eval clip ids).
        reader: Verified snapshot reads (for ``index.arrow``).
    """

    def __init__(self, views: CatalogViews, reader: SnapshotReader) -> None:
        self._views = views
        self._reader = reader
        self._lock = threading.Lock()
        self._answers: dict[tuple[int, int | None], bool] = {}

    def holds_eval(self, version: int, pin: Mapping[str, int | None]) -> bool:
        """Whether ``version``'s index names a clip that is eval at ``pin``."""
        key = (version, pin.get("clips"))
        with self._lock:
            hit = self._answers.get(key)
        if hit is not None:
            return hit
        eval_clips = self._views.eval_ids("clips", "clip_id", pin.get("clips"))
        try:
            index = self._reader.ipc_table(version, "index.arrow")
        except NotFound:
            index = None
        holds = bool(
            index is not None
            and len(eval_clips)
            and pc.any(pc.is_in(index.column("clip_id"), value_set=eval_clips)).as_py()
        )
        with self._lock:
            self._answers[key] = holds
        return holds

    def require(self, principal: Principal, pin: Mapping[str, int | None], *versions: int) -> None:
        """Raise Forbidden unless ``principal`` sees eval or no version holds eval."""
        if principal.sees_eval:
            return
        for version in versions:
            if self.holds_eval(version, pin):
                raise Forbidden(
                    f"version {version} holds eval material; the eval scope is needed",
                    scope="eval",
                    version=version,
                )
