"""The SHA-256 worker process of :mod:`catalog.hash_worker` (stdlib only).

Run as a script (``python -I -S _sha_worker.py``), so that it imports nothing of the
project or its dependencies: it starts in ~20 ms and needs no environment. It reads
requests from stdin and answers each on stdout, until stdin ends (its parent closed
it, or died)::

    request:  n, size (2 x little-endian uint64), n + 1 offsets (int64), size bytes
    answer:   the n messages' SHA-256 digests (32 bytes each), back to back

Message ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (``offsets[0]`` is 0).
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import sys
from typing import BinaryIO

HEADER = struct.Struct("<QQ")


def _read(stream: BinaryIO, size: int) -> bytes | None:
    """Exactly ``size`` bytes, or None at the end of the stream."""
    data = stream.read(size)
    return data if len(data) == size else None


def answer(offsets: bytes, data: bytes) -> bytes:
    """The SHA-256 digest of each message (see the module doc), back to back. Slices
    of ``bytes``, whole digests: ~25 % less CPU than memoryview slices or trimmed
    digests (the parent trims them in numpy)."""
    bounds = memoryview(offsets).cast("q").tolist()
    sha = hashlib.sha256
    return b"".join([sha(data[a:b]).digest() for a, b in itertools.pairwise(bounds)])


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer requests from ``inp`` on ``out`` until ``inp`` ends."""
    while (head := _read(inp, HEADER.size)) is not None:
        n, size = HEADER.unpack(head)
        offsets = _read(inp, 8 * (n + 1))
        data = _read(inp, size)
        if offsets is None or data is None:
            return
        out.write(answer(offsets, data))
        out.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
