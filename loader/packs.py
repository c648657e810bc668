"""Pack entries: small members read at their offsets from one cached pack object.

A row whose latent is a small member of a larger object (``member_sha256`` differs
from ``object_sha256``) is, by default, fetched into the node cache as its own entry:
one lease, one file, one ``open`` per sample. At kilobyte samples those per-file costs
are most of a row (docs/cache.md). A row goes through a **pack entry** instead when

* its format is ``safetensors``,
* its member is at most 1/:data:`MEMBER_FRACTION` of its object, and
* the object is at most ``pack_max_bytes`` (:data:`DEFAULT_PACK_MAX_BYTES`; 0: never).

The cache then holds the whole object, keyed by its SHA-256 and accounted (budget,
eviction) by its size: one entry, one lease and one open file per pack and part of a
step, whatever the number of its rows. :func:`read_pack_rows` groups a part's rows by
pack; once a row of the step taught the layout, members up to :data:`BULK_MAX` are
copied out of the pack's per-process mapping (:mod:`loader.packmaps`) by one numpy
gather per tensor, larger ones read in one ``preadv`` each (header into a scratch
buffer, the tensors straight into the batch row): decision 060.

**Proof.** The pack is hashed whole once, when it is downloaded. A member is hashed
against its ``member_sha256`` over the very bytes read into the batch the first time
this process reads it from that pack file (same device, inode, size, mtime, ctime,
offset), whatever ``verify_hits``: that is the member's download check, which a
member fetched alone gets from the cache. A pack is never hashed again to serve a
member. A member that fails its hash has the pack hashed whole once (on a hit): a
corrupt cached copy is dropped (``corrupt_refetches`` + 1) and the member read again
from a fresh, verified download; a pack that passes means the stored member itself
is corrupt, which the dataset reports as any corrupt member (:mod:`loader.corrupt`).

Rows the pack path cannot land (a header that does not describe the batch's layout,
leading frames cut by the bucket, a short read) fall back to the per-member path,
which raises the usual errors.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Container, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray

from catalog.errors import ChecksumMismatch, IntegrityError, VidlakeError
from loader.batch import BatchBuffer
from loader.cache import Fetch
from loader.decode import keep_frames, safetensors_header_specs, whole_file_order
from loader.leases import LeaseSet
from loader.packmaps import mapped

__all__ = [
    "BULK_MAX",
    "DEFAULT_PACK_MAX_BYTES",
    "FALLBACK",
    "MEMBER_FRACTION",
    "UNPACKABLE",
    "group_packed",
    "read_pack_rows",
]

#: A member goes through its pack's entry only when it is at most this fraction of it.
MEMBER_FRACTION = 16
#: Objects larger than this are never cached whole for their members (the default).
DEFAULT_PACK_MAX_BYTES = 256 << 20
#: A row's result meaning "read it the per-member way" (see the module docstring).
FALLBACK = object()
#: As :data:`FALLBACK`, because the pack itself failed its hash on download.
UNPACKABLE = object()
#: Members up to this size are copied a step's pack at a time out of the pack's mapping
#: and a step of them is one part (decision 060); larger ones keep one ``preadv`` a row.
BULK_MAX = 64 << 10

log = logging.getLogger("vidlake.cache")

#: A step's index columns as lists, one value per row (as loader.dataset's).
_Columns = dict[str, list[Any]]


def group_packed(
    cols: _Columns,
    part: range,
    object_size: Callable[[str], int],
    max_bytes: int,
    unpackable: Container[str] = (),
) -> tuple[dict[str, list[int]], list[int]]:
    """Rows of ``part`` that go through a pack entry, by object, and the rest.

    ``object_size`` is asked only for objects that may qualify (an object's size is
    not in the index); objects in ``unpackable`` (a pack whose stored bytes failed
    their SHA-256 on download) are read member by member."""
    packs: dict[str, list[int]] = {}
    rest: list[int] = []
    if max_bytes <= 0:
        return packs, list(part)
    objs, members, offs, lens = (
        cols["object_sha256"],
        cols["member_sha256"],
        cols["offset"],
        cols["length"],
    )
    fmts = cols["format"]
    bound = max_bytes // MEMBER_FRACTION
    sizes: dict[str, int] = {}  # a step's rows share a few packs: size each once here
    for i in part:
        obj, n = objs[i], lens[i]
        if (
            obj == members[i]
            or fmts[i] != "safetensors"
            or obj in unpackable
            or n > bound
            or offs[i] + n > max_bytes
        ):
            rest.append(i)
            continue
        size = sizes.get(obj)
        if size is None:
            size = sizes[obj] = _size(object_size, obj)
        if size > max_bytes or n * MEMBER_FRACTION > size:
            rest.append(i)
        else:
            packs.setdefault(obj, []).append(i)
    return packs, rest


def _size(object_size: Callable[[str], int], obj: str) -> int:
    """The object's size; one that cannot be sized counts as too large to pack (the
    per-member path then reports what is wrong with it, row by row)."""
    try:
        return object_size(obj)
    except VidlakeError:
        return 1 << 62


class _Reader:
    """One pack file open for one part: its rows copied into the batch.

    Rows of the step's one-read layout are copied out of the pack's mapping
    (:mod:`loader.packmaps`) together: per tensor one numpy gather of the rows'
    bytes into their batch rows, one vectorised compare of every row's header with
    the layout's, and, for a member this process has not proved from this very file,
    one hash. Per-row Python is a dict look-up (the proof); the copies run without
    the GIL. Other rows (the one that teaches the layout, another header, a member
    past the file's end) are read alone by :meth:`_whole`."""

    def __init__(self, held: LeaseSet, fd: int, cols: _Columns, buffer: BatchBuffer, pack: str):
        self.fd, self.cols, self.buffer = fd, cols, buffer
        st = os.fstat(fd)
        fp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        #: {offset: member} proved from this file by this process (shared, live).
        self.proved = held._cache._proved_members(pack, fp)
        self._count = held._cache._member_proved
        #: The file's bytes (None: it cannot be mapped; every row is read alone).
        self.data = mapped(pack, fp, fd)

    def rows(self, rows: Sequence[int]) -> tuple[dict[int, object], dict[int, str]]:
        """Each row's result, and the digests of the rows whose member failed its hash."""
        out: dict[int, object] = {}
        failed: dict[int, str] = {}
        offs, lens, keys_col = self.cols["offset"], self.cols["length"], self.cols["tensor_keys"]
        fast: _Fast | None = None
        bulk: list[int] = []
        for i in sorted(rows, key=offs.__getitem__):  # file order
            if fast is None:
                fast = self._fast()
            if fast is None or lens[i] != fast.size or keys_col[i] != fast.keys:
                self._alone(i, out, failed)
            elif self.data is None or fast.size > BULK_MAX:
                self._alone(i, out, failed, fast)
            else:
                bulk.append(i)
        if bulk:
            assert fast is not None
            try:
                self._bulk(bulk, fast, out, failed)
            except Exception as exc:  # never seen: the rows fail, each as its own
                out.update(dict.fromkeys((i for i in bulk if i not in out), exc))
        return out, failed

    def _alone(
        self, i: int, out: dict[int, object], failed: dict[int, str], fast: _Fast | None = None
    ) -> None:
        """Read row ``i`` by itself (in one ``preadv`` of the step's layout ``fast``,
        else :meth:`_whole`), keeping its result or failure."""
        cols = self.cols
        off, n, member = cols["offset"][i], cols["length"][i], cols["member_sha256"][i]
        try:
            got = self._whole(i, off, n, member) if fast is None else self._one(i, fast)
        except Exception as exc:  # this row's failure is its own
            got = exc
        if isinstance(got, str):
            failed[i] = got
        else:
            out[i] = got

    def _one(self, i: int, fast: _Fast) -> object:
        """Row ``i`` of the step's layout in one ``preadv``: header into a scratch
        buffer, tensors straight into the batch row (members over :data:`BULK_MAX`:
        the read releases the GIL for the whole copy, which numpy's gather does not)."""
        off, member = self.cols["offset"][i], self.cols["member_sha256"][i]
        head = bytearray(len(fast.known))
        views = [rows2d[i] for rows2d, _, _ in fast.grids]
        if os.preadv(self.fd, [head, *views], off) != fast.size:
            return FALLBACK
        if head != fast.known:
            return self._whole(i, off, fast.size, member)
        if self.proved.get(off) == member:
            return None
        h = hashlib.sha256(head)
        for v in views:
            h.update(v)
        return self._proved(off, member, h.hexdigest())

    def _bulk(
        self, rows: list[int], fast: _Fast, out: dict[int, object], failed: dict[int, str]
    ) -> None:
        """Copy ``rows`` (members of the step's layout, in file order) out of the mapping.

        Members of one size ``n`` at offsets of one residue modulo ``n`` (a pack of
        equal members: all of them) are rows of one strided ``(k, n)`` view of the
        file, so each tensor is one fancy-indexed copy into its batch rows."""
        data = self.data
        assert data is not None
        offs = self.cols["offset"]
        n, hlen = fast.size, len(fast.known)
        off = np.array([offs[i] for i in rows], dtype=np.int64)
        dest = np.array(rows, dtype=np.int64)
        inside = (off >= 0) & (off + n <= len(data))
        for j in np.flatnonzero(~inside).tolist():
            out[rows[j]] = FALLBACK  # past the file's end: as a short read
        residue = off % n
        for res in np.unique(residue[inside]).tolist():
            pick = np.flatnonzero(inside & (residue == res))
            count = (len(data) - res) // n  # members of this residue wholly in the file
            at = (off[pick] - res) // n
            heads = np.ndarray((count, hlen), np.uint8, data, res, (n, 1))[at]
            same = (heads == fast.header).all(axis=1)
            for j in pick[~same].tolist():
                self._alone(rows[j], out, failed)  # another header: checked alone
            at, to, heads = at[same], dest[pick[same]], heads[same]
            for rows2d, start, stop in fast.grids:
                # Whole words where the row size allows: numpy then copies each row
                # with its contiguous word loop (opaque void items kept the GIL; bytes
                # went slower).
                word = next(w for w in (8, 4, 2, 1) if (stop - start) % w == 0)
                shape, strides = (count, (stop - start) // word), (n, word)
                src = np.ndarray(shape, np.dtype(f"<u{word}"), data, res + start, strides)
                rows2d.view(src.dtype)[to] = src[at]
            self._prove(pick[same].tolist(), rows, heads, fast, out, failed)

    def _prove(
        self,
        picked: list[int],
        rows: list[int],
        heads: NDArray[np.uint8],
        fast: _Fast,
        out: dict[int, object],
        failed: dict[int, str],
    ) -> None:
        """Each copied row's result: landed, or the digest of a member that failed its
        first hash in this process (taken over its header and its batch bytes)."""
        offs, mems, proved = self.cols["offset"], self.cols["member_sha256"], self.proved
        for k, j in enumerate(picked):
            i = rows[j]
            off, member = offs[i], mems[i]
            if proved.get(off) == member:
                out[i] = None
                continue
            h = hashlib.sha256(heads[k])
            for rows2d, _, _ in fast.grids:
                h.update(rows2d[i])
            bad = self._proved(off, member, h.hexdigest())
            if bad is None:
                out[i] = None
            else:
                failed[i] = bad

    def _fast(self) -> _Fast | None:
        """The step's one-read layout, once a row taught it (``buffer.whole_rows``)."""
        taught, layout = self.buffer.whole_rows, self.buffer.layout
        if taught is None or layout is None:
            return None
        cached = self.buffer.pack_layout
        if cached is not None and cached[0] is taught:
            # Made once a step, not once a pack and part (~30 µs of torch views each).
            fast: _Fast = cached[1]
            return fast
        known, order, asked = taught
        grids = []
        start = len(known)
        for k in order:
            flat = self.buffer.tensors[k].reshape(-1).view(torch.uint8).numpy()
            nb = len(flat) // self.buffer.rows
            if nb:  # an empty tensor has nothing to copy
                grids.append((flat.reshape(self.buffer.rows, nb), start, start + nb))
            start += nb
        header = np.frombuffer(known, dtype=np.uint8)
        fast = _Fast(known, header, list(asked), grids, start)
        self.buffer.pack_layout = (taught, fast)
        return fast

    def _proved(self, off: int, member: str, digest: str) -> str | None:
        if digest != member:
            return digest
        self.proved[off] = member
        self._count()
        return None

    def _whole(self, i: int, off: int, n: int, member: str) -> object:
        """Read the member whole, prove it, parse its header, copy its tensors in; it
        teaches the step's later rows the one-read layout."""
        data = os.pread(self.fd, n, off)
        if len(data) != n:
            return FALLBACK
        digest = member if self.proved.get(off) == member else hashlib.sha256(data).hexdigest()
        if bad := self._proved(off, member, digest):
            return bad
        keys = self.cols["tensor_keys"][i]
        hlen = int.from_bytes(data[:8], "little")
        what = f"safetensors latent {member}"
        if n < 8 or hlen > n - 8:
            raise IntegrityError(f"{what}: header length {hlen} exceeds the member")
        specs = safetensors_header_specs(data[8 : 8 + hlen], n, keys, what)
        frames = self.cols["num_frames"][i]
        layout = {k: (s.dtype, keep_frames(s.shape, frames)) for k, s in specs.items()}
        order = whole_file_order(specs, 8 + hlen, n)
        if not order or any(layout[k][1] != specs[k].shape for k in order):
            return FALLBACK  # leading frames only, or gaps: the per-member path
        dest = self.buffer.row_bytes(i, layout)
        if dest is None:
            return FALLBACK  # a misfit: the per-member path names both layouts
        view = memoryview(data)
        for k, spec in specs.items():
            dest[k][:] = view[spec.start : spec.end]
        self.buffer.whole_rows = (data[: 8 + hlen], tuple(order), tuple(keys))
        return None


class _Fast(NamedTuple):
    """A step's one-read layout: the header every row repeats (bytes and array), the
    tensor keys asked, each tensor's batch rows as a ``(rows, bytes)`` array with its
    byte range in the member, in file order, and the member size that layout implies."""

    known: bytes
    header: NDArray[np.uint8]
    keys: list[str]
    grids: list[tuple[NDArray[np.uint8], int, int]]
    size: int


def read_pack_rows(
    held: LeaseSet,
    pack: str,
    size: int,
    fetch: Fetch,
    rows: Sequence[int],
    cols: _Columns,
    buffer: BatchBuffer,
) -> dict[int, object]:
    """Read ``rows`` (members of object ``pack`` of ``size`` bytes) into ``buffer``
    through the pack's cache entry.

    Returns each row's result: None (it landed), :data:`FALLBACK` (read it the
    per-member way) or a :class:`ChecksumMismatch` (its stored member is corrupt).
    A stored pack that fails its own SHA-256 on download sends every row to the
    per-member path, which checks each member alone (a rotten byte costs only its
    member; such rows come back :data:`UNPACKABLE` and the caller remembers the pack).
    """
    try:
        path, proof = held.open_pack(pack, size, fetch)
    except ChecksumMismatch as exc:
        log.warning(
            "pack %s failed its SHA-256 on download; its members are read one by one: %s",
            pack,
            exc,
            extra={"sha256": pack, "event": "pack_unpackable"},
        )
        return dict.fromkeys(rows, UNPACKABLE)
    try:
        out, failed = _read_all(held, path, pack, rows, cols, buffer)
    except FileNotFoundError:
        if proof is None:
            raise
        # Another part of the node dropped this cached copy (a member of it failed
        # there) between our lease and our open: a failed proof, so fetch it again.
        held.prove(proof)  # False: the file is gone; returns our lease
        path, proof = held.path(pack, size, fetch), None
        out, failed = _read_all(held, path, pack, rows, cols, buffer)
    if failed and proof is not None and not held.prove(proof):
        # The cached copy was at fault (dropped): read those rows from a fresh download.
        path = held.path(pack, size, fetch)
        again, failed = _read_all(held, path, pack, list(failed), cols, buffer)
        out.update(again)
    for i, digest in failed.items():
        out[i] = _member_error(cols, i, pack, digest)
    return out


def _read_all(
    held: LeaseSet, path: str, pack: str, rows: Sequence[int], cols: _Columns, buffer: BatchBuffer
) -> tuple[dict[int, object], dict[int, str]]:
    """Each row's result, and the digests of the rows whose member failed its hash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _Reader(held, fd, cols, buffer, pack).rows(rows)
    finally:
        os.close(fd)


def _member_error(cols: _Columns, i: int, pack: str, digest: str) -> ChecksumMismatch:
    member, off = cols["member_sha256"][i], cols["offset"][i]
    return ChecksumMismatch(
        f"member of {pack}@{off}: SHA-256 {digest} does not match {member}",
        sha256=member,
        actual=digest,
    )
