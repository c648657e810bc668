"""Upload receipts: an append-only, fsync'd JSONL log of verified uploads.

A receipt is written only after the object was verified in the bucket, and names the
local file's identity (size, mtime_ns, inode) at that moment, so a later run can trust
it without a request exactly while the file is unchanged. A process killed mid-append
leaves at most one torn last line, which readers skip and writers fence off with a
newline.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Receipt", "ReceiptLog", "read_receipts"]


@dataclass(frozen=True)
class Receipt:
    """A file's bytes are stored, verified, under ``key`` of ``store``."""

    path: str
    sha256: str
    size: int
    mtime_ns: int
    inode: int
    store: str
    key: str
    verified_at: str
    kind: str = ""
    name: str | None = None

    @property
    def identity(self) -> tuple[int, int, int]:
        return self.size, self.mtime_ns, self.inode


def read_receipts(path: str | Path) -> dict[str, Receipt]:
    """The newest receipt per local path (an absent log has none; torn lines are skipped)."""
    out: dict[str, Receipt] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            receipt = Receipt(**json.loads(line))
        except (ValueError, TypeError):
            continue  # a torn line from a killed writer
        out[receipt.path] = receipt
    return out


class ReceiptLog:
    """Appends receipts to a JSONL file, each one fsync'd before :meth:`append` returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, receipt: Receipt) -> None:
        line = (json.dumps(asdict(receipt), sort_keys=True) + "\n").encode("utf-8")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if _ends_torn(fd):
                    line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)


def _ends_torn(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"
