"""Reading one safetensors row into its batch slot, verifying it from what was read.

:func:`read_safetensors_row` is the loader's path for the common latent format. It
reads the header, then each tensor's bytes straight into the row of the batch tensor
(one copy from the page cache). When the node cache still owes the hit a SHA-256
(``verify_hits`` and a file this process has not verified), the hash is taken over the
header and the row's bytes just read, in file order, instead of over a separate read
of the file: each file is read once (docs/cache.md, "hashing what was read"). When the
row's bytes are not the whole file (a subset of tensors, leading frames only) the file
is hashed as before. A failed hash drops the entry; the row is read again from a
freshly downloaded, verified copy.

Once one row of a step turned out to be its header followed by its tensors read
whole, the step's later rows are read in **one** ``preadv`` (header and tensors into
the batch row at once, the header's length being what the file's size leaves), and
the header read is checked to describe exactly that; anything else (another header,
a misfit, a short read) is read again the ordinary way. At kilobyte samples a read
syscall is a fair part of what a row costs. That one-read layout (the tensors' bytes
in file order, as slices of the batch tensors) is made once a step, not once a row
(:func:`_one_read`). Without ``verify_hits`` that one read also
asks a spare byte past the row's end, so it tells whether the file is exactly its
size: such a row is open, read, close, with no ``stat`` (a file of the wrong size is
dropped and fetched again, as a failed stat check drops it).
"""

from __future__ import annotations

import hashlib
import os
from typing import NamedTuple

from catalog.errors import IntegrityError
from loader.batch import BatchBuffer
from loader.cache import Fetch
from loader.decode import (
    keep_frames,
    pread_frames_into,
    safetensors_header_fd,
    safetensors_header_specs,
    whole_file_order,
)
from loader.leases import LeaseSet

__all__ = ["read_safetensors_row"]

#: (landed in the batch buffer, digest of the whole file as read or None, its fstat,
#: whether the file was seen to be exactly ``size`` bytes long)
_Read = tuple[bool, str | None, os.stat_result | None, bool]


def read_safetensors_row(
    held: LeaseSet,
    member: str,
    size: int,
    fetch: Fetch,
    keys: list[str],
    frames: int | None,
    buffer: BatchBuffer,
    i: int,
) -> str | None:
    """Read row ``i``'s latent (object ``member`` of ``size`` bytes) into ``buffer``.

    Returns None when it landed there, else the path of a verified cached copy whose
    tensors do not fit the batch (the caller decodes it for the error).

    Raises:
        IntegrityError: the verified file is not a well-formed safetensors latent.
    """
    path, proof = held.open(member, size, fetch, sized=True)
    hashed = proof is not None and bool(proof.fingerprint)  # else it owes the size only
    try:
        landed, digest, st, exact = _read(
            path, size, member, keys, frames, buffer, i, hashed, proof is not None
        )
    except Exception:  # a malformed header, a short read, a vanished file, ...
        if proof is None or held.prove(proof):
            raise  # the verified bytes themselves are at fault, not the cached copy
    else:
        if proof is None:
            return None if landed else path
        if not hashed and exact:
            return None if landed else path
        if held.settle(proof, digest, st) if digest and st else held.prove(proof):
            return None if landed else path
    # The cached file failed its check and was dropped: read a fresh, verified copy.
    path = held.path(member, size, fetch)
    landed, _, _, _ = _read(path, size, member, keys, frames, buffer, i, False, False)
    return None if landed else path


def _read(
    path: str,
    size: int,
    member: str,
    keys: list[str],
    frames: int | None,
    buffer: BatchBuffer,
    i: int,
    digest: bool,
    sized: bool,
) -> _Read:
    """Read row ``i`` from ``path``; hash what was read when ``digest``; when
    ``sized``, tell whether the file is exactly ``size`` bytes (from the one-read path's
    spare byte, else an ``fstat``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        got = _read_as_the_step(fd, size, keys, frames, buffer, i, member)
        if got is None:
            got = _read_header_first(fd, size, keys, frames, buffer, i, member)
            if got is None:
                return False, None, None, False
        header, whole, exact = got
        if sized and not exact:
            exact = os.fstat(fd).st_size == size
        if not digest or not whole:
            return True, None, None, exact
        h = hashlib.sha256(header)
        for view in whole:
            h.update(view)
        return True, h.hexdigest(), os.fstat(fd), exact
    finally:
        os.close(fd)


#: (the header's bytes as read, the row's bytes per tensor in file order when the
#: header and those bytes are the whole file, else ``[]``, whether the read saw the
#: file end at exactly its size)
_Got = tuple[bytes, list[memoryview], bool]


class _OneRead(NamedTuple):
    """A step's one-read layout (:func:`_one_read`)."""

    #: The header bytes of the row that taught it, and the tensor keys it asked.
    known: bytes
    asked: list[str]
    #: The tensor names in file order, each's bytes as (the whole batch tensor, a row).
    order: tuple[str, ...]
    flats: list[tuple[memoryview, int]]
    #: Bytes of a row's tensors (a file of ``size`` bytes has ``size - row`` of header).
    row: int


