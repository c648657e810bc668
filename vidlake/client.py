"""The public client: :class:`service.client.HttpClient` with SQL answered as a table.

The CLI prints the ``SqlResult`` JSON document :meth:`HttpClient.sql` returns; a
Python user wants rows to compute on, so here :meth:`Client.sql` returns a
``pyarrow.Table`` (the server's Arrow stream) and :meth:`Client.sql_result` the JSON
document (with its pin and truncation flag). Its ingest sends 50,000 rows a request
by default (the CLI's sends a file whole, one commit). Everything else is the HTTP
client's (docs/decisions/018-public-client.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.client import HttpClient
from service.client_transfer import DEFAULT_CHUNK_ROWS, Bar, bar

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Client"]


class Client(HttpClient):
    """A client of a vidlake server: ``Client(url, token=..., timeout=60.0)``.

    Ingest (:meth:`ingest`), object uploads (:meth:`put_object`), recipes
    (:meth:`validate`, :meth:`cut`), versions (:meth:`snapshots`, :meth:`snapshot`,
    :meth:`diff`, :meth:`patch`, :meth:`pin`, :meth:`unpin`, :meth:`step`), SQL
    (:meth:`sql`) and lineage (:meth:`lineage`). Use it as a context manager, or call
    :meth:`close`. :meth:`put_objects` uploads many files in parallel.
    """

    def ingest(
        self,
        table: str,
        rows: Any,
        *,
        idempotency_key: str | None = None,
        chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Ingest ``rows`` (a pyarrow Table, a pandas DataFrame or a list of dicts) into
        ``table``, 50,000 rows a request by default (``chunk_rows=None``: one request,
        all or nothing). Chunk ``i`` of several carries the key
        ``<idempotency_key>.<i>``: rerun an interrupted ingest with the same key and
        ``chunk_rows`` and the committed chunks are replayed, the rest committed.
        ``progress=True`` draws rows and MB/s on stderr."""
        return super().ingest(
            table,
            rows,
            idempotency_key=idempotency_key,
            chunk_rows=chunk_rows,
            progress=progress,
        )

    def put_objects(
        self, paths: Iterable[str | Path], *, workers: int = 8, progress: bool = False
    ) -> dict[str, str]:
        """Upload many files, ``workers`` at a time (each as :meth:`put_object`: hashed,
        skipped when stored, verified); ``{path: sha256}`` in the order given.

        Raises:
            InvalidInput: ``workers`` is below 1.
            VidlakeError: the first upload that failed (the others finish first; a
                rerun skips every file already stored).
        """
        from catalog.errors import InvalidInput

        if workers < 1:
            raise InvalidInput(f"workers must be at least 1, not {workers}", field="workers")
        files = [str(p) for p in paths]
        with (
            bar("upload", len(files), "files", enabled=progress) as shown,
            ThreadPoolExecutor(max_workers=workers) as pool,
        ):
            futures = [pool.submit(self._put_counted, path, shown) for path in files]
        # Every upload has ended (the pool waited for them): raise the first failure.
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        return {path: future.result() for path, future in zip(files, futures, strict=True)}

    def _put_counted(self, path: str, shown: Bar) -> str:
        sha = self.put_object(path)
        shown.advance(1, 0)
        return sha

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
