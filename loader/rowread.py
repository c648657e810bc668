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
"""

from __future__ import annotations

import hashlib
import os

from loader.batch import BatchBuffer
from loader.cache import Fetch
from loader.decode import keep_frames, pread_frames_into, safetensors_header_fd, whole_file_order
from loader.leases import LeaseSet

__all__ = ["read_safetensors_row"]

#: (landed in the batch buffer, digest of the whole file as read or None, its fstat)
_Read = tuple[bool, str | None, os.stat_result | None]


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
    path, proof = held.open(member, size, fetch)
    try:
        landed, digest, st = _read(path, size, member, keys, frames, buffer, i, proof is not None)
    except Exception:  # a malformed header, a short read, a vanished file, ...
        if proof is None or held.prove(proof):
            raise  # the verified bytes themselves are at fault, not the cached copy
    else:
        if proof is None:
            return None if landed else path
        if held.settle(proof, digest, st) if digest and st else held.prove(proof):
            return None if landed else path
    # The cached file failed its hash and was dropped: read a fresh, verified copy.
    path = held.path(member, size, fetch)
    landed, _, _ = _read(path, size, member, keys, frames, buffer, i, False)
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
) -> _Read:
    fd = os.open(path, os.O_RDONLY)
    try:
        specs, header = safetensors_header_fd(fd, size, keys, f"safetensors latent {member}")
        layout = {k: (s.dtype, keep_frames(s.shape, frames)) for k, s in specs.items()}
        dest = buffer.row_bytes(i, layout)
        if dest is None:
            return False, None, None
        for k, spec in specs.items():
            pread_frames_into(fd, spec, layout[k][1], dest[k])
        order = whole_file_order(specs, len(header), size) if digest else []
        if not order or any(layout[k][1] != specs[k].shape for k in order):
            return True, None, None
        h = hashlib.sha256(header)
        for k in order:
            h.update(dest[k])
        return True, h.hexdigest(), os.fstat(fd)
    finally:
        os.close(fd)
