"""The in-process :class:`~service.client.Client`: the service's operations on the
embedded (or configured) catalog, without a server.

:class:`LocalClient` holds a :class:`~service.deps.Services` built from the settings,
exactly as the app does, and calls the functions the routers call (most of them the
route functions themselves, with a caller holding every scope), so an answer is the
document the REST API would send, and an error the one it would raise. Cuts and
erasures run as the service's background jobs and are waited for here, so an
interrupted one resumes or is joined by the server's, and the reverse.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from catalog.errors import ChecksumMismatch, InvalidInput
from service.auth import SCOPES, Principal
from service.client import HashMismatch, Progress, check_table, wait_for_job
from service.client_transfer import Bar, bar, ingest_chunks, recipe_document, upload_file
from service.deps import Services
from service.settings import Settings

if TYPE_CHECKING:
    import pyarrow as pa

    from materializer.recipe import Recipe

__all__ = ["LocalClient"]

M = TypeVar("M", bound=BaseModel)


def _body(model: type[M], **fields: Any) -> M:
    """A request model, its validation failure an :class:`InvalidInput` (as over HTTP)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"{where}: {first['msg']}", field=where) from None


def _json(model: BaseModel) -> dict[str, Any]:
    data: dict[str, Any] = model.model_dump(mode="json")
    return data


