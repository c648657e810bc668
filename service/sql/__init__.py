"""Read-only SQL over the catalog and the published snapshots.

Two walls stand between a caller's query and anything it should not touch:

1. **sqlglot** (:mod:`service.sql.validate`), before DuckDB sees the text: one
   ``SELECT``, every table reference resolved in its scope to a CTE or an offered
   view, no table functions but ``UNNEST``, no file/settings/extension functions.
2. **DuckDB locked down in a worker process** (:mod:`service.sql.connection`,
   :mod:`service.sql.worker`): an in-memory database that holds only the registered
   views, with no file system, no network, no extensions, every path setting on an
   empty scratch directory and the configuration locked.

Queries run in a pool of worker processes (:mod:`service.sql.pool`) under a hard
wall-clock deadline, a memory cap that also holds for expression evaluation, and a
row and byte cap on the encoded result (:mod:`service.sql.sandbox`,
:mod:`service.sql.results`). The catalog views (:mod:`service.sql.views`) hide eval
material unless the caller has the ``eval`` scope; the unfiltered data is never
registered under any name.
"""

from service.sql.connection import sandbox_connection
from service.sql.pool import SandboxBusy, WorkerPool
from service.sql.results import to_json_rows
from service.sql.sandbox import QueryResult, Sandbox
from service.sql.validate import MAX_QUERY_CHARS, validate_query
from service.sql.views import CATALOG_VIEWS, CatalogViews, Source, View

__all__ = [
    "CATALOG_VIEWS",
    "MAX_QUERY_CHARS",
    "CatalogViews",
    "QueryResult",
    "Sandbox",
    "SandboxBusy",
    "Source",
    "View",
    "WorkerPool",
    "sandbox_connection",
    "to_json_rows",
    "validate_query",
]