def _one_read(buffer: BatchBuffer) -> _OneRead | None:
    """The step's one-read layout, once a row taught it (``buffer.whole_rows``): made
    once a step and shared by its fetch threads, so a row's slots are a slice a tensor
    (it was a locked layout check and a dict of every tensor's row, once a row)."""
    taught = buffer.whole_rows
    if taught is None or buffer.layout is None:
        return None
    cached = buffer.one_read
    if cached is not None and cached[0] is taught:
        fast: _OneRead = cached[1]
        return fast
    known, order, asked = taught
    flats = buffer.flats(order)
    fast = _OneRead(known, list(asked), order, flats, sum(n for _, n in flats))
    buffer.one_read = (taught, fast)  # two threads may race here: both make the same
    return fast


def _read_header_first(
    fd: int,
    size: int,
    keys: list[str],
    frames: int | None,
    buffer: BatchBuffer,
    i: int,
    member: str,
) -> _Got | None:
    """Read the header, then each tensor's bytes into row ``i``; None when the row's
    layout is not the batch's. A row that is its header and its tensors read whole
    teaches the step's later rows to do it in one read (:func:`_read_as_the_step`)."""
    specs, header = safetensors_header_fd(fd, size, keys, f"safetensors latent {member}")
    layout = {k: (s.dtype, keep_frames(s.shape, frames)) for k, s in specs.items()}
    dest = buffer.row_bytes(i, layout)
    if dest is None:
        return None
    for k, spec in specs.items():
        pread_frames_into(fd, spec, layout[k][1], dest[k])
    order = whole_file_order(specs, len(header), size)
    if any(layout[k][1] != specs[k].shape for k in order):
        order = []  # leading frames only: not the whole file
    if order:
        buffer.whole_rows = (header, tuple(order), tuple(keys))
    return header, [dest[k] for k in order], False


def _read_as_the_step(
    fd: int,
    size: int,
    keys: list[str],
    frames: int | None,
    buffer: BatchBuffer,
    i: int,
    member: str,
) -> _Got | None:
    """Read row ``i`` in one ``preadv`` when an earlier row of the step was a file of
    header then whole tensors (:func:`_one_read`): the header is what the file's size
    leaves before the row's bytes. A header byte for byte that row's, with the same
    tensor keys asked, describes the same tensors; another is checked to describe
    exactly that (same tensors, dtypes, shapes, order, no gap). None when it does not
    or the read came up short: the caller reads the row the ordinary way, over
    whatever this wrote into its slot."""
    fast = _one_read(buffer)
    if fast is None:
        return None
    if size - fast.row <= 8:  # smaller than a row of the batch: a misfit, told apart
        return None  # by the ordinary path (a negative bytearray raised ValueError here)
    views = [flat[i * n : (i + 1) * n] for flat, n in fast.flats]
    head = bytearray(size - fast.row)
    spare = bytearray(1)  # a byte past the end: a longer file fills it
    if os.preadv(fd, [head, *views, spare], 0) != size:
        return None
    if head == fast.known and keys == fast.asked:
        return fast.known, views, True
    if int.from_bytes(head[:8], "little") != len(head) - 8:
        return None
    try:
        what = f"safetensors latent {member}"
        specs = safetensors_header_specs(bytes(head[8:]), size, keys, what)
    except IntegrityError:
        return None  # the ordinary path reads it again and raises with the details
    header = bytes(head)
    whole = {
        k: (s.dtype, s.shape) for k, s in specs.items() if keep_frames(s.shape, frames) == s.shape
    }
    if whole != buffer.layout or whole_file_order(specs, len(header), size) != list(fast.order):
        return None
    return header, views, True
