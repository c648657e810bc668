"""Live storage operations: the status files ``vidlake storage upload`` and ``watch``
write, and how the dashboard and ``/metrics`` read them.

Both commands write one JSON file per operation into the status directory
(``Settings.storage_status_dir``, default ``<home>/storage-status``):
``upload-NAME.json`` (:class:`UploadStatusFile`, written here) and ``watch-NAME.json``
(:class:`manifests.storage.watch.WatchStatus`, written by the watcher after every poll).
Every write is atomic (temp + fsync + rename), so a reader never sees half a file.

An upload rewrites its file at most once a second while it progresses and every
:data:`HEARTBEAT_S` seconds regardless (one large file can take minutes), so a reader
tells a live operation from one whose process died: a ``running`` file not rewritten
for :data:`STALE_S` (a watcher: three polls more) is reported ``stale``.
:func:`read_statuses` turns each file into a :class:`StorageOp` with progress, rate and
ETA computed the same way for both kinds; an unreadable file (not a regular file, over
:data:`MAX_STATUS_BYTES`, not JSON, fields of the wrong type or out of range) is
reported as such (with the reason), never skipped silently and never an error of the
page; a rate that is not finite reads as 0.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from catalog.atomic import write_bytes
from service.settings import Settings

__all__ = [
    "HEARTBEAT_S",
    "MAX_STATUS_BYTES",
    "STALE_S",
    "StorageOp",
    "UploadStatusFile",
    "read_statuses",
    "status_dir",
    "status_path",
]

log = logging.getLogger("vidlake.storage")

HEARTBEAT_S = 5.0
STALE_S = 60.0
_MIN_WRITE_S = 1.0
_RECENT_S = 7 * 86400.0  # finished operations older than this are not shown
_FAILURES_SHOWN = 50
#: A status file larger than this is not read (one is a few KiB; 50 failures shown).
MAX_STATUS_BYTES = 4 << 20
#: What reading a hostile status file may raise (a deep array recurses in json).
_UNREADABLE = (OSError, ValueError, TypeError, KeyError, AttributeError, OverflowError,
               RecursionError)  # fmt: skip


def status_dir(settings: Settings) -> Path:
    """Where storage operations write their status files."""
    return Path(settings.resolved()["storage_status_dir"])


def status_path(directory: Path, kind: str, name: str) -> Path:
    """The status file of the ``kind`` (upload/watch) operation called ``name``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "unnamed"
    return directory / f"{kind}-{safe}.json"


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


class UploadStatusFile:
    """The status file of one ``vidlake storage upload`` run (a context manager).

    Feed it ``progress(bytes_done, files_done)`` (the callback of
    :func:`manifests.storage.upload.upload_entries`) and :meth:`finish` with the report;
    leaving the block without :meth:`finish` (an exception, Ctrl-C) records ``failed``.
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        source: str,
        store: str,
        files_total: int,
        bytes_total: int,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.heartbeat_s = heartbeat_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = clock()
        self._first_bytes: int | None = None
        self._last_write = float("-inf")
        self._warned = False
        self.doc: dict[str, Any] = {
            "format": 1,
            "kind": "upload",
            "name": name,
            "source": source,
            "store": store,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "state": "running",
            "started_at": _now_iso(),
            "updated_at": "",
            "heartbeat_s": heartbeat_s,
            "files_total": files_total,
            "bytes_total": bytes_total,
            "files_done": 0,
            "bytes_done": 0,
            "bytes_uploaded": 0,
            "rate_mb_s": 0.0,
            "failed": [],
        }

    def __enter__(self) -> UploadStatusFile:
        self._write()
        self._thread = threading.Thread(target=self._beat, name="vidlake-status", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.doc["state"] == "running":
            self.doc["state"] = "failed"
            self.doc["error"] = "interrupted" if exc is None else f"{type(exc).__name__}: {exc}"
            self._write()

    def progress(self, bytes_done: int, files_done: int) -> None:
        """Record progress; rewrite the file if the last write is a second old."""
        with self._lock:
            if self._first_bytes is None:
                self._first_bytes = bytes_done  # receipted before this run: not this rate
            self.doc["bytes_done"], self.doc["files_done"] = bytes_done, files_done
            elapsed = max(self._clock() - self._t0, 1e-9)
            moved = bytes_done - self._first_bytes
            self.doc["rate_mb_s"] = round(moved / 1e6 / elapsed, 3)
            due = self._clock() - self._last_write >= _MIN_WRITE_S
        if due:
            self._write()

    def finish(self, *, bytes_uploaded: int, failed: Sequence[dict[str, str]]) -> None:
        """The run's outcome: ``done``, or ``failed`` with every failed file listed."""
        with self._lock:
            self.doc["bytes_uploaded"] = bytes_uploaded
            self.doc["failed"] = list(failed)
            self.doc["state"] = "failed" if failed else "done"
        self._write()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self._write()

    def _write(self) -> None:
        """Rewrite the file; a status file that cannot be written costs the dashboard
        its panel, never the upload (one warning, then silence)."""
        with self._lock:
            self.doc["updated_at"] = _now_iso()
            self._last_write = self._clock()
            data = (json.dumps(self.doc, indent=2, sort_keys=True) + "\n").encode()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_bytes(self.path, data)
            except OSError as exc:
                if not self._warned:
                    log.warning("cannot write the status file %s: %s", self.path, exc)
                    self._warned = True


