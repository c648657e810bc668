"""The wire format both HTTP clients share: requests as :class:`Call` values, answers
decoded, transport failures named.

:class:`~service.client.HttpClient` (httpx, sync) and :class:`vidlake.AsyncClient`
(httpx, async) differ only in how they send; what a request is (method, path, query,
body, headers) and what an answer means (its JSON, its Arrow stream, the
:class:`~catalog.errors.VidlakeError` an error body names) is built here once, from
pure functions that do no I/O. Nothing here imports a server dependency; httpx and
pyarrow are imported when used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from catalog import errors as _errors
from catalog.errors import VidlakeError
from catalog.table_names import INGEST_ORDER
from service.client_errors import Unreachable, error_from_body
from service.client_transfer import recipe_document

if TYPE_CHECKING:
    import ssl

    import pyarrow as pa

    from materializer.recipe import Recipe

__all__ = [
    "ARROW_STREAM",
    "INGEST_TABLES",
    "Call",
    "answer_error",
    "answer_json",
    "arrow_stream",
    "auth_headers",
    "batch_call",
    "check_table",
    "cut_call",
    "embeddings_call",
    "ingest_path",
    "lineage_path",
    "object_call",
    "object_missing",
    "read_arrow",
    "recipe_call",
    "snapshots_call",
    "sql_call",
    "tls_verify",
    "transient",
    "unreachable",
]

#: The catalog tables a batch may be ingested into, in the order a producer fills them.
INGEST_TABLES = INGEST_ORDER
ARROW_STREAM = "application/vnd.apache.arrow.stream"


@dataclass(frozen=True)
class Call:
    """One request: ``httpx.Client.request(call.method, call.path, **call.kwargs())``."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``httpx`` ``request`` for this call."""
        sent: dict[str, Any] = {"headers": dict(self.headers)}
        if self.params is not None:
            sent["params"] = dict(self.params)
        if self.json is not None:
            sent["json"] = self.json
        if self.content is not None:
            sent["content"] = self.content
        return sent


def tls_verify(url: str) -> ssl.SSLContext | bool:
    """What to give httpx's ``verify`` for a client of ``url``.

    httpx loads the CA bundle when a client is made (tens of ms, a third of a light CLI
    command's start-up), whether or not it ever speaks TLS. A plain ``http://`` server
    never needs it, so such a client gets a verifying context with no CA loaded: it
    makes no TLS connection, and one it were sent to (a redirect is not followed) would
    fail verification, never pass unchecked. An ``https://`` client verifies as usual.
    """
    import ssl

    if url.lower().startswith("http://"):
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return True


def auth_headers(token: str | None) -> dict[str, str]:
    """The headers every request of a client with ``token`` carries."""
    return {"Authorization": f"Bearer {token}"} if token else {}


# -- answers ----------------------------------------------------------------------------
def unreachable(base_url: object, exc: Exception) -> Unreachable:
    """The error for a request that never got an answer (refused, timed out)."""
    return Unreachable(f"cannot reach {base_url}: {exc}", url=str(base_url))


def transient(exc: Exception) -> bool:
    """Whether a failed request may succeed when sent again."""
    if isinstance(exc, Unreachable):
        return True
    return isinstance(exc, VidlakeError) and exc.http_status >= 500


def answer_json(content: bytes) -> Any:
    """An answer's JSON document (None for an empty or non-JSON body)."""
    import json

    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


def answer_error(status: int, content: bytes, text: str) -> VidlakeError | None:
    """The error an answer with ``status`` carries; None for a success (< 400)."""
    if status < 400:
        return None
    return error_from_body(status, answer_json(content), text or "HTTP error")


def read_arrow(content: bytes) -> pa.Table:
    """An Arrow IPC stream answer as a table."""
    import pyarrow as pa

    table: pa.Table = pa.ipc.open_stream(content).read_all()
    return table


