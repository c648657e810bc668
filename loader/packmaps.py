"""Cached pack files mapped into memory once per process (:mod:`loader.packs`).

A step's kilobyte members are copied out of their pack by one numpy gather per tensor
instead of one ``preadv`` per row (decision 060): at 16 KB the per-row syscall and its
Python were the largest share of a packed step. The mapping is made once per process
and pack *file*: it is keyed by the pack's SHA-256 and the file's stat fingerprint
(device, inode, size, mtime, ctime), which the reader takes from the descriptor it
opened under its lease. A pack replaced or rewritten (a re-download, a test that
damages it) has another fingerprint, so it gets a new mapping; the old one is never
read again.

Why a mapping is safe here: the node cache writes each object to a private temporary
file and renames it into place; it never writes to or truncates a file under
``objects/`` (loader/cache.py). A reader therefore never touches a page past the end
of a file (which would raise SIGBUS), and the bytes it maps are the bytes a ``pread``
of the same descriptor would return. Mappings are dropped, not closed: a copy in
another thread may still hold a view, and the pages go when the last view does.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict

import numpy as np
from numpy.typing import NDArray

__all__ = ["MAPS_MAX", "forget", "mapped"]

#: Pack files mapped at once per process (least recent dropped first): address space
#: only, the pages are the page cache's (at most 32 x 256 MB of a 47-bit space).
MAPS_MAX = 32

_lock = threading.Lock()
_maps: OrderedDict[tuple[str, tuple[int, ...]], NDArray[np.uint8]] = OrderedDict()


def mapped(pack: str, fp: tuple[int, ...], fd: int) -> NDArray[np.uint8] | None:
    """The bytes of pack file ``fd`` (object ``pack``, stat fingerprint ``fp``; its
    size is ``fp[2]``) as a read-only array, mapped on the first call for that file;
    None when it cannot be mapped (an empty file, a filesystem without ``mmap``): the
    caller reads it with ``pread`` instead."""
    key = (pack, fp)
    with _lock:
        got = _maps.get(key)
        if got is not None:
            _maps.move_to_end(key)
            return got
    try:
        region = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    got = np.frombuffer(region, dtype=np.uint8)
    if len(got) != fp[2]:  # the file changed between its fstat and this mapping
        return None
    with _lock:
        got = _maps.setdefault(key, got)
        _maps.move_to_end(key)
        while len(_maps) > MAPS_MAX:
            _maps.popitem(last=False)
    return got


def forget() -> None:
    """Drop every mapping of this process (their pages go with their last view)."""
    with _lock:
        _maps.clear()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
