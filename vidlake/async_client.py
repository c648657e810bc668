"""The async twin of :class:`vidlake.Client` (httpx.AsyncClient), for pipelines that
run many calls at once: ingest several tables, upload objects, query, cut and wait.

    async with AsyncClient(url, token=token) as lake:
        await asyncio.gather(
            lake.ingest("assets", assets, idempotency_key="run-7-assets"),
            lake.put_objects(latent_files),
        )
        snapshot = await lake.cut("recipe.yaml")

Each call builds its request and reads its answer with the same pure helpers the sync
client uses (:mod:`service.client_wire`, :mod:`service.client_transfer`,
:mod:`service.client_errors`), so both send the same bytes and raise the same
:class:`~catalog.errors.VidlakeError` subclasses; only the sending is awaited. File
hashing runs in a worker thread, so an upload does not stall the event loop. It
covers what a pipeline does concurrently (ingest, objects, SQL, versions, cuts,
lineage); the rest of the API is on :class:`vidlake.Client`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.client_errors import POLL_S, Progress, job_ended, job_result
from service.client_transfer import (
    DEFAULT_CHUNK_ROWS,
    UPLOAD_CHUNK,
    Bar,
    bar,
    chunk_nbytes,
    combine,
    plan_chunks,
    retry_delay,
    upload_source,
)
from service.client_wire import (
    Call,
    answer_error,
    answer_json,
    auth_headers,
    batch_call,
    cut_call,
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

__all__ = ["AsyncClient"]


class AsyncClient:
    """An async client of a vidlake server: ``AsyncClient(url, token=..., timeout=60.0)``.

    Args:
        url: The server, e.g. ``http://127.0.0.1:8321``.
        token: A bearer token (omit for an open, loopback-only server).
        timeout: Seconds for connecting and for each read.
        http: An ``httpx.AsyncClient`` to send requests with instead (tests); ``url``
            and ``token`` are then ignored.

    Use it as ``async with``, or ``await`` :meth:`aclose`.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        import httpx

        self.http = http or httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers=auth_headers(token),
            timeout=timeout,
            verify=tls_verify(url),
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self.http.aclose()

    # -- sending ------------------------------------------------------------------------
    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer to one request (an error answer raised as its error)."""
        import httpx

        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise unreachable(self.http.base_url, exc) from exc
        error = answer_error(response.status_code, response.content, response.text)
        if error is not None:
            raise error
        return response

    async def _send(self, call: Call) -> Any:
        """The JSON answer to ``call``."""
        response = await self._request(call.method, call.path, **call.kwargs())
        return answer_json(response.content)

    async def _document(self, call: Call) -> dict[str, Any]:
        result: dict[str, Any] = await self._send(call)
        return result

    # -- ingest -------------------------------------------------------------------------
    async def ingest(
        self,
        table: str,
        rows: Any,
        *,
        idempotency_key: str | None = None,
        chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Ingest ``rows`` (a pyarrow Table, a pandas DataFrame or a list of dicts) into
        ``table``, as :meth:`vidlake.Client.ingest` does: 50,000 rows a request by
        default, chunk ``i`` of several keyed ``<idempotency_key>.<i>``, the chunks of
        one ingest sent in order (run several ingests at once for concurrency).

        Raises:
            InvalidInput: an unknown table, ``chunk_rows`` below 1, or ``rows`` not a batch.
            VidlakeError: a chunk failed (those before it are committed; rerun with the
                same key and ``chunk_rows`` to finish).
        """
        path = ingest_path(table)
        total, planned = plan_chunks(rows, idempotency_key=idempotency_key, chunk_rows=chunk_rows)
        results: list[dict[str, Any]] = []
        with bar(f"ingest {table}", total, "rows", enabled=progress) as shown:
            for chunk, key in planned:
                results.append(await self._document(batch_call(path, chunk, key)))
                shown.advance(len(chunk), chunk_nbytes(chunk))
        return combine(table, idempotency_key, results)

    # -- objects ------------------------------------------------------------------------
    async def has_object(self, sha256: str) -> bool:
        """Whether object ``sha256`` is stored (and visible to this caller)."""
        import httpx

        try:
            response = await self.http.head(f"/v1/objects/{sha256}")
        except httpx.TransportError as exc:
            raise unreachable(self.http.base_url, exc) from exc
        return not object_missing(response.status_code, sha256)

    async def put_object(
        self,
        path: str | Path,
        *,
        sha256: str | None = None,
        progress: bool = False,
        attempts: int = 3,
    ) -> str:
        """Upload the file ``path`` (hashed in a thread; sent, streamed, only when the
        server lacks it; verified there); its SHA-256. A transient failure (unreachable,
        a 5xx) is retried, ``attempts`` in all.

        Raises:
            NotFound: no file at ``path``.
            HashMismatch: the file's bytes are not ``sha256`` (nothing was stored).
            Forbidden: the token lacks the write scope.
        """
        from catalog.hashing import sha256_file

        source = upload_source(path)
        digest = sha256 or (await asyncio.to_thread(sha256_file, source))[0]
        size = source.stat().st_size
        for attempt in range(1, attempts + 1):
            if await self.has_object(digest):
                return digest
            try:
                with bar(f"upload {source.name}", size, "bytes", enabled=progress) as shown:
                    await self._put(digest, source, size, shown)
                return digest
            except Exception as exc:
                if attempt == attempts or not transient(exc):
                    raise
                await asyncio.sleep(retry_delay(attempt))
        return digest

    async def _put(self, sha256: str, source: Path, size: int, shown: Bar) -> None:
        route, headers = object_call(sha256, size)
        await self._request("PUT", route, content=_file_chunks(source, shown), headers=headers)

    async def put_objects(
        self, paths: Iterable[str | Path], *, workers: int = 8, progress: bool = False
    ) -> dict[str, str]:
        """Upload many files, ``workers`` at a time (each as :meth:`put_object`);
        ``{path: sha256}`` in the order given.

        Raises:
            InvalidInput: ``workers`` is below 1.
            VidlakeError: the first upload that failed (the others finish first; a
                rerun skips every file already stored).
        """
        from catalog.errors import InvalidInput

        if workers < 1:
            raise InvalidInput(f"workers must be at least 1, not {workers}", field="workers")
        files = [str(p) for p in paths]
        gate = asyncio.Semaphore(workers)

        async def one(path: str, shown: Bar) -> str:
            async with gate:
                sha = await self.put_object(path)
            shown.advance(1, 0)
            return sha

        with bar("upload", len(files), "files", enabled=progress) as shown:
            done = await asyncio.gather(*(one(p, shown) for p in files), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
        return {path: str(sha) for path, sha in zip(files, done, strict=True)}

    # -- SQL ----------------------------------------------------------------------------
    async def sql(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> pa.Table:
        """Run one read-only query (on the catalog state version ``snapshot`` was cut
        from, else the latest; at most ``limit`` rows); its rows as an Arrow table."""
        call = sql_call(query, snapshot, limit, arrow=True)
        response = await self._request(call.method, call.path, **call.kwargs())
        return read_arrow(response.content)

    async def sql_result(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """Run one read-only query; the ``SqlResult`` JSON document."""
        return await self._document(sql_call(query, snapshot, limit, arrow=False))

    # -- recipes, cuts and versions -----------------------------------------------------
    async def validate(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """Check a recipe (a ``Recipe``, a mapping, YAML/JSON text or a file path)
        against the catalog at its pin (``RecipeValidatePublic``)."""
        return await self._document(recipe_call("validate", recipe))

    async def plan(self, recipe: Recipe | Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """A dry run of a cut (``PlanPublic``); publishes nothing."""
        return await self._document(recipe_call("plan", recipe))

    async def cut(
        self,
        recipe: Recipe | Mapping[str, Any] | str | Path,
        *,
        new_version: bool = False,
        progress: Progress | None = None,
        executor: str | None = None,
        partitions: int | None = None,
    ) -> dict[str, Any]:
        """Cut ``recipe`` (or find the version its inputs made) and wait for its job,
        polling without blocking the loop (``progress(stage, fraction)`` on each poll);
        the published version's snapshot.json.

        Raises:
            InvalidRecipe: the recipe does not fit the catalog.
            VidlakeError: the job failed: the subclass its recorded error names.
        """
        call = cut_call(recipe, new_version=new_version, executor=executor, partitions=partitions)
        job = await self._document(call)
        if "id" not in job:  # 200: a published version already has these inputs
            return await self.snapshot(job["version"])
        done = await self.wait_for_job(job["id"], progress)
        return await self.snapshot(done["version"])

    async def wait_for_job(self, job_id: str, progress: Progress | None = None) -> Any:
        """Poll job ``job_id`` until it ends; its result.

        Raises:
            VidlakeError: the job failed: the subclass its recorded error names.
        """
        while not job_ended(state := await self.job(job_id), progress):
            await asyncio.sleep(POLL_S)
        return job_result(state)

    async def job(self, job_id: str) -> dict[str, Any]:
        """One background job (``JobPublic``)."""
        return await self._document(Call("GET", f"/v1/jobs/{job_id}"))

    async def snapshots(self, *, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        """A page of versions, newest first (``SnapshotsPublic``)."""
        return await self._document(snapshots_call(limit, offset))

    async def snapshot(self, version: int) -> dict[str, Any]:
        """A version's snapshot.json."""
        return await self._document(Call("GET", f"/v1/snapshots/{version}"))

    async def lineage(self, clip_id: str) -> dict[str, Any]:
        """Everything about one clip (``ClipLineage``)."""
        return await self._document(Call("GET", lineage_path(clip_id)))


async def _file_chunks(path: Path, shown: Bar) -> AsyncIterator[bytes]:
    """``path``'s bytes, :data:`UPLOAD_CHUNK` at a time (read in a thread), counted."""
    f = await asyncio.to_thread(open, path, "rb")
    try:
        while chunk := await asyncio.to_thread(f.read, UPLOAD_CHUNK):
            shown.advance(len(chunk), len(chunk))
            yield chunk
    finally:
        f.close()