def arrow_stream(table: pa.Table) -> bytes:
    """``table`` as the Arrow IPC stream an ingest body carries."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body: bytes = sink.getvalue().to_pybytes()
    return body


# -- requests ---------------------------------------------------------------------------
def check_table(table: str) -> None:
    """Refuse a table a batch cannot be ingested into (before any row is read or sent).

    Raises:
        InvalidInput: ``table`` is not one of :data:`INGEST_TABLES`.
    """
    if table not in INGEST_TABLES:
        raise _errors.InvalidInput(
            f"unknown table {table!r}; one of {', '.join(INGEST_TABLES)}", table=table
        )


def ingest_path(table: str) -> str:
    """The ingest route of ``table`` (checked with :func:`check_table`)."""
    check_table(table)
    return f"/v1/{table.replace('_', '-')}"


def batch_call(path: str, chunk: pa.Table | list[dict[str, Any]], key: str | None) -> Call:
    """One ingest request: an Arrow stream (a list of dicts Arrow cannot type: JSON)."""
    headers = {"Idempotency-Key": key} if key is not None else {}
    if isinstance(chunk, list):
        return Call("POST", path, json=chunk, headers=headers)
    headers["Content-Type"] = ARROW_STREAM
    return Call("POST", path, content=arrow_stream(chunk), headers=headers)


def embeddings_call(rows: Any, model_version: str | None) -> Call:
    """``POST /v1/embeddings`` of ``rows`` (an Arrow table as a stream, else JSON)."""
    import pyarrow as pa

    params = {"model_version": model_version} if model_version is not None else {}
    if not isinstance(rows, pa.Table):
        return Call("POST", "/v1/embeddings", params=params, json=rows)
    headers = {"Content-Type": ARROW_STREAM}
    return Call(
        "POST", "/v1/embeddings", params=params, content=arrow_stream(rows), headers=headers
    )


def recipe_call(action: str, recipe: Recipe | Mapping[str, Any] | str | Path) -> Call:
    """``POST /v1/recipes:<action>`` (validate, plan, coverage) of ``recipe``."""
    return Call("POST", f"/v1/recipes:{action}", json={"recipe": recipe_document(recipe)})


def cut_call(
    recipe: Recipe | Mapping[str, Any] | str | Path,
    *,
    new_version: bool,
    executor: str | None,
    partitions: int | None,
) -> Call:
    """``POST /v1/snapshots``: start a cut job (200 with a version when one exists)."""
    body: dict[str, Any] = {"recipe": recipe_document(recipe), "new_version": new_version}
    if executor is not None:
        body["executor"] = executor
    if partitions is not None:
        body["partitions"] = partitions
    return Call("POST", "/v1/snapshots", json=body)


def snapshots_call(limit: int, offset: int) -> Call:
    """``GET /v1/snapshots``: a page of versions, newest first."""
    return Call("GET", "/v1/snapshots", params={"limit": limit, "offset": offset})


def sql_call(query: str, snapshot: int | None, limit: int | None, *, arrow: bool) -> Call:
    """``POST /v1/sql``; with ``arrow`` the answer is an Arrow stream, else JSON."""
    body: dict[str, Any] = {"query": query}
    if snapshot is not None:
        body["snapshot"] = snapshot
    if limit is not None:
        body["limit"] = limit
    headers = {"Accept": ARROW_STREAM} if arrow else {}
    return Call("POST", "/v1/sql", json=body, headers=headers)


def lineage_path(clip_id: str) -> str:
    """``GET`` path of one clip's lineage."""
    return f"/v1/lineage/clips/{quote(clip_id, safe='')}"


def object_call(sha256: str, size: int) -> tuple[str, dict[str, str]]:
    """The path and headers of ``PUT /v1/objects/{sha256}`` (the body is streamed)."""
    headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
    return f"/v1/objects/{sha256}", headers


def object_missing(status: int, sha256: str) -> bool:
    """Whether ``HEAD /v1/objects/{sha256}``'s ``status`` says it is not stored.

    Raises:
        VidlakeError: any other error status (e.g. Forbidden).
    """
    if status == 404:
        return True
    if status >= 400:
        raise error_from_body(status, None, f"HEAD object {sha256}")
    return False
