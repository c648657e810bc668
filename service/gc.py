"""``vidlake gc``: the debris crashes leave outside the Iceberg tables.

Four kinds, each reported, deleted only with ``apply`` (a dry run by default):

``cut_dirs``
    ``vidlake-cut-<pid>-*`` work folders (:func:`materializer.cut.cut_snapshot`) in the
    cut work directory whose process is gone; folders of the older unnamed form
    (``vidlake-cut-<random>``) once older than ``tmp_age_s``.
``tmp_files``
    ``objects/.tmp/<pid>-*`` temp files of a local store whose writer is gone (and
    that are a minute old: a writer in another pid namespace is not visible here),
    any other once older than ``tmp_age_s``.
``uploads``
    unfinished S3 multipart uploads under the store's prefix started more than
    ``upload_age_s`` ago (their parts are invisible but billed).
``objects``
    stored objects no registered version (its artifacts, and every latent and text
    embedding its index names), pinned or not, no restore spec (the catalog files a
    sealed bucket restores from) and no catalog row (``latents``, ``captions`` at the
    current snapshot: tables are append-only) references, and that are older than
    ``object_age_s`` (a producer uploads objects before it ingests the rows naming
    them, a cutter before it claims a version). Objects ``vidlake storage upload``
    sent for an inventory not sealed yet are referenced only by local receipts: seal
    before running gc with ``apply`` on that bucket, or keep ``object_age_s`` longer
    than upload-to-seal.

The cheap part (``cut_dirs`` and ``tmp_files`` of dead processes) runs at service
start (:func:`clean_dead_temp`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from catalog.errors import InvalidInput
from catalog.hashing import is_sha256
from catalog.objects.base import OBJECTS_DIR, ObjectInfo, ObjectStore
from catalog.objects.local import LocalObjectStore
from catalog.objects.s3 import S3ObjectStore
from catalog.objects.s3_client import guarded
from catalog.objects.s3_listing import list_under
from manifests.ipc import read_columns
from manifests.storage.seal import SPEC_PREFIX

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from manifests.registry import Registry
    from service.deps import Services
    from service.jobs import JobRecord

__all__ = ["GcOptions", "clean_dead_temp", "run_gc", "startup_clean", "submit_gc"]

Progress = Callable[[str, float], None]

_log = logging.getLogger(__name__)

_CUT_PREFIX = "vidlake-cut-"
_PID_NAME = re.compile(r"^(\d+)-")
_MIN_TMP_AGE_S = 60.0


@dataclass(frozen=True)
class GcOptions:
    """What :func:`run_gc` may delete (nothing unless ``apply``)."""

    apply: bool = False
    tmp_age_s: float = 86400.0
    upload_age_s: float = 86400.0
    object_age_s: float = 7 * 86400.0
    workdir: str | None = None

    def __post_init__(self) -> None:
        for name in ("tmp_age_s", "upload_age_s", "object_age_s"):
            if getattr(self, name) < 0:
                raise InvalidInput(f"{name} must not be negative", field=name)


def run_gc(
    catalog: VidlakeCatalog,
    registry: Registry,
    options: GcOptions | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Find (and with ``apply`` delete) the debris of every kind; the report per kind:
    ``count``, ``bytes`` and up to 100 ``examples``."""
    options = options or GcOptions()
    report = progress or (lambda _stage, _fraction: None)
    store = catalog.objects
    report("cut_dirs", 0.0)
    result: dict[str, Any] = {"apply": options.apply}
    result["cut_dirs"] = clean_cut_dirs(options.workdir, options.tmp_age_s, options.apply)
    report("tmp_files", 0.25)
    result["tmp_files"] = clean_tmp_files(store, options.tmp_age_s, options.apply)
    report("uploads", 0.5)
    result["uploads"] = abort_old_uploads(store, options.upload_age_s, options.apply)
    report("objects", 0.75)
    result["objects"] = remove_unreferenced(catalog, registry, options.object_age_s, options.apply)
    report("gc", 1.0)
    return result


