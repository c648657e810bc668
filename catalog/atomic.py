"""Atomic, crash-safe file writes: the one temp-then-rename of the code base.

A file under its final name is always complete: the bytes go to a fresh temp file in
the destination's directory (same filesystem, so the rename is atomic), are fsynced,
and only then take the final name, by ``os.replace`` (last writer wins) or, with
``exclusive=True``, by ``os.link`` (create-only: :class:`FileExistsError` when the
name exists, and the existing file is left alone). The directory is fsynced after,
so the name survives a power cut. On any error, the temp file is removed and the
final name is untouched.

* :func:`atomic_path` yields the temp *path* (for writers that open files by name:
  ``pyarrow``, ``pq.write_table``, a download into a path).
* :func:`atomic_file` yields the temp file opened for binary writing.
* :func:`write_bytes` writes a ``bytes`` value.

Raising inside either context manager abandons the write (e.g. a checksum that does
not verify). Standard library only: the loader imports it on a GPU node.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_file", "atomic_path", "fsync_dir", "temp_name", "write_bytes"]


def temp_name(dest: Path) -> Path:
    """A fresh, hidden temp name beside ``dest`` (never shared, even across hosts)."""
    return dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename, link or unlink in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(tmp: Path, dest: Path, exclusive: bool) -> None:
    if exclusive:
        os.link(tmp, dest)  # FileExistsError when the name is taken
    else:
        os.replace(tmp, dest)
    fsync_dir(dest.parent)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], *, exclusive: bool = False) -> Iterator[Path]:
    """Yield a temp path beside ``dest``; on a clean exit fsync it and give it ``dest``.

    The caller creates and writes the temp file (it does not exist yet). The parent
    directory must exist.

    Raises:
        FileExistsError: ``exclusive`` and ``dest`` exists (nothing is changed).
        FileNotFoundError: the body did not create the temp file.
    """
    dest = Path(dest)
    tmp = temp_name(dest)
    try:
        yield tmp
        _fsync_file(tmp)
        _publish(tmp, dest, exclusive)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def atomic_file(dest: str | os.PathLike[str], *, exclusive: bool = False) -> Iterator[BinaryIO]:
    """Yield a fresh temp file beside ``dest`` opened ``"xb"``; on a clean exit flush,
    fsync and publish it as ``dest`` (see :func:`atomic_path`)."""
    with atomic_path(dest, exclusive=exclusive) as tmp, open(tmp, "xb") as f:
        yield f
        f.flush()


def write_bytes(dest: str | os.PathLike[str], data: bytes, *, exclusive: bool = False) -> None:
    """Write ``data`` to ``dest`` atomically (see :func:`atomic_path`)."""
    with atomic_file(dest, exclusive=exclusive) as f:
        f.write(data)
