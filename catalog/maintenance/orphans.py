"""Orphan files: files under a table's location that no live snapshot, manifest or
metadata file references, removed once older than a safety age.

Referenced are: the current metadata file and those in its log, every live
snapshot's manifest list, every manifest those lists name, and every data file those
manifests name (deleted entries included, so a file is kept while any live manifest
still mentions it), plus statistics files. Debris of crashed writers (a data file
written before a commit that never landed, a truncated one, manifests of a killed
compaction) is exactly the set of unreferenced files; the safety age (default a day)
spares the files of a commit in flight. Deleting is idempotent, so a kill -9 midway
leaves work a rerun finishes. Local (``file://`` or a path) and ``s3://`` warehouses.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from pyiceberg.table import Table

from catalog.errors import InvalidInput, StorageError
from catalog.objects.s3_client import S3Connection, make_client, translate

__all__ = ["list_files", "referenced_paths", "remove_orphans", "unreferenced_files"]


def referenced_paths(tbl: Table) -> set[str]:
    """Every file ``tbl``'s metadata references (normalised, see :func:`_norm`)."""
    meta = tbl.metadata
    out = {tbl.metadata_location, *(m.metadata_file for m in meta.metadata_log)}
    out |= {s.statistics_path for s in meta.statistics}
    out |= {s.statistics_path for s in getattr(meta, "partition_statistics", [])}
    seen: set[str] = set()
    for snap in meta.snapshots:
        out.add(snap.manifest_list)
        for m in snap.manifests(io=tbl.io):
            if m.manifest_path in seen:
                continue
            seen.add(m.manifest_path)
            for e in m.fetch_manifest_entry(tbl.io, discard_deleted=False):
                out.add(e.data_file.file_path)
    out |= seen
    return {_norm(p) for p in out}


def remove_orphans(
    tbl: Table, *, older_than_s: float, s3: S3Connection | None = None, apply: bool = True
) -> dict[str, Any]:
    """Delete (with ``apply``) the unreferenced files under ``tbl``'s location older than
    ``older_than_s``; returns ``orphans`` (count), ``bytes`` and ``young`` (unreferenced
    but within the safety age, kept)."""
    cutoff = time.time() - older_than_s
    done: dict[str, Any] = {"orphans": 0, "bytes": 0, "young": 0}
    for uri, size, mtime in unreferenced_files(tbl, s3):
        if mtime > cutoff:
            done["young"] += 1
            continue
        if apply:
            _delete(tbl, uri)
        done["orphans"] += 1
        done["bytes"] += size
    return done


def unreferenced_files(tbl: Table, s3: S3Connection | None = None) -> list[tuple[str, int, float]]:
    """``(uri, size, mtime)`` of every file under ``tbl``'s location that nothing
    :func:`referenced_paths` names (of any age)."""
    referenced = referenced_paths(tbl)
    return [f for f in list_files(tbl.metadata.location, s3) if _norm(f[0]) not in referenced]


def list_files(location: str, s3: S3Connection | None = None) -> Iterator[tuple[str, int, float]]:
    """``(uri, size, mtime)`` of every file under ``location`` (a table location)."""
    url = urlparse(location)
    if url.scheme in ("s3", "s3a", "s3n"):
        yield from _list_s3(url.netloc, url.path.lstrip("/"), s3 or S3Connection())
    elif url.scheme in ("", "file"):
        yield from _list_local(url.path if url.scheme else location, url.scheme == "file")
    else:
        raise InvalidInput(f"cannot list a warehouse at {location!r}", field="warehouse")


def _list_local(root: str, as_uri: bool) -> Iterator[tuple[str, int, float]]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            yield (f"file://{path}" if as_uri else path), st.st_size, st.st_mtime


def _list_s3(bucket: str, prefix: str, conn: S3Connection) -> Iterator[tuple[str, int, float]]:
    client = make_client(conn)
    prefix = prefix.rstrip("/") + "/"
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield f"s3://{bucket}/{obj['Key']}", obj["Size"], obj["LastModified"].timestamp()
    except Exception as exc:
        raise translate(exc, "list", f"s3://{bucket}/{prefix}") from exc


def _norm(uri: str) -> str:
    """One spelling per file: ``file:///x`` and ``/x`` alike, ``s3a://`` as ``s3://``."""
    url = urlparse(uri)
    if url.scheme in ("", "file"):
        return os.path.normpath(url.path if url.scheme else uri)
    return f"s3://{url.netloc}/{url.path.lstrip('/')}"


def _delete(tbl: Table, uri: str) -> None:
    try:
        tbl.io.delete(uri)
    except FileNotFoundError:
        return
    except OSError as exc:
        if "not found" in str(exc).lower() or "no such" in str(exc).lower():
            return
        raise StorageError(f"cannot delete {uri}: {exc}", path=uri) from exc