def clean_dead_temp(store: ObjectStore, workdir: str | None = None) -> dict[str, Any]:
    """The cheap part, at service start: temp files and cut folders of dead processes."""
    return {
        "cut_dirs": clean_cut_dirs(workdir, float("inf"), True),
        "tmp_files": clean_tmp_files(store, float("inf"), True),
    }


# -- temp files ------------------------------------------------------------------------
def clean_cut_dirs(workdir: str | None, age_s: float, apply: bool) -> dict[str, Any]:
    root = Path(workdir or tempfile.gettempdir())
    found = _Found()
    if not root.is_dir():
        return found.view()
    for entry in os.scandir(root):
        if not (entry.name.startswith(_CUT_PREFIX) and entry.is_dir(follow_symlinks=False)):
            continue
        if _stale(entry.name[len(_CUT_PREFIX) :], entry.stat().st_mtime, age_s):
            found.add(entry.path, _tree_bytes(entry.path))
            if apply:
                shutil.rmtree(entry.path, ignore_errors=True)
    return found.view()


def clean_tmp_files(store: ObjectStore, age_s: float, apply: bool) -> dict[str, Any]:
    found = _Found()
    if not isinstance(store, LocalObjectStore):
        return found.view()
    tmp_dir = store.root / ".tmp"
    if not tmp_dir.is_dir():
        return found.view()
    for entry in os.scandir(tmp_dir):
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if _stale(entry.name, st.st_mtime, age_s):
            found.add(entry.path, st.st_size)
            if apply:
                Path(entry.path).unlink(missing_ok=True)
    return found.view()


def _stale(name: str, mtime: float, age_s: float) -> bool:
    """A temp name ``<pid>-…`` whose process is gone (and a minute old), or any name
    older than ``age_s``."""
    age = time.time() - mtime
    match = _PID_NAME.match(name)
    if match and age >= _MIN_TMP_AGE_S and not _alive(int(match.group(1))):
        return True
    return age >= age_s


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total


# -- multipart uploads -----------------------------------------------------------------
def abort_old_uploads(store: ObjectStore, age_s: float, apply: bool) -> dict[str, Any]:
    found = _Found()
    if not isinstance(store, S3ObjectStore):
        return found.view()
    client = store.client
    prefix = f"{store.prefix}/" if store.prefix else ""
    cutoff = time.time() - age_s
    url = f"s3://{store.bucket}/{prefix}"
    pages = client.get_paginator("list_multipart_uploads").paginate(
        Bucket=store.bucket, Prefix=prefix
    )
    uploads: list[dict[str, Any]] = guarded(
        "list", url, lambda: [u for p in pages for u in p.get("Uploads", [])]
    )
    for upload in uploads:
        if upload["Initiated"].timestamp() >= cutoff:
            continue
        key, upload_id = upload["Key"], upload["UploadId"]
        found.add(f"s3://{store.bucket}/{key}#{upload_id}", 0)
        if apply:
            _abort(client, store.bucket, key, upload_id)
    return found.view()


def _abort(client: Any, bucket: str, key: str, upload_id: str) -> None:
    def call() -> None:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)

    guarded("delete", f"s3://{bucket}/{key}", call, key=key)


# -- unreferenced objects --------------------------------------------------------------
def referenced_objects(catalog: VidlakeCatalog, registry: Registry) -> set[str]:
    """SHA-256 of every object a registered version or a current catalog row names."""
    refs: set[str] = set()
    indexes: set[str] = set()
    for version in registry.versions():
        artifacts = registry.get(version).artifacts
        refs.update(ref.sha256 for ref in artifacts.values())
        index = artifacts["index.arrow"].sha256
        if index in indexes:
            continue
        indexes.add(index)
        with registry.local_artifact(version, "index.arrow") as path:
            for column in read_columns(path, ["object_sha256", "text_embedding_sha256"]):
                refs.update(v for v in pc.unique(column).to_pylist() if v)
    refs |= _sealed_objects(catalog.objects)
    for table, column in (("latents", "object_sha256"), ("captions", "text_embedding_sha256")):
        rows = catalog.scan(table, columns=[column], include_eval=True)[column]
        refs.update(v for v in pc.unique(rows).to_pylist() if v)
    return refs


