"""The Iceberg backends behind a catalog: connecting, the warehouse, the namespace.

:func:`connect` turns a :class:`~catalog.config.CatalogConfig` into a pyiceberg catalog
(SQLite — in WAL mode, every connection with a busy timeout, so several processes can
ingest into one file —, PostgreSQL, or an Iceberg REST catalog) whose FileIO has the
warehouse's S3 properties (:func:`io_properties`). :func:`freeze_namespace` creates
the namespace with the eval carve-out settings on first open and checks them on
every later one. :func:`load_table` loads one table, translating the backend's errors
(:data:`BACKEND_ERRORS`) to :class:`~catalog.errors.StorageError` once, here.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    RESTError,
)
from pyiceberg.table import Table
from sqlalchemy.exc import SQLAlchemyError

from catalog import rules, table_cache
from catalog.config import CatalogConfig
from catalog.errors import Conflict, InvalidInput, NotFound, StorageError

__all__ = [
    "BACKEND_ERRORS",
    "DEFAULT_EVAL_FRACTION",
    "PROP_CREATED_AT",
    "PROP_EVAL_FRACTION",
    "PROP_EVAL_SALT",
    "connect",
    "freeze_namespace",
    "io_properties",
    "load_table",
]

PROP_EVAL_FRACTION = "vidlake.eval-fraction"
PROP_EVAL_SALT = "vidlake.eval-salt"
PROP_CREATED_AT = "vidlake.created-at"
DEFAULT_EVAL_FRACTION = 0.02
_SQLITE_BUSY_MS = 60_000

#: The backends' own failures, translated to StorageError at this boundary.
BACKEND_ERRORS: tuple[type[Exception], ...] = (OSError, SQLAlchemyError, RESTError)
_CREATE_RACES: tuple[type[Exception], ...] = (*BACKEND_ERRORS, NamespaceAlreadyExistsError)


def load_table(iceberg: Catalog, namespace: str, name: str) -> Table:
    """Table ``name`` of ``namespace``, with fresh metadata (on a SQL catalog, parsed
    again only when its catalog row moved: :mod:`catalog.table_cache`).

    Raises:
        NotFound: The table is missing.
        StorageError: The backend failed.
    """
    try:
        if isinstance(iceberg, SqlCatalog):
            return table_cache.load(iceberg, namespace, name)
        return iceberg.load_table((namespace, name))
    except NoSuchTableError as exc:
        raise NotFound(f"table {name!r} is missing from the catalog", table=name) from exc
    except BACKEND_ERRORS as exc:
        raise StorageError(f"loading table {name} failed: {exc}", table=name) from exc


def _warehouse(location: str) -> str:
    """A warehouse location pyiceberg understands; a local directory is created."""
    if "://" in location and not location.startswith("file://"):
        return location.rstrip("/")
    path = Path(location.removeprefix("file://")).absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


def io_properties(config: CatalogConfig) -> dict[str, str]:
    """pyiceberg FileIO properties of ``config``'s warehouse (``s3.*`` for S3), then
    ``config.iceberg_properties``, which win."""
    props: dict[str, str] = {}
    if config.warehouse.startswith("s3://"):
        endpoint = config.s3_endpoint_url
        if endpoint:
            props["s3.endpoint"] = endpoint
        if config.s3_path_style is not None:
            props["s3.force-virtual-addressing"] = str(not config.s3_path_style).lower()
        # Without a region pyiceberg asks AWS where the bucket lives: a network call
        # that is wrong for a compatible endpoint and hangs where AWS is unreachable.
        region = config.s3_region or ("us-east-1" if endpoint else None)
        if region:
            props["s3.region"] = region
    props.update(config.iceberg_properties)
    return props


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    """Every SQLite connection waits for locks (busy timeout) instead of failing, and
    the file is in WAL mode so readers never block the writer."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def connect(config: CatalogConfig) -> Catalog:
    """The pyiceberg catalog for ``config.uri`` (SQLite in WAL mode with a busy
    timeout, PostgreSQL, or ``rest:``), its FileIO set up for the warehouse.

    Raises:
        InvalidInput: ``config.uri`` is not a catalog URI.
    """
    props = {"warehouse": _warehouse(config.warehouse), **io_properties(config)}
    if config.uri.startswith("rest:"):
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("vidlake", **{"uri": config.uri.removeprefix("rest:"), **props})
    import sqlite3

    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    try:
        url = make_url(config.uri)
    except Exception as exc:  # sqlalchemy's ArgumentError
        raise InvalidInput(f"not a catalog URI: {config.uri!r}", field="uri") from exc
    is_sqlite = url.get_backend_name() == "sqlite"
    if is_sqlite:
        db = url.database or ""
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).parent.mkdir(parents=True, exist_ok=True)
            # WAL is a property of the file: set it before the first SQLAlchemy
            # connection, so that even pyiceberg's table creation runs in WAL mode.
            with sqlite3.connect(db, timeout=_SQLITE_BUSY_MS / 1000) as conn:
                conn.execute("PRAGMA journal_mode = WAL")
            conn.close()
        url = url.update_query_dict({"timeout": str(_SQLITE_BUSY_MS / 1000)})
    catalog = SqlCatalog("vidlake", uri=url.render_as_string(hide_password=False), **props)
    if is_sqlite:
        event.listen(catalog.engine, "connect", _sqlite_on_connect)
        catalog.engine.dispose()  # reconnect through the listener from now on
    return catalog


def freeze_namespace(iceberg: Catalog, config: CatalogConfig) -> tuple[float, str]:
    """Create the namespace with the eval settings, or read the frozen ones.

    Returns:
        The frozen (eval fraction, eval salt).

    Raises:
        Conflict: ``config`` names other settings than the frozen ones, or the
            namespace exists without them.
    """
    ns = config.namespace
    try:
        props = iceberg.load_namespace_properties(ns)
    except NoSuchNamespaceError:
        fresh = {
            PROP_EVAL_FRACTION: repr(
                config.eval_fraction if config.eval_fraction is not None else DEFAULT_EVAL_FRACTION
            ),
            PROP_EVAL_SALT: config.eval_salt.lower() if config.eval_salt else rules.new_eval_salt(),
            PROP_CREATED_AT: dt.datetime.now(dt.UTC).isoformat(),
        }
        with contextlib.suppress(*_CREATE_RACES):  # a racing process won: its settings hold
            iceberg.create_namespace(ns, fresh)
        props = iceberg.load_namespace_properties(ns)
    if PROP_EVAL_FRACTION not in props or PROP_EVAL_SALT not in props:
        raise Conflict(
            f"namespace {ns!r} exists without vidlake's frozen eval settings",
            namespace=ns,
        )
    fraction, salt = float(props[PROP_EVAL_FRACTION]), props[PROP_EVAL_SALT]
    if config.eval_fraction is not None and config.eval_fraction != fraction:
        raise Conflict(
            f"eval_fraction {config.eval_fraction} differs from the catalog's frozen {fraction}",
            field="eval_fraction",
            frozen=fraction,
        )
    if config.eval_salt is not None and config.eval_salt.lower() != salt:
        raise Conflict("eval_salt differs from the catalog's frozen salt", field="eval_salt")
    return fraction, salt
