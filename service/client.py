"""One client of the vidlake service: the :class:`Client` protocol and its HTTP side.

The CLI talks to a lake through a :class:`Client`, picked once: :class:`HttpClient`
when a server URL is given, else :class:`service.client_local.LocalClient`, which
runs the same service functions the routers run on the embedded catalog. Both answer
with the REST API's JSON documents (``dict``/``list``), and both raise the
:class:`~catalog.errors.VidlakeError` subclass the service would answer with (over
HTTP, rebuilt from the error body by :func:`error_from_body`), so a caller never
needs to know which one it holds.

Batches go in chunks of rows with per-chunk idempotency keys, objects are uploaded
once (:mod:`service.client_transfer`). This module imports httpx and pyarrow only
when used, and never FastAPI, DuckDB or pyiceberg, so that a training node can use
the HTTP client alone (``from vidlake import Client`` is this class, SQL as a table).

Why this module is over 500 lines: the :class:`Client` protocol and :class:`HttpClient`
stand side by side, method for method, so a reader checks one against the other in
one file; transfers and errors live in ``client_transfer`` and ``client_errors``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from catalog import errors as _errors
from catalog.errors import VidlakeError
from catalog.table_names import INGEST_ORDER
from service.client_errors import (
    HashMismatch,
    Progress,
    RemoteError,
    Unreachable,
    error_from_body,
    wait_for_job,
)
from service.client_transfer import (
    Bar,
    bar,
    file_chunks,
    ingest_chunks,
    recipe_document,
    upload_file,
)

if TYPE_CHECKING:
    import httpx
    import pyarrow as pa

    from materializer.recipe import Recipe

__all__ = [
    "INGEST_TABLES",
    "Client",
    "HashMismatch",
    "HttpClient",
    "Progress",
    "RemoteError",
    "Unreachable",
    "check_table",
    "error_from_body",
    "wait_for_job",
]

#: The catalog tables a batch may be ingested into, in the order a producer fills them.
INGEST_TABLES = INGEST_ORDER
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class Client(Protocol):
    """The operations of the vidlake service, as the REST API answers them."""

    def ingest(
        self,
        table: str,
        rows: Any,
        *,
        idempotency_key: str | None = None,
        chunk_rows: int | None = None,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Ingest a batch into ``table``, ``chunk_rows`` rows a request (``IngestPublic``;
        for several chunks their sums and each one's, :func:`~service.client_transfer.combine`)."""
        ...

    def ingest_embeddings(self, rows: Any, *, model_version: str | None = None) -> dict[str, Any]:
        """Add clip embeddings (``{clip_id, vector, model_version?}`` rows or an Arrow
        table) to LanceDB; ``model_version`` for rows that name none (``IngestPublic``)."""
        ...

    def validate(self, recipe: Recipe) -> dict[str, Any]:
        """Check ``recipe`` against the catalog at its pin (``RecipeValidatePublic``)."""
        ...

    def cut(
        self,
        recipe: Recipe,
        *,
        new_version: bool = False,
        progress: Progress | None = None,
        executor: str | None = None,
        partitions: int | None = None,
    ) -> dict[str, Any]:
        """Cut ``recipe`` (or find the version its inputs made) and wait: snapshot.json.
        ``executor`` and ``partitions`` say where the selection runs (the server's
        settings when None); the artifacts do not depend on them."""
        ...

    def snapshots(self, *, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        """A page of versions, newest first (``SnapshotsPublic``)."""
        ...

    def snapshot(self, version: int) -> dict[str, Any]:
        """A version's snapshot.json."""
        ...

    def erasure_marks(self, version: int) -> list[dict[str, Any]]:
        """A version's erasure marks, oldest first (the latest names its current
        artifacts); over HTTP only the latest, which the server serves."""
        ...

    def diff(self, a: int, b: int, *, max_clips: int = 1000) -> dict[str, Any]:
        """What changed from version ``a`` to ``b`` (``DiffPublic``)."""
        ...

    def report(self, version: int) -> dict[str, Any]:
        """A version's plan quality report (``quality.json``); NotFound for an unknown
        version or one without a report (``details.reason == "no_quality_report"``)."""
        ...

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
        """Publish a patch of ``version`` (``SnapshotPublic`` of the new version): skip
        the given clips, assets, manifest rows and rows matching ``where`` (a predicate
        over ``manifest.parquet``'s columns)."""
        ...

    def pin(self, version: int, reason: str, *, by: str | None = None) -> dict[str, Any]:
        """Pin a version (``PinPublic``)."""
        ...

    def unpin(self, version: int) -> dict[str, Any]:
        """Unpin a version (``PinPublic``)."""
        ...

    def tags(self) -> dict[str, Any]:
        """Every table's version tags (``TagsPublic``)."""
        ...

    def backfill_tags(self) -> dict[str, Any]:
        """Tag every registered version's snapshots (``TagsBackfillPublic``)."""
        ...

    def fit_centroids(
        self,
        embedding_model: str,
        *,
        num_clusters: int | None = None,
        cluster_size: int | None = None,
    ) -> dict[str, Any]:
        """Fit a new semantic-dedup centroid version (``CentroidsPublic``)."""
        ...

    def centroids(
        self,
        embedding_model: str,
        *,
        num_clusters: int | None = None,
        cluster_size: int | None = None,
    ) -> dict[str, Any]:
        """The fitted centroid versions of one family (``CentroidsVersions``)."""
        ...

    def sql(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """Run one read-only query (``SqlResult``)."""
        ...

    def lineage(self, clip_id: str) -> dict[str, Any]:
        """Everything about one clip (``ClipLineage``)."""
        ...

    def step(self, version: int, step: int) -> dict[str, Any]:
        """The samples of one step (``StepPublic``)."""
        ...

    def jobs(self) -> dict[str, Any]:
        """Background jobs, newest first (``JobsPublic``)."""
        ...

    def job(self, job_id: str) -> dict[str, Any]:
        """One background job (``JobPublic``)."""
        ...

    def erase(
        self,
        asset_id: str,
        *,
        reason: str = "hard takedown",
        by: str | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Erase a hard-tombstoned asset's bytes and wait (``ErasurePublic``)."""
        ...

    def erasures(self) -> dict[str, Any]:
        """Every erasure (``ErasuresPublic``)."""
        ...

    def erasure(self, erasure_id: str) -> dict[str, Any]:
        """One erasure (``ErasurePublic``)."""
        ...

    def corrupt_members(self) -> dict[str, Any]:
        """Latent members recorded as corrupt: ``{"members": [sha256, …]}``."""
        ...

    def report_corrupt_member(self, report: dict[str, Any]) -> dict[str, Any]:
        """Report a corrupt member (``CorruptMemberReport``); recorded only when the
        lake's own read of it fails (Conflict when it verifies)."""
        ...

    def maintain(
        self, options: dict[str, Any] | None = None, *, progress: Progress | None = None
    ) -> dict[str, Any]:
        """Run lake maintenance and wait for its report; ``options`` as
        ``MaintenanceCreate``."""
        ...

    def gc(
        self, options: dict[str, Any] | None = None, *, progress: Progress | None = None
    ) -> dict[str, Any]:
        """Find (with ``apply``, delete) crash debris and wait for the report;
        ``options`` as ``GcCreate``."""
        ...

    def close(self) -> None:
        """Release what the client holds (connections, the embedded catalog)."""
        ...

    def put_object(
        self, path: str | Path, *, sha256: str | None = None, progress: bool = False
    ) -> str:
        """Store the file ``path`` (unless stored already); its SHA-256."""
        ...

    def has_object(self, sha256: str) -> bool:
        """Whether object ``sha256`` is stored (and visible to this caller)."""
        ...

    def sql_table(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> pa.Table:
        """Run one read-only query; its rows as an Arrow table."""
        ...

    def schema(self, table: str | None = None) -> dict[str, Any]:
        """One table's columns (``TablePublic``), or every table (``TablesPublic``)."""
        ...

    def plan(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """A dry run of a cut (``PlanPublic``): what it would select and plan; publishes
        nothing."""
        ...

    def drift(
        self,
        filter_name: str,
        version_a: str,
        version_b: str,
        *,
        threshold: float | None = None,
        bins: int = 20,
    ) -> dict[str, Any]:
        """Two versions of a filter on the reference slice (``DriftPublic``)."""
        ...

    def reference_slice(self, *, clips: bool = False) -> dict[str, Any]:
        """The reference slice's asset ids, and its clip ids with ``clips``
        (``ReferenceSlicePublic``)."""
        ...

    def coverage(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """Backfill coverage of the recipe's score and caption versions (``CoveragePublic``)."""
        ...


def check_table(table: str) -> None:
    """Refuse a table a batch cannot be ingested into (before any row is read or sent).

    Raises:
        InvalidInput: ``table`` is not one of :data:`INGEST_TABLES`.
    """
    if table not in INGEST_TABLES:
        raise _errors.InvalidInput(
            f"unknown table {table!r}; one of {', '.join(INGEST_TABLES)}", table=table
        )


# -- HTTP -------------------------------------------------------------------------------
def _transient(exc: Exception) -> bool:
    """Whether a failed request may succeed when sent again."""
    if isinstance(exc, Unreachable):
        return True
    return isinstance(exc, VidlakeError) and exc.http_status >= 500


class HttpClient:
    """A :class:`Client` of a running server (httpx, sync).

    Args:
        url: The server, e.g. ``http://127.0.0.1:8080``.
        token: A bearer token (omit for an open, loopback-only server).
        timeout: Seconds for connecting and for each read.
        http: An httpx client to send requests with instead (tests); ``url`` and
            ``token`` are then ignored.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer to one request (an error answer raised as its error)."""
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach {self.http.base_url}: {exc}", url=str(self.http.base_url)
            ) from exc
        if response.status_code >= 400:
            try:
                body = response.json() if response.content else None
            except ValueError:
                body = None
            raise error_from_body(response.status_code, body, response.text or "HTTP error")
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        try:
            return response.json() if response.content else None
        except ValueError:
            return None

    def ingest(
        self,
        table: str,
        rows: Any,
        *,
        idempotency_key: str | None = None,
        chunk_rows: int | None = None,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Ingest ``rows`` (a pyarrow Table, a pandas DataFrame or a list of dicts) into
        ``table`` as Arrow IPC, ``chunk_rows`` rows a request (None: one request, one
        commit); chunk ``i`` of several carries the key ``<idempotency_key>.<i>``, so
        that a retry with the same key finishes an interrupted ingest without
        duplicates."""
        check_table(table)
        path = f"/v1/{table.replace('_', '-')}"

        def send(chunk: pa.Table | list[dict[str, Any]], key: str | None) -> dict[str, Any]:
            return self._send_batch(path, chunk, key)

        return ingest_chunks(
            send,
            table,
            rows,
            idempotency_key=idempotency_key,
            chunk_rows=chunk_rows,
            progress=progress,
        )

    def _send_batch(
        self, path: str, chunk: pa.Table | list[dict[str, Any]], key: str | None
    ) -> dict[str, Any]:
        import pyarrow as pa

        headers = {"Idempotency-Key": key} if key is not None else {}
        if not isinstance(chunk, pa.Table):
            result: dict[str, Any] = self._call("POST", path, json=chunk, headers=headers)
            return result
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, chunk.schema) as writer:
            writer.write_table(chunk)
        headers["Content-Type"] = ARROW_STREAM
        result = self._call("POST", path, content=sink.getvalue().to_pybytes(), headers=headers)
        return result

    def ingest_embeddings(self, rows: Any, *, model_version: str | None = None) -> dict[str, Any]:
        import pyarrow as pa

        params = {"model_version": model_version} if model_version is not None else {}
        if not isinstance(rows, pa.Table):
            result: dict[str, Any] = self._call("POST", "/v1/embeddings", json=rows, params=params)
            return result
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        result = self._call(
            "POST",
            "/v1/embeddings",
            content=sink.getvalue().to_pybytes(),
            headers={"Content-Type": ARROW_STREAM},
            params=params,
        )
        return result

    def validate(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        body = {"recipe": recipe_document(recipe)}
        result: dict[str, Any] = self._call("POST", "/v1/recipes:validate", json=body)
        return result

    def cut(
        self,
        recipe: Recipe | Mapping[str, Any] | str | Path,
        *,
        new_version: bool = False,
        progress: Progress | bool | None = None,
        executor: str | None = None,
        partitions: int | None = None,
    ) -> dict[str, Any]:
        """Cut ``recipe`` and wait for its job (``progress``: a callback, or True for a
        bar); the published version's snapshot.json."""
        body: dict[str, Any] = {"recipe": recipe_document(recipe), "new_version": new_version}
        if executor is not None:
            body["executor"] = executor
        if partitions is not None:
            body["partitions"] = partitions
        job = self._call("POST", "/v1/snapshots", json=body)
        if "id" not in job:  # 200: a published version already has these inputs
            return self.snapshot(job["version"])
        if callable(progress) or not progress:
            done = wait_for_job(self.job, job["id"], progress or None)
        else:
            with bar("cut", 100, "%", enabled=True) as shown:
                done = wait_for_job(self.job, job["id"], shown.stage)
        return self.snapshot(done["version"])

    def snapshots(self, *, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        params = {"limit": limit, "offset": offset}
        result: dict[str, Any] = self._call("GET", "/v1/snapshots", params=params)
        return result

    def snapshot(self, version: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/snapshots/{version}")
        return result

    def erasure_marks(self, version: int) -> list[dict[str, Any]]:
        try:
            mark: dict[str, Any] = self._call("GET", f"/v1/snapshots/{version}/erasure")
        except _errors.NotFound:
            self.snapshot(version)  # a NotFound of the version itself is the caller's
            return []
        return [mark]

    def diff(self, a: int, b: int, *, max_clips: int = 1000) -> dict[str, Any]:
        params = {"max_clips": max_clips}
        result: dict[str, Any] = self._call("GET", f"/v1/snapshots/{a}/diff/{b}", params=params)
        return result

    def report(self, version: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/snapshots/{version}/quality")
        return result

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
        body = {
            "exclude_clip_ids": exclude_clip_ids or [],
            "exclude_asset_ids": exclude_asset_ids or [],
            "exclude_rows": exclude_rows or [],
            "where": where,
            "reason": reason,
            "by": by,
        }
        result: dict[str, Any] = self._call("POST", f"/v1/snapshots/{version}/patch", json=body)
        return result

    def pin(self, version: int, reason: str, *, by: str | None = None) -> dict[str, Any]:
        # The server records its caller (the token's name) as the pinner.
        result: dict[str, Any] = self._call(
            "POST", f"/v1/snapshots/{version}/pin", json={"reason": reason}
        )
        return result

    def unpin(self, version: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", f"/v1/snapshots/{version}/pin")
        return result

    def tags(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/tags")
        return result

    def backfill_tags(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/v1/tags/backfill")
        return result

    def fit_centroids(
        self,
        embedding_model: str,
        *,
        num_clusters: int | None = None,
        cluster_size: int | None = None,
    ) -> dict[str, Any]:
        body = {
            "embedding_model": embedding_model,
            "num_clusters": num_clusters,
            "cluster_size": cluster_size,
        }
        result: dict[str, Any] = self._call("POST", "/v1/dedup/centroids", json=body)
        return result

    def centroids(
        self,
        embedding_model: str,
        *,
        num_clusters: int | None = None,
        cluster_size: int | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"embedding_model": embedding_model}
        if num_clusters is not None:
            params["num_clusters"] = num_clusters
        if cluster_size is not None:
            params["cluster_size"] = cluster_size
        result: dict[str, Any] = self._call("GET", "/v1/dedup/centroids", params=params)
        return result

    def sql(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"query": query}
        if snapshot is not None:
            body["snapshot"] = snapshot
        if limit is not None:
            body["limit"] = limit
        result: dict[str, Any] = self._call("POST", "/v1/sql", json=body)
        return result

    def lineage(self, clip_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/lineage/clips/{clip_id}")
        return result

    def step(self, version: int, step: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/snapshots/{version}/steps/{step}")
        return result

    def jobs(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/jobs")
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}")
        return result

    def erase(
        self,
        asset_id: str,
        *,
        reason: str = "hard takedown",
        by: str | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        # The server records its caller (the token's name) as the requester.
        job = self._call("POST", "/v1/erasures", json={"asset_id": asset_id, "reason": reason})
        result: dict[str, Any] = wait_for_job(self.job, job["id"], progress)
        return result

    def erasures(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/erasures")
        return result

    def erasure(self, erasure_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/erasures/{erasure_id}")
        return result

    def corrupt_members(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/corrupt-members")
        return result

    def report_corrupt_member(self, report: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/v1/corrupt-members", json=report)
        return result

    def maintain(
        self, options: dict[str, Any] | None = None, *, progress: Progress | None = None
    ) -> dict[str, Any]:
        job = self._call("POST", "/v1/maintenance", json=options or {})
        result: dict[str, Any] = wait_for_job(self.job, job["id"], progress)
        return result

    def gc(
        self, options: dict[str, Any] | None = None, *, progress: Progress | None = None
    ) -> dict[str, Any]:
        job = self._call("POST", "/v1/gc", json=options or {})
        result: dict[str, Any] = wait_for_job(self.job, job["id"], progress)
        return result

    def close(self) -> None:
        self.http.close()

    def put_object(
        self,
        path: str | Path,
        *,
        sha256: str | None = None,
        progress: bool = False,
        attempts: int = 3,
    ) -> str:
        """Upload the file ``path`` with ``PUT /v1/objects/{sha256}``; its SHA-256.

        The file is hashed, then sent (streamed) only when ``HEAD`` does not find it,
        and the server verifies the bytes against the hash. An attempt that fails in
        transit (unreachable, a 5xx) is retried, ``attempts`` in all.

        Raises:
            NotFound: no file at ``path``.
            HashMismatch: the file changed while it was sent (nothing was stored).
            Forbidden: the token lacks the write scope.
        """
        return upload_file(
            path,
            sha256,
            present=self.has_object,
            put=self._put_object,
            progress=progress,
            attempts=attempts,
            retryable=_transient,
        )

    def _put_object(self, sha256: str, path: Path, shown: Bar) -> dict[str, Any]:
        size = path.stat().st_size
        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        body = file_chunks(path, shown)
        result: dict[str, Any] = self._call(
            "PUT", f"/v1/objects/{sha256}", content=body, headers=headers
        )
        return result

    def has_object(self, sha256: str) -> bool:
        import httpx

        try:
            response = self.http.head(f"/v1/objects/{sha256}")
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach {self.http.base_url}: {exc}", url=str(self.http.base_url)
            ) from exc
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            raise error_from_body(response.status_code, None, f"HEAD object {sha256}")
        return True

    def sql_table(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> pa.Table:
        import pyarrow as pa

        body: dict[str, Any] = {"query": query}
        if snapshot is not None:
            body["snapshot"] = snapshot
        if limit is not None:
            body["limit"] = limit
        response = self._request("POST", "/v1/sql", json=body, headers={"Accept": ARROW_STREAM})
        table: pa.Table = pa.ipc.open_stream(response.content).read_all()
        return table

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema(self, table: str | None = None) -> dict[str, Any]:
        path = "/v1/schemas" if table is None else f"/v1/schemas/{quote(table, safe='')}"
        result: dict[str, Any] = self._call("GET", path)
        return result

    def plan(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        body = {"recipe": recipe_document(recipe)}
        result: dict[str, Any] = self._call("POST", "/v1/recipes:plan", json=body)
        return result

    def drift(
        self,
        filter_name: str,
        version_a: str,
        version_b: str,
        *,
        threshold: float | None = None,
        bins: int = 20,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"a": version_a, "b": version_b, "bins": bins}
        if threshold is not None:
            params["threshold"] = threshold
        path = f"/v1/drift/{quote(filter_name, safe='')}"
        result: dict[str, Any] = self._call("GET", path, params=params)
        return result

    def reference_slice(self, *, clips: bool = False) -> dict[str, Any]:
        params = {"clips": "true"} if clips else {}
        result: dict[str, Any] = self._call("GET", "/v1/reference-slice", params=params)
        return result

    def coverage(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        body = {"recipe": recipe_document(recipe)}
        result: dict[str, Any] = self._call("POST", "/v1/recipes:coverage", json=body)
        return result
