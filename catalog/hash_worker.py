"""SHA-256 of many short messages, hashed in a worker process off this one's GIL.

A clip batch's id check is one SHA-256 per clip (:func:`catalog.rules.clip_ids`):
~0.9 µs a clip of Python and ``hashlib``, which holds the GIL for inputs this short,
so a thread beside the planning only takes turns with it. A batch of
:data:`MIN_ROWS` or more is instead handed, as its Arrow buffers (offsets and bytes,
no object per row) copied into a file the two share (a memfd), to one long-lived
worker process (:mod:`catalog._sha_worker`, stdlib only), which hashes it while this
process plans and writes the batch on the other core (decision 062).

The answer is the same bytes either way: where the worker cannot be used (it is busy
with another thread's batch, failed to start, died, or this is a forked child that
inherited it) the batch is hashed here. A worker that fails is stopped and a new
one tried on a later batch, up to :data:`_MAX_FAILURES` times. The worker exits when
its stdin closes: at this process's exit (``atexit``) or its death.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
from contextlib import suppress
from pathlib import Path

import numpy as np
import pyarrow as pa

from catalog._sha_worker import ACK, HEADER

__all__ = ["MIN_ROWS", "sha256_prefixes"]

log = logging.getLogger(__name__)

#: Rows from which a batch goes to the worker: below it the pipe's round trip and the
#: worker's start (~20 ms, once) cost more than the hashing they move.
MIN_ROWS = 8192
#: Messages turned into Python ``bytes`` at a time when hashing here (a large batch
#: never holds every message as an object at once).
_LOCAL_CHUNK = 1 << 16
#: Rows a request at most: the shared file holds one request and its answer (~17 MB
#: of clip ids).
_REQUEST_ROWS = 1 << 17
#: Failed workers after which this process hashes everything itself.
_MAX_FAILURES = 3
_SCRIPT = Path(__file__).with_name("_sha_worker.py")


def sha256_prefixes(messages: pa.Array, width: int = 32) -> bytes:
    """The first ``width`` bytes of the SHA-256 of each message, back to back.

    Args:
        messages: ``large_binary`` messages, no nulls.
        width: Bytes kept of each digest, 1 to 32.

    Returns:
        ``len(messages) * width`` bytes: message ``i``'s at ``i * width``.
    """
    if not 1 <= width <= 32:
        raise ValueError(f"width must be 1..32, got {width}")
    if messages.type != pa.large_binary() or messages.null_count:
        raise ValueError("messages: large_binary without nulls")
    if len(messages) >= MIN_ROWS and (answer := _WORKER.ask(messages)) is not None:
        if width == 32:
            return answer
        return np.frombuffer(answer, np.uint8).reshape(-1, 32)[:, :width].tobytes()
    return _here(messages, width)


def _here(messages: pa.Array, width: int) -> bytes:
    """:func:`sha256_prefixes` in this process (Arrow makes each chunk's ``bytes`` in
    C++: 8 % less CPU than slicing a memoryview per row)."""
    sha = hashlib.sha256
    parts: list[bytes] = []
    for start in range(0, len(messages), _LOCAL_CHUNK):
        chunk = messages.slice(start, _LOCAL_CHUNK).to_pylist()
        parts += [sha(m).digest()[:width] for m in chunk]
    return b"".join(parts)


class _Worker:
    """This process's one worker (started on first use), for one batch at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1  # the file shared with the worker
        self._failures = 0

    def ask(self, messages: pa.Array) -> bytes | None:
        """The worker's digests of ``messages``, or None when it cannot give one (hash here)."""
        if self._failures >= _MAX_FAILURES or not self._lock.acquire(blocking=False):
            return None  # busy: another thread's batch is in it
        try:
            proc = self._proc or self._start()
            if proc is None:
                return None
            try:
                return _exchange(proc, self._fd, messages)
            except (OSError, ValueError) as exc:  # a dead or broken worker
                log.warning("SHA-256 worker failed (%s); hashing in process", exc)
                self._failures += 1
                self._stop()
                return None
            except BaseException:
                # Interrupted mid-request (KeyboardInterrupt): the worker may still
                # answer it into the shared file, so it never serves another.
                proc.kill()
                self._stop()
                raise
        finally:
            self._lock.release()

    def _start(self) -> subprocess.Popen[bytes] | None:
        if not sys.executable or getattr(sys, "frozen", False):
            self._failures = _MAX_FAILURES  # no interpreter to run the script with
            return None
        try:
            self._fd = _shared_file()
            # -I -S: no site-packages, no PYTHONPATH: the script needs the stdlib only.
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.fspath(_SCRIPT), str(self._fd)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                pass_fds=(self._fd,),
            )
        except OSError as exc:
            log.warning("SHA-256 worker did not start (%s); hashing in process", exc)
            self._failures += 1
            self._close_fd()
            return None
        return self._proc

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with suppress(OSError):
                os.close(fd)

    def _stop(self) -> None:
        """Close the worker's stdin (it exits), reap it, drop the shared file."""
        proc, self._proc = self._proc, None
        self._close_fd()
        if proc is None:
            return
        _close_pipes(proc)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the worker (at exit)."""
        with self._lock:
            self._stop()

    def forget(self) -> None:
        """In a forked child: the inherited worker is the parent's; never use it."""
        self._lock = threading.Lock()
        proc, self._proc = self._proc, None
        self._close_fd()  # this process's copy: the parent's stays open
        if proc is not None:
            _close_pipes(proc)
            proc.returncode = 0  # not our child: nothing to reap, nothing to warn of


def _shared_file() -> int:
    """A file for requests and answers: in memory where the system has memfds."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("vidlake-sha256", 0)
    fd, path = tempfile.mkstemp(prefix="vidlake-sha256-")
    os.unlink(path)
    return fd


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with suppress(OSError, ValueError):
                stream.close()


def _exchange(proc: subprocess.Popen[bytes], fd: int, messages: pa.Array) -> bytes:
    """The worker's digests of ``messages`` (:mod:`catalog._sha_worker`'s protocol),
    in requests of at most :data:`_REQUEST_ROWS`, copied straight from the Arrow
    buffers."""
    assert proc.stdin is not None and proc.stdout is not None
    _, offsets_buf, data_buf = messages.buffers()
    every = np.frombuffer(offsets_buf, np.int64)[messages.offset :][: len(messages) + 1]
    parts = []
    for first in range(0, len(messages), _REQUEST_ROWS):
        offsets = every[first : first + _REQUEST_ROWS + 1]
        n, start, end = len(offsets) - 1, int(offsets[0]), int(offsets[-1])
        at = 8 * (n + 1)
        _pwrite(fd, (offsets - start).data, 0)
        if end > start:
            assert data_buf is not None
            _pwrite(fd, memoryview(data_buf)[start:end], at)
        proc.stdin.write(HEADER.pack(n, end - start))
        proc.stdin.flush()
        ack = proc.stdout.read(ACK.size)
        if len(ack) != ACK.size or ACK.unpack(ack)[0] != n:
            raise ValueError("the worker did not answer")
        parts.append(os.pread(fd, 32 * n, at + end - start))
        if len(parts[-1]) != 32 * n:
            raise ValueError(f"the worker answered {len(parts[-1])} of {32 * n} bytes")
    return b"".join(parts)


def _pwrite(fd: int, data: memoryview, at: int) -> None:
    if os.pwrite(fd, data, at) != data.nbytes:
        raise OSError(f"short write to the worker's file at {at}")


_WORKER = _Worker()
atexit.register(_WORKER.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER.forget)
