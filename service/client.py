"""One client of the vidlake service: the :class:`Client` protocol and its HTTP side.

The CLI talks to a lake through a :class:`Client`, picked once: :class:`HttpClient`
when a server URL is given, else :class:`service.client_local.LocalClient`, which
runs the same service functions the routers run on the embedded catalog. Both answer
with the REST API's JSON documents (``dict``/``list``), and both raise the
:class:`~catalog.errors.VidlakeError` subclass the service would answer with (over
HTTP, rebuilt from the error body by :func:`error_from_body`), so a caller never
needs to know which one it holds.

This module imports httpx and pyarrow only when used, and never FastAPI, DuckDB or
pyiceberg, so that a training node can use the HTTP client alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from catalog import errors as _errors
from catalog.errors import VidlakeError
from catalog.table_names import INGEST_ORDER

if TYPE_CHECKING:
    import httpx

    from materializer.recipe import Recipe

__all__ = [
    "INGEST_TABLES",
    "Client",
    "HttpClient",
    "Progress",
    "RemoteError",
    "Unreachable",
    "check_table",
    "error_from_body",
    "wait_for_job",
]

#: ``progress(stage, fraction)`` of a job being waited for.
Progress = Callable[[str, float], None]

#: The catalog tables a batch may be ingested into, in the order a producer fills them.
INGEST_TABLES = INGEST_ORDER
ARROW_STREAM = "application/vnd.apache.arrow.stream"
_POLL_S = 0.25


class Unreachable(VidlakeError):
    """The server cannot be reached (refused, unresolvable, timed out)."""

    code = "unreachable"
    http_status = 503


class RemoteError(VidlakeError):
    """The server, or a job it ran, failed with an error this client does not know by
    its code (``code`` and ``http_status`` are then the server's)."""

    code = "remote_error"
    http_status = 500


class Client(Protocol):
    """The operations of the vidlake service, as the REST API answers them."""

    def ingest(
        self, table: str, rows: Any, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Ingest one batch into ``table`` (``IngestPublic``)."""
        ...

    def validate(self, recipe: Recipe) -> dict[str, Any]:
        """Check ``recipe`` against the catalog at its pin (``RecipeValidatePublic``)."""
        ...

    def cut(
        self, recipe: Recipe, *, new_version: bool = False, progress: Progress | None = None
    ) -> dict[str, Any]:
        """Cut ``recipe`` (or find the version its inputs made) and wait: snapshot.json."""
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

    def patch(
        self,
        version: int,
        *,
        reason: str,
        exclude_clip_ids: list[str] | None = None,
        exclude_asset_ids: list[str] | None = None,
        by: str | None = None,
    ) -> dict[str, Any]:
        """Publish a patch of ``version`` (``SnapshotPublic`` of the new version)."""
        ...

    def pin(self, version: int, reason: str, *, by: str | None = None) -> dict[str, Any]:
        """Pin a version (``PinPublic``)."""
        ...

    def unpin(self, version: int) -> dict[str, Any]:
        """Unpin a version (``PinPublic``)."""
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


def check_table(table: str) -> None:
    """Refuse a table a batch cannot be ingested into (before any row is read or sent).

    Raises:
        InvalidInput: ``table`` is not one of :data:`INGEST_TABLES`.
    """
    if table not in INGEST_TABLES:
        raise _errors.InvalidInput(
            f"unknown table {table!r}; one of {', '.join(INGEST_TABLES)}", table=table
        )


# -- errors -----------------------------------------------------------------------------
def _known_errors() -> dict[str, type[VidlakeError]]:
    found: dict[str, type[VidlakeError]] = {}
    pending: list[type[VidlakeError]] = [VidlakeError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


_BY_STATUS: dict[int, type[VidlakeError]] = {
    400: _errors.InvalidInput,
    401: _errors.Unauthorized,
    403: _errors.Forbidden,
    404: _errors.NotFound,
    409: _errors.Conflict,
    502: _errors.StorageError,
}
_RESERVED = frozenset({"code", "message", "details", "http_status"})


def error_from_body(status: int | None, body: Any, fallback: str) -> VidlakeError:
    """The error an answer's ``{"error": {"code", "message", "details"}}`` names.

    The class is the one that has ``code`` (else one by ``status``: 4xx a client
    error, else :class:`RemoteError`); the instance keeps the server's ``code`` and
    status, so that ``to_dict()`` repeats the server's body.

    Args:
        status: The HTTP status, or None for a job's recorded error.
        body: The parsed answer (any shape; a non-conforming one gives ``fallback``).
        fallback: The message when the body carries none.
    """
    error = body.get("error", body) if isinstance(body, Mapping) else {}
    error = error if isinstance(error, Mapping) else {}
    code = str(error.get("code") or "")
    message = str(error.get("message") or fallback)
    found = error.get("details")
    details: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    cls = _known_errors().get(code)
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status, _errors.InvalidInput if 400 <= status < 500 else None)
    exc = (cls or RemoteError)(message, **{k: v for k, v in details.items() if k not in _RESERVED})
    exc.details = dict(details)
    if code:
        exc.code = code
    if status is not None:
        exc.http_status = status
    return exc


# -- jobs -------------------------------------------------------------------------------
def wait_for_job(
    get: Callable[[str], Mapping[str, Any]], job_id: str, progress: Progress | None = None
) -> Any:
    """Poll job ``job_id`` with ``get`` until it ends; its result.

    Raises:
        VidlakeError: the job failed: the subclass its recorded error names.
    """
    report = progress or (lambda stage, fraction: None)
    while True:
        state = get(job_id)
        if state.get("stage"):
            report(str(state["stage"]), float(state.get("progress") or 0.0))
        if state["state"] in ("succeeded", "failed"):
            break
        time.sleep(_POLL_S)
    if state["state"] == "failed":
        raise error_from_body(None, state.get("error") or {}, "job failed")
    return state["result"]


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

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach {self.http.base_url}: {exc}", url=str(self.http.base_url)
            ) from exc
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
        if response.status_code >= 400:
            raise error_from_body(response.status_code, body, response.text or "HTTP error")
        return body

    def ingest(
        self, table: str, rows: Any, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        import pyarrow as pa

        check_table(table)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        path = f"/v1/{table.replace('_', '-')}"
        if not isinstance(rows, pa.Table):
            result: dict[str, Any] = self._call("POST", path, json=rows, headers=headers)
            return result
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        headers["Content-Type"] = ARROW_STREAM
        result = self._call("POST", path, content=sink.getvalue().to_pybytes(), headers=headers)
        return result

    def validate(self, recipe: Recipe) -> dict[str, Any]:
        body = {"recipe": json.loads(recipe.to_canonical_json())}
        result: dict[str, Any] = self._call("POST", "/v1/recipes:validate", json=body)
        return result

    def cut(
        self, recipe: Recipe, *, new_version: bool = False, progress: Progress | None = None
    ) -> dict[str, Any]:
        body = {"recipe": json.loads(recipe.to_canonical_json()), "new_version": new_version}
        job = self._call("POST", "/v1/snapshots", json=body)
        if "id" not in job:  # 200: a published version already has these inputs
            return self.snapshot(job["version"])
        return self.snapshot(wait_for_job(self.job, job["id"], progress)["version"])

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

    def patch(
        self,
        version: int,
        *,
        reason: str,
        exclude_clip_ids: list[str] | None = None,
        exclude_asset_ids: list[str] | None = None,
        by: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "exclude_clip_ids": exclude_clip_ids or [],
            "exclude_asset_ids": exclude_asset_ids or [],
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

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