class LocalClient:
    """A :class:`~service.client.Client` of the lake ``settings`` name, in this process.

    Args:
        settings: Where the lake is (``vidlake config``).
        services: Use these instead of building them from ``settings`` (tests).
    """

    def __init__(self, settings: Settings, *, services: Services | None = None) -> None:
        self.services = services or Services(settings)
        self._owns = services is None

    def _caller(self, by: str | None = None) -> Principal:
        # The operator at the lake's own files may do anything a token could.
        return Principal(by or "local", frozenset(SCOPES))

    def ingest(
        self,
        table: str,
        rows: Any,
        *,
        idempotency_key: str | None = None,
        chunk_rows: int | None = None,
        progress: bool = False,
    ) -> dict[str, Any]:
        from service.routers.ingest import ingest_batch

        check_table(table)

        def send(chunk: pa.Table | list[dict[str, Any]], key: str | None) -> dict[str, Any]:
            return _json(ingest_batch(self.services, table, chunk, key))

        return ingest_chunks(
            send,
            table,
            rows,
            idempotency_key=idempotency_key,
            chunk_rows=chunk_rows,
            progress=progress,
        )

    def ingest_embeddings(self, rows: Any, *, model_version: str | None = None) -> dict[str, Any]:
        from service.routers.ingest import embed_batch

        return _json(embed_batch(self.services, rows, model_version))

    def validate(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        from service.routers.snapshots import validate_recipe
        from service.schemas import SnapshotCreate

        body = _body(SnapshotCreate, recipe=recipe_document(recipe))
        return _json(validate_recipe(body, self.services, self._caller()))

    def cut(
        self,
        recipe: Recipe | Mapping[str, Any] | str | Path,
        *,
        new_version: bool = False,
        progress: Progress | bool | None = None,
        executor: str | None = None,
        partitions: int | None = None,
    ) -> dict[str, Any]:
        from materializer.recipe import Recipe as RecipeModel
        from materializer.recipe import load_recipe
        from service.cuts import submit_cut

        model = recipe if isinstance(recipe, RecipeModel) else load_recipe(recipe)
        # In process the caller is the operator: any Ray cluster it names is its own.
        outcome = submit_cut(
            self.services,
            model,
            new_version=new_version,
            owner="local",
            executor=executor,
            partitions=partitions,
            any_cluster=True,
        )
        if outcome.record is not None:
            return self.snapshot(outcome.record.version)
        assert outcome.job is not None
        if callable(progress) or not progress:
            done = wait_for_job(self.job, outcome.job.id, progress or None)
        else:
            with bar("cut", 100, "%", enabled=True) as shown:
                done = wait_for_job(self.job, outcome.job.id, shown.stage)
        return self.snapshot(done["version"])

    def snapshots(self, *, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        from service.routers.snapshots import list_snapshots

        return _json(list_snapshots(self.services, self._caller(), limit=limit, offset=offset))

    def snapshot(self, version: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.services.reader.snapshot_bytes(version))
        return data

    def erasure_marks(self, version: int) -> list[dict[str, Any]]:
        return [m.model_dump(mode="json") for m in self.services.reader.record(version).erasures]

    def diff(self, a: int, b: int, *, max_clips: int = 1000) -> dict[str, Any]:
        from service.routers.snapshots import diff_snapshots

        return _json(diff_snapshots(self.services, self._caller(), a, b, max_clips=max_clips))

    def report(self, version: int) -> dict[str, Any]:
        from service.routers.quality import get_quality

        return get_quality(self.services, self._caller(), version)

    def patch(
        self,
        version: int,
        *,
        reason: str,
        exclude_clip_ids: list[str] | None = None,
        exclude_asset_ids: list[str] | None = None,
        exclude_rows: list[int] | None = None,
        where: str | None = None,
        by: str | None = None,
    ) -> dict[str, Any]:
        from service.routers.snapshots import patch_snapshot
        from service.schemas import PatchCreate

        body = _body(
            PatchCreate,
            reason=reason,
            exclude_clip_ids=exclude_clip_ids or [],
            exclude_asset_ids=exclude_asset_ids or [],
            exclude_rows=exclude_rows or [],
            where=where,
            by=by,
        )
        return _json(patch_snapshot(body, self.services, self._caller(by), version))

    def pin(self, version: int, reason: str, *, by: str | None = None) -> dict[str, Any]:
        from service.routers.snapshots import pin_snapshot
        from service.schemas import PinCreate

        body = _body(PinCreate, reason=reason)
        return _json(pin_snapshot(body, self.services, self._caller(by), version))

    def unpin(self, version: int) -> dict[str, Any]:
        from service.routers.snapshots import unpin_snapshot

        return _json(unpin_snapshot(self.services, self._caller(), version, reason=None))

    def tags(self) -> dict[str, Any]:
        from service.tags import list_tags

        return _json(list_tags(self.services))

    def backfill_tags(self) -> dict[str, Any]:
        from service.tags import backfill_tags

        return _json(backfill_tags(self.services))

    def fit_centroids(
        self,
        embedding_model: str,
        *,
        num_clusters: int | None = None,
        cluster_size: int | None = None,
    ) -> dict[str, Any]:
        from service.dedup import CentroidsCreate, fit_centroids

        body = _body(
            CentroidsCreate,
            embedding_model=embedding_model,
            num_clusters=num_clusters,
            cluster_size=cluster_size,
        )
        return _json(fit_centroids(self.services, body))

    def centroids(
        self,
        embedding_model: str,
        *,
        num_clusters: int | None = None,
        cluster_size: int | None = None,
    ) -> dict[str, Any]:
        from service.dedup import CentroidsCreate, list_centroids

        body = _body(
            CentroidsCreate,
            embedding_model=embedding_model,
            num_clusters=num_clusters,
            cluster_size=cluster_size,
        )
        return _json(list_centroids(self.services, body))

    def sql(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        from service.routers.sql import answer
        from service.schemas import SqlRequest

        body = _body(SqlRequest, query=query, snapshot=snapshot, limit=limit)
        response = answer(self.services, body, True, False, threading.Event())
        data: dict[str, Any] = json.loads(bytes(response.body))
        return data

    def lineage(self, clip_id: str) -> dict[str, Any]:
        from service.routers.lineage import get_clip_lineage

        return _json(get_clip_lineage(self.services, self._caller(), clip_id))

    def step(self, version: int, step: int) -> dict[str, Any]:
        from service.routers.snapshots import get_step

        return _json(get_step(self.services, self._caller(), version, step))

    def jobs(self) -> dict[str, Any]:
        from service.routers.jobs import list_jobs

        return _json(list_jobs(self.services, self._caller(), state=None, kind=None, limit=100))

    def job(self, job_id: str) -> dict[str, Any]:
        from service.routers.jobs import get_job

        return _json(get_job(self.services, self._caller(), job_id))

    def erase(
        self,
        asset_id: str,
        *,
        reason: str = "hard takedown",
        by: str | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        from service.erasure import submit_erasure

        job = submit_erasure(self.services, asset_id, tombstone=False, reason=reason, by=by)
        result: dict[str, Any] = wait_for_job(self.job, job.id, progress)
        return result

    def erasures(self) -> dict[str, Any]:
        from service.routers.erasures import list_all

        return _json(list_all(self.services, self._caller()))

    def erasure(self, erasure_id: str) -> dict[str, Any]:
        from service.erasure import ERASURE_ID_PATTERN
        from service.routers.erasures import get_one

        if not re.fullmatch(ERASURE_ID_PATTERN, erasure_id):
            raise InvalidInput(
                f"{erasure_id!r} is not an erasure id (er_ and 24 hex digits)", field="erasure_id"
            )
        return _json(get_one(self.services, self._caller(), erasure_id))

    def corrupt_members(self) -> dict[str, Any]:
        from service.corrupt_members import list_members

        return list_members(self.services)

    def report_corrupt_member(self, report: dict[str, Any]) -> dict[str, Any]:
        from pydantic import ValidationError

        from service.corrupt_members import CorruptMemberReport, report_member

        try:
            body = CorruptMemberReport.model_validate(report)
        except ValidationError as exc:
            raise InvalidInput(f"not a corrupt-member report: {exc}") from None
        return report_member(self.services, self._caller(), body)

    def maintain(
        self, options: dict[str, Any] | None = None, *, progress: Progress | None = None
    ) -> dict[str, Any]:
        from service.maintenance import submit_maintenance
        from service.routers.maintenance import MaintenanceCreate

        body = _body(MaintenanceCreate, **(options or {}))
        job = submit_maintenance(self.services, body.options(), by=None)
        result: dict[str, Any] = wait_for_job(self.job, job.id, progress)
        return result

    def gc(
        self, options: dict[str, Any] | None = None, *, progress: Progress | None = None
    ) -> dict[str, Any]:
        from service.gc import submit_gc
        from service.routers.maintenance import GcCreate

        body = _body(GcCreate, **(options or {}))
        job = submit_gc(self.services, body.options(), by=None)
        result: dict[str, Any] = wait_for_job(self.job, job.id, progress)
        return result

    def close(self) -> None:
        if self._owns:
            self.services.close()

    def put_object(
        self,
        path: str | Path,
        *,
        sha256: str | None = None,
        progress: bool = False,
        attempts: int = 1,
    ) -> str:
        return upload_file(
            path,
            sha256,
            present=self.has_object,
            put=self._put_object,
            progress=progress,
            attempts=attempts,
            retryable=lambda exc: False,
        )

    def _put_object(self, sha256: str, path: Path, shown: Bar) -> None:
        try:
            put = self.services.catalog.objects.put_file(path, sha256)
        except ChecksumMismatch as exc:
            actual = exc.details.get("actual")
            raise HashMismatch(
                f"the file's SHA-256 is {actual}, not {sha256}; nothing was stored",
                expected=sha256,
                actual=actual,
                size=exc.details.get("size"),
            ) from None
        shown.advance(put.info.size, put.info.size)

    def has_object(self, sha256: str) -> bool:
        from catalog.objects.refs import RefStore

        # The operator holds every scope: eval-only objects are visible.
        return RefStore(self.services.catalog.objects).head(sha256) is not None

    def sql_table(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> pa.Table:
        import pyarrow as pa

        from service.routers.sql import answer
        from service.schemas import SqlRequest

        body = _body(SqlRequest, query=query, snapshot=snapshot, limit=limit)
        response = answer(self.services, body, True, True, threading.Event())
        table: pa.Table = pa.ipc.open_stream(bytes(response.body)).read_all()
        return table

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema(self, table: str | None = None) -> dict[str, Any]:
        from service.table_schemas import table_schema, table_schemas

        return _json(table_schemas() if table is None else table_schema(table))

    def plan(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        from service.routers.plans import plan_recipe
        from service.schemas import SnapshotCreate

        body = _body(SnapshotCreate, recipe=recipe_document(recipe))
        return _json(plan_recipe(body, self.services, self._caller()))

    def drift(
        self,
        filter_name: str,
        version_a: str,
        version_b: str,
        *,
        threshold: float | None = None,
        bins: int = 20,
    ) -> dict[str, Any]:
        from service.routers.drift import get_drift

        # drift_report checks the bounds the route's Query checks over HTTP.
        found = get_drift(
            self.services, self._caller(), filter_name, version_a, version_b, threshold, bins
        )
        return _json(found)

    def reference_slice(self, *, clips: bool = False) -> dict[str, Any]:
        from service.routers.drift import get_reference_slice

        return _json(get_reference_slice(self.services, self._caller(), clips))

    def coverage(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        from service.routers.coverage import coverage_recipe
        from service.schemas import SnapshotCreate

        body = _body(SnapshotCreate, recipe=recipe_document(recipe))
        return _json(coverage_recipe(body, self.services, self._caller()))
