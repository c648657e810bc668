"""The public client: :class:`service.client.HttpClient` with SQL answered as a table.

The CLI prints the ``SqlResult`` JSON document :meth:`HttpClient.sql` returns; a
Python user wants rows to compute on, so here :meth:`Client.sql` returns a
``pyarrow.Table`` (the server's Arrow stream) and :meth:`Client.sql_result` the JSON
document (with its pin and truncation flag). Everything else is the HTTP client's
(docs/decisions/001-pyclient-public-client.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.client import HttpClient

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Client"]


class Client(HttpClient):
    """A client of a vidlake server: ``Client(url, token=..., timeout=60.0)``.

    Ingest (:meth:`ingest`), object uploads (:meth:`put_object`), recipes
    (:meth:`validate`, :meth:`cut`), versions (:meth:`snapshots`, :meth:`snapshot`,
    :meth:`diff`, :meth:`patch`, :meth:`pin`, :meth:`unpin`, :meth:`step`), SQL
    (:meth:`sql`) and lineage (:meth:`lineage`). Use it as a context manager, or call
    :meth:`close`.
    """

    def sql(  # type: ignore[override]  # a table here; the CLI's HttpClient keeps JSON
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> pa.Table:
        """Run one read-only query (on the catalog state version ``snapshot`` was cut
        from, else the latest; at most ``limit`` rows); its rows as an Arrow table."""
        return self.sql_table(query, snapshot=snapshot, limit=limit)

    def sql_result(
        self, query: str, *, snapshot: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """Run one read-only query; the ``SqlResult`` JSON document (columns, rows,
        ``truncated``, the pin it read)."""
        return super().sql(query, snapshot=snapshot, limit=limit)

    def __enter__(self) -> Client:
        return self
