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
one file; transfers and errors live in ``client_transfer`` and ``client_errors``, the
requests and answer decoding it shares with :class:`vidlake.AsyncClient` in
``client_wire``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from catalog import errors as _errors
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
    upload_file,
)
from service.client_wire import (
    INGEST_TABLES,
    Call,
    answer_error,
    answer_json,
    auth_headers,
    batch_call,
    check_table,
    cut_call,
    embeddings_call,
    ingest_path,
    lineage_path,
    object_call,
    object_missing,
    read_arrow,
    recipe_call,
    snapshots_call,
    sql_call,
    tls_verify,
    transient,
    unreachable,
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


# -- HTTP -------------------------------------------------------------------------------
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

        self.http = http or httpx.Client(
            base_url=url.rstrip("/"),
            headers=auth_headers(token),
            timeout=timeout,
            verify=tls_verify(url),
        )

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer to one request (an error answer raised as its error)."""
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise unreachable(self.http.base_url, exc) from exc
        error = answer_error(response.status_code, response.content, response.text)
        if error is not None:
            raise error
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return answer_json(self._request(method, path, **kwargs).content)

    def _send(self, call: Call) -> Any:
        """The JSON answer to ``call``."""
        return self._call(call.method, call.path, **call.kwargs())

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
        path = ingest_path(table)

        def send(chunk: pa.Table | list[dict[str, Any]], key: str | None) -> dict[str, Any]:
            result: dict[str, Any] = self._send(batch_call(path, chunk, key))
            return result

        return ingest_chunks(
            send,
            table,
            rows,
            idempotency_key=idempotency_key,
            chunk_rows=chunk_rows,
            progress=progress,
        )

    def ingest_embeddings(self, rows: Any, *, model_version: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._send(embeddings_call(rows, model_version))
        return result

    def validate(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        result: dict[str, Any] = self._send(recipe_call("validate", recipe))
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
        call = cut_call(recipe, new_version=new_version, executor=executor, partitions=partitions)
        job = self._send(call)
        if "id" not in job:  # 200: a published version already has these inputs
            return self.snapshot(job["version"])
        if callable(progress) or not progress:
            done = wait_for_job(self.job, job["id"], progress or None)
        else:
            with bar("cut", 100, "%", enabled=True) as shown:
                done = wait_for_job(self.job, job["id"], shown.stage)
        return self.snapshot(done["version"])

    def snapshots(self, *, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        result: dict[str, Any] = self._send(snapshots_call(limit, offset))
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
        result: dict[str, Any] = self._send(sql_call(query, snapshot, limit, arrow=False))
        return result

    def lineage(self, clip_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", lineage_path(clip_id))
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
            retryable=transient,
        )

    def _put_object(self, sha256: str, path: Path, shown: Bar) -> dict[str, Any]:
        route, headers = object_call(sha256, path.stat().st_size)
        body = file_chunks(path, shown)
        result: dict[str, Any] = self._call("PUT", route, content=body, headers=headers)
        return result

    def has_object(self, sha256: str) -> bool:
        import httpx

        try:
            response = self.http.head(f"/v1/objects/{sha256}")
        except httpx.TransportError as exc:
            raise unreachable(self.http.base_url, exc) from exc
        return not object_missing(response.status_code, sha256)

    def sql_table(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> pa.Table:
        call = sql_call(query, snapshot, limit, arrow=True)
        return read_arrow(self._request(call.method, call.path, **call.kwargs()).content)

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema(self, table: str | None = None) -> dict[str, Any]:
        path = "/v1/schemas" if table is None else f"/v1/schemas/{quote(table, safe='')}"
        result: dict[str, Any] = self._call("GET", path)
        return result

    def plan(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        result: dict[str, Any] = self._send(recipe_call("plan", recipe))
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
        result: dict[str, Any] = self._send(recipe_call("coverage", recipe))
        return result