@dataclass(frozen=True)
class StorageOp:
    """One operation as the dashboard and the gauges show it."""

    kind: str
    name: str
    state: str  # running | stale | done | failed | stopped | unreadable
    path: str
    source: str = ""
    store: str = ""
    started_at: str = ""
    updated_at: str = ""
    age_s: float | None = None
    files_done: int = 0
    files_total: int | None = None
    bytes_done: int = 0
    bytes_total: int | None = None
    backlog_files: int | None = None
    backlog_bytes: int | None = None
    rate_mb_s: float = 0.0
    eta_s: float | None = None
    progress: float | None = None
    failed: list[dict[str, str]] = field(default_factory=list)
    failed_count: int = 0
    error: str = ""

    @property
    def live(self) -> bool:
        return self.state == "running"


def read_statuses(directory: Path, *, now: float | None = None) -> list[StorageOp]:
    """Every operation in ``directory``: live ones first, then by last update (newest
    first); finished ones older than a week are left out."""
    if not directory.is_dir():
        return []
    now = time.time() if now is None else now
    ops = []
    for path in sorted(directory.glob("*.json")):
        op = _read_one(path, now)
        if op.live or op.age_s is None or op.age_s < _RECENT_S:
            ops.append(op)
    return sorted(ops, key=lambda o: (not o.live, o.age_s if o.age_s is not None else 0.0))


def _read_one(path: Path, now: float) -> StorageOp:
    kind = path.name.split("-", 1)[0]
    name = path.stem.split("-", 1)[1] if "-" in path.stem else path.stem
    try:
        doc = json.loads(_read_small(path))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return _parse(path, doc, now)
    except _UNREADABLE as exc:
        return StorageOp(kind, name, "unreadable", str(path), error=f"{type(exc).__name__}: {exc}")


def _read_small(path: Path) -> str:
    """The text of a regular file of at most :data:`MAX_STATUS_BYTES` (a FIFO would
    block the page; a huge file would fill memory)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_STATUS_BYTES:
            raise ValueError(f"too large: {info.st_size} bytes (at most {MAX_STATUS_BYTES})")
        return f.read(MAX_STATUS_BYTES + 1)[:MAX_STATUS_BYTES].decode("utf-8")


def _count(value: Any) -> int:
    """A file or byte count: an integer in [0, 2**63)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a count, got {value!r}")
    if not (math.isfinite(value) and 0 <= value < 2**63):
        raise ValueError(f"count out of range: {value!r}")
    return int(value)


def _finite(value: Any) -> float:
    """A rate or a period: a finite number, else 0 (None and garbage too)."""
    try:
        number = float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _age(updated_at: str, now: float) -> float | None:
    try:
        return max(now - datetime.fromisoformat(updated_at).timestamp(), 0.0)
    except (TypeError, ValueError):
        return None


def _parse(path: Path, doc: dict[str, Any], now: float) -> StorageOp:
    kind = str(doc.get("kind") or path.name.split("-", 1)[0])
    age = _age(str(doc.get("updated_at", "")), now)
    failures = doc.get("failed") or []
    if not isinstance(failures, list) or not all(isinstance(f, dict) for f in failures):
        raise TypeError("failed: expected a list of objects")
    failed = [{str(k): str(v) for k, v in f.items()} for f in failures]
    rate = _finite(doc.get("rate_mb_s"))
    state = str(doc.get("state") or "running")
    if kind == "watch":
        stale_after = STALE_S + 3 * _finite(doc.get("poll_s"))
        done, backlog = _count(doc.get("files_done", 0)), _count(doc.get("backlog_files", 0))
        bytes_done = _count(doc.get("bytes_uploaded", 0))
        left = _count(doc.get("backlog_bytes", 0))
        files_total: int | None = done + backlog
        bytes_total: int | None = None
        extra: dict[str, Any] = {"backlog_files": backlog, "backlog_bytes": left}
        source = str(doc.get("directory", ""))
    else:
        stale_after = STALE_S + 3 * _finite(doc.get("heartbeat_s"))
        done, files_total = _count(doc.get("files_done", 0)), _count(doc["files_total"])
        bytes_done, bytes_total = _count(doc.get("bytes_done", 0)), _count(doc["bytes_total"])
        left = max(bytes_total - bytes_done, 0)
        extra = {}
        source = str(doc.get("source", ""))
    if state == "running" and age is not None and age > stale_after:
        state = "stale"
    if kind == "watch" or not bytes_total:
        progress = done / files_total if files_total else None
    else:
        progress = min(bytes_done / bytes_total, 1.0)
    return StorageOp(
        kind=kind,
        name=str(doc.get("name") or path.stem.split("-", 1)[-1]),
        state=state,
        path=str(path),
        source=source,
        store=str(doc.get("store", "")),
        started_at=str(doc.get("started_at", "")),
        updated_at=str(doc.get("updated_at", "")),
        age_s=age,
        files_done=done,
        files_total=files_total,
        bytes_done=bytes_done,
        bytes_total=bytes_total,
        rate_mb_s=rate,
        eta_s=left / (rate * 1e6) if state == "running" and rate > 0 else None,
        progress=progress,
        failed=failed[:_FAILURES_SHOWN],
        failed_count=len(failed),
        error=str(doc.get("error", "")),
        **extra,
    )
