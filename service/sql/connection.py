"""The second wall: a DuckDB connection that can read only what is registered into it.

:func:`sandbox_connection` opens an in-memory database whose every path setting
(``home_directory``, ``secret_directory``, ``extension_directory``) points at the
worker's own empty scratch directory, with no spilling (``temp_directory=''``), no
extension autoloading or installing, no persistent secrets, no replacement scans of
Python variables, ``enable_external_access=false`` (no files, no network, no
``ATTACH``/``COPY``), DuckDB's local file system disabled outright, a memory limit,
and finally ``lock_configuration=true`` so that no ``SET`` can undo any of it.

DuckDB cannot hide its system catalogs (``duckdb_settings()``, ``pg_settings``,
``sqlite_master``, ``information_schema``…). The wall therefore makes them say
nothing: the catalogs list only the registered views, the settings name only the
scratch directory, and the worker process (:mod:`service.sql.worker`) runs with that
directory as its working and home directory and holds no catalog, token or setting
of the server.
"""

from __future__ import annotations

import duckdb

__all__ = ["sandbox_connection"]


def sandbox_connection(
    memory_limit: str, threads: int = 1, scratch: str | None = None
) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB that can read only what is registered into it.

    Args:
        memory_limit: DuckDB ``memory_limit`` (e.g. ``1GB``).
        threads: DuckDB worker threads.
        scratch: An empty directory that every DuckDB path setting points at (the
            worker's scratch directory); None keeps DuckDB's defaults for them.
    """
    config: dict[str, str | bool | int | float | list[str]] = {
        "python_enable_replacements": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "allow_community_extensions": False,
        "allow_unsigned_extensions": False,
        "allow_persistent_secrets": False,
        "temp_directory": "",
        "memory_limit": memory_limit,
        "threads": threads,
    }
    if scratch is not None:
        config |= {
            "home_directory": scratch,
            "secret_directory": scratch,
            "extension_directory": scratch,
        }
    con = duckdb.connect(":memory:", config=config)
    try:
        # In this order: each SET below forbids changing the paths above, and the
        # last forbids any SET at all.
        con.execute("SET enable_external_access = false")
        con.execute("SET disabled_filesystems = 'LocalFileSystem'")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con
