"""Live upload: ship files a producer writes over hours, once each is complete.

:class:`Watcher` polls one directory tree. A file counts as complete when

* ``marker`` mode: a sibling ``NAME.done`` exists (the producer's explicit signal), or
* stability mode (no marker seen for it): its size and mtime have not changed for
  ``stable_s`` seconds, observed across polls, and its mtime is at least ``stable_s``
  old.

Complete files go up exactly as ``upload`` sends them (identity checks, conditional
PUT, verification, an fsync'd receipt in the same log format). Receipts make it
restart-safe: a file whose receipt matches its identity is never sent again, so a
killed watcher resumes where it was. Progress (files, bytes, rate, backlog, failures)
is written after every poll to a JSON status file, atomically, for the dashboard
(``service.storage_status`` reads it: ``state`` is ``running`` until :meth:`Watcher.run`
returns or is interrupted, then ``stopped``; ``pid``/``host``/``poll_s`` let a reader
tell a live watcher from a dead one).
Hidden files, ``*.tmp``/``*.part`` files and the markers themselves are never uploaded.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from catalog.errors import InvalidInput, VidlakeError
from catalog.objects.s3 import S3ObjectStore
from manifests.storage.inventory import InventoryEntry, stat_identity
from manifests.storage.receipts import ReceiptLog, read_receipts
from manifests.storage.seal import write_json_atomic
from manifests.storage.upload import upload_file

__all__ = ["WatchStatus", "Watcher"]

MARKER_SUFFIX = ".done"
_SKIP_SUFFIXES = (MARKER_SUFFIX, ".tmp", ".part", ".partial")


@dataclass
class WatchStatus:
    """What the watcher has done so far (the JSON status file's body)."""

    directory: str
    store: str
    started_at: str
    updated_at: str = ""
    passes: int = 0
    files_uploaded: int = 0
    bytes_uploaded: int = 0
    files_done: int = 0
    backlog_files: int = 0
    backlog_bytes: int = 0
    rate_mb_s: float = 0.0
    failed: list[dict[str, str]] = field(default_factory=list)
    kind: str = "watch"
    name: str = ""
    state: str = "running"
    poll_s: float = 0.0
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)


class Watcher:
    """Upload complete files under ``directory`` (see the module docstring).

    Args:
        directory: The tree the producer writes into.
        store: The bucket store.
        receipts: The receipt log (``receipts/NAME.jsonl``).
        status_file: Where the JSON status goes after every poll.
        stable_s: Seconds a file's size and mtime must stay unchanged.
        workers: Parallel uploads.
        require_marker: Upload only files with a ``.done`` marker (no stability rule).
        clock: Time source (tests).
        name: The watch's name, recorded in the status file.
    """

    def __init__(
        self,
        directory: str | Path,
        store: S3ObjectStore,
        receipts: str | Path,
        status_file: str | Path,
        *,
        stable_s: float = 30.0,
        workers: int = 4,
        require_marker: bool = False,
        clock: Callable[[], float] = time.time,
        name: str = "",
    ) -> None:
        self.directory = Path(directory).resolve()
        if not self.directory.is_dir():
            raise InvalidInput(f"{directory} is not a directory", path=str(directory))
        if stable_s < 0 or workers < 1:
            raise InvalidInput("stable_s must be >= 0 and workers >= 1")
        self.store = store
        self.receipts_path = Path(receipts)
        self.log = ReceiptLog(receipts)
        self.status_file = Path(status_file)
        self.stable_s = stable_s
        self.workers = workers
        self.require_marker = require_marker
        self.clock = clock
        self._seen: dict[str, tuple[tuple[int, int, int], float]] = {}
        self._t0 = clock()
        self.status = WatchStatus(str(self.directory), store.url, datetime.now(UTC).isoformat())
        self.status.name = name

    def poll(self) -> WatchStatus:
        """One pass: upload every complete file without a receipt; write the status."""
        done = read_receipts(self.receipts_path)
        now = self.clock()
        ready: list[InventoryEntry] = []
        backlog_files = backlog_bytes = files_done = 0
        for path in self._files():
            key = str(path)
            try:
                ident = stat_identity(path)
            except FileNotFoundError:
                continue
            r = done.get(key)
            if r is not None and r.identity == ident and r.store == self.store.url:
                files_done += 1
                continue
            backlog_files += 1
            backlog_bytes += ident[0]
            if self._complete(path, ident, now):
                ready.append(InventoryEntry.of("watched", path, name=self._rel(path)))
        failed: list[dict[str, str]] = []
        files_done_now: list[int] = []
        lock = threading.Lock()

        def one(entry: InventoryEntry) -> None:
            try:
                outcome, _ = upload_file(entry, self.store, self.log)
            except (VidlakeError, OSError) as exc:
                with lock:
                    failed.append({"path": entry.path, "error": str(exc)})
                    self._seen.pop(entry.path, None)  # changed: wait for it to settle again
                return
            with lock:
                self.status.files_uploaded += outcome == "put"
                self.status.bytes_uploaded += entry.size if outcome == "put" else 0
                files_done_now.append(entry.size)

        if ready:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="vidlake-watch") as pool:
                list(pool.map(one, ready))
        s = self.status
        s.passes += 1
        s.files_done = files_done + len(files_done_now)
        s.backlog_files = backlog_files - len(files_done_now)
        s.backlog_bytes = backlog_bytes - sum(files_done_now)
        s.failed = sorted(failed, key=lambda f: f["path"])
        elapsed = max(self.clock() - self._t0, 1e-9)
        s.rate_mb_s = round(s.bytes_uploaded / 1e6 / elapsed, 3)
        s.updated_at = datetime.now(UTC).isoformat()
        write_json_atomic(self.status_file, asdict(s))
        return s

    def run(
        self,
        poll_s: float = 5.0,
        *,
        stop: threading.Event | None = None,
        on_poll: Callable[[WatchStatus], None] | None = None,
        max_passes: int | None = None,
    ) -> WatchStatus:
        """Poll until ``stop`` is set (or ``max_passes`` passes); return the last status
        (marked ``stopped`` in the status file however the loop ends)."""
        stop = stop or threading.Event()
        self.status.poll_s = poll_s
        passes = 0
        try:
            while True:
                status = self.poll()
                passes += 1
                if on_poll is not None:
                    on_poll(status)
                if stop.is_set() or (max_passes is not None and passes >= max_passes):
                    return status
                stop.wait(poll_s)
        finally:
            self.status.state = "stopped"
            self.status.updated_at = datetime.now(UTC).isoformat()
            write_json_atomic(self.status_file, asdict(self.status))

    # -- helpers ------------------------------------------------------------------
    def _files(self) -> list[Path]:
        out = []
        for dirpath, dirs, files in os.walk(self.directory):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if name.startswith(".") or name.endswith(_SKIP_SUFFIXES):
                    continue
                out.append(Path(dirpath) / name)
        return out

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.directory).as_posix()

    def _complete(self, path: Path, ident: tuple[int, int, int], now: float) -> bool:
        if path.with_name(path.name + MARKER_SUFFIX).exists():
            return True
        if self.require_marker:
            return False
        key = str(path)
        seen = self._seen.get(key)
        if seen is None or seen[0] != ident:
            self._seen[key] = (ident, now)
            return self.stable_s == 0
        mtime_age = now - ident[1] / 1e9
        return now - seen[1] >= self.stable_s and mtime_age >= self.stable_s