def _sealed_objects(store: ObjectStore) -> set[str]:
    """Every SHA-256 a restore spec (``vidlake storage seal``) names: the catalog files
    and registry entries a restore from the bucket reads."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k == "sha256" and is_sha256(v):
                    found.add(v)
                else:
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for key in store.list_keys(SPEC_PREFIX):
        walk(json.loads(store.get_key(key)))
    return found


def remove_unreferenced(
    catalog: VidlakeCatalog, registry: Registry, age_s: float, apply: bool
) -> dict[str, Any]:
    store = catalog.objects
    refs = referenced_objects(catalog, registry)
    cutoff = time.time() - age_s
    found = _Found()
    young = 0
    for info, mtime in _objects_with_mtime(store):
        if info.sha256 in refs:
            continue
        if mtime is None or mtime >= cutoff:
            young += 1
            continue
        found.add(info.sha256, info.size)
        if apply:
            store.delete(info.sha256, reason="gc: unreferenced")
    return {**found.view(), "young": young}


def _objects_with_mtime(store: ObjectStore) -> Iterator[tuple[ObjectInfo, float | None]]:
    """Every object and its modification time (None: unknown, so never deleted)."""
    if isinstance(store, S3ObjectStore):
        base = f"{store.prefix}/{OBJECTS_DIR}/" if store.prefix else f"{OBJECTS_DIR}/"
        for item in list_under(store.client, store.bucket, base):
            sha = item["Key"].rpartition("/")[2]
            if is_sha256(sha) and item["Key"] == store.key_of(sha):
                yield ObjectInfo(sha, int(item["Size"])), item["LastModified"].timestamp()
        return
    for info in store.iter_objects():
        mtime: float | None = None
        if isinstance(store, LocalObjectStore):
            with contextlib.suppress(FileNotFoundError):
                mtime = os.stat(store.object_path(info.sha256)).st_mtime
        yield info, mtime


class _Found:
    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.examples: list[str] = []

    def add(self, what: str, size: int) -> None:
        self.count += 1
        self.bytes += size
        if len(self.examples) < 100:
            self.examples.append(what)

    def view(self) -> dict[str, Any]:
        return {"count": self.count, "bytes": self.bytes, "examples": self.examples}


def submit_gc(services: Services, options: GcOptions, *, by: str | None) -> JobRecord:
    """Queue a gc job, or return the one already queued or running."""
    runner = services.runner
    for state in ("running", "queued"):
        for job in runner.store.list(state=state, kind="gc", limit=10):
            return job
    catalog, registry = services.catalog, services.registry

    def run(progress: Progress) -> dict[str, Any]:
        return run_gc(catalog, registry, options, progress)

    params = {
        "apply": options.apply,
        "tmp_age_s": options.tmp_age_s,
        "upload_age_s": options.upload_age_s,
        "object_age_s": options.object_age_s,
    }
    return runner.submit("gc", run, params, owner=by)


def startup_clean(services: Services) -> dict[str, Any]:
    """:func:`clean_dead_temp` at service start, without opening the catalog (a failure
    is logged, never fatal: the debris waits for the next start or ``vidlake gc``)."""
    from service.lake import Lake

    try:
        store = (
            services.catalog.objects if services.catalog_opened else Lake(services.settings).objects
        )
        done = clean_dead_temp(store)
    except Exception:
        _log.exception("startup cleanup of dead-process temp files failed")
        return {}
    if done["cut_dirs"]["count"] or done["tmp_files"]["count"]:
        _log.info(
            "removed %d cut work folders and %d temp files of dead processes",
            done["cut_dirs"]["count"],
            done["tmp_files"]["count"],
        )
    return done
