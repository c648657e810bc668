"""Sorted run files: the ``clips`` and ``latents`` keys of the on-disk key index.

A view's keys of one digest width are a few immutable files, each a sorted, duplicate
free array of fixed-width digests (:mod:`catalog.key_index_rows` says which), merged
as they accumulate: a log-structured merge tree with no memtable (the writer's
pending keys, :mod:`catalog.key_index_pending`, are that). Membership of a whole
batch is one pass per run: the in-memory fence (the first 8 bytes of every
:data:`BLOCK`-th digest) names the few blocks the batch's keys can be in, one
``preadv`` per range of them reads those blocks into one buffer (neighbours less
than :data:`GAP` blocks apart in one read), and a binary search of every key at once
within its block (numpy steps over the whole batch) answers them all. A probe costs one block
read per key and run, not a B-tree leaf per key as in SQLite (3x cheaper at 16M
keys, docs/decisions/042-sorted-key-runs.md); no mmap, so the file's pages do
not count in the process's RSS.

File layout (little-endian): a 32-byte header (magic, width, block, count), the
digests, the fence (one ``uint64`` head per block), a checksum per block (the
``uint64`` sum of its words, zero padded), and an 8-byte trailer: the CRC-32 of the
header, fence and checksums, and an end mark. The fence and checksums are read once
per process and run; every block a probe reads is checked against its checksum, so
a damaged file (truncated, overwritten, a flipped byte) raises :class:`RunDamaged`
and is never read as "absent".

The SQLite file is the manifest: table ``runs`` names each view's runs, and a run
is named in the same transaction as the view's ``meta`` state, so the consistency
rules of :mod:`catalog.key_index` hold unchanged. A run is written to a temporary
file and fsynced first; it is renamed to its final name, and named in ``runs``, while
the transaction holds SQLite's write lock. Files that no row names are removed
after the transaction that dropped them, and, as orphans of a crash, by the sweep
that runs under the write lock when a process opens the index. A reader that finds
a run gone (a merge replaced it meanwhile) re-reads the manifest.

Runs are merged (:meth:`KeyRuns.settle`) when the smaller runs together reach
1/:data:`FAN` of a larger one: ~log_FAN(n) runs, each key rewritten ~FAN times per
level, by a streaming merge of chunks of :data:`CHUNK_KEYS` keys (bounded memory).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import struct
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from catalog.atomic import fsync_dir
from catalog.key_index_rows import Packed, heads

__all__ = [
    "BLOCK",
    "FAN",
    "SCHEMA",
    "KeyRuns",
    "RunDamaged",
    "merge_plan",
]

log = logging.getLogger(__name__)

#: Digests per block: the fence and the block sums hold 16 bytes per block in memory
#: (0.125 bytes a key: 2 MB at 16M keys) and a probe reads one block per key.
BLOCK = 128
#: Blocks of other keys read rather than a gap split into two reads (a ``preadv``,
#: ~1.4 µs on the test VM, costs more than copying and summing a few 2 KiB blocks).
GAP = 3
#: Keys per run written at once and per chunk of a merge's inputs.
CHUNK_KEYS = 1 << 20
#: Blocks per probe buffer: a batch is probed in parts, each block read at most once,
#: into a buffer of at most this many blocks (8-10 MB).
PROBE_BLOCKS = 4096
#: Distinct blocks a part's keys may name (each read with up to :data:`GAP` blocks
#: of others between it and the next).
_PART_BLOCKS = PROBE_BLOCKS // (GAP + 1)
#: Size ratio of neighbouring runs (see :func:`merge_plan`).
FAN = 8
#: Rows read per key up to which a probe searches all the rows' heads at once, not
#: each key within its blocks (:func:`_member`; decision 058).
_DENSE = 16

_MAGIC = b"VLKRUN1\x00"
_END = b"VLKE"
_HEADER = struct.Struct("<8sIIQQ")
_TRAILER = struct.Struct("<I4s")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY, view TEXT NOT NULL, width INTEGER NOT NULL, count INTEGER NOT NULL);
"""


class RunDamaged(Exception):
    """A run file is missing, truncated or its content does not match its checksums."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"key run {path} is damaged: {why}")
        self.path = path


@dataclass(frozen=True)
class _Listed:
    name: str
    width: int
    count: int


@dataclass(frozen=True)
class _Open:
    """An open run: its descriptor, fence and block checksums."""

    path: Path
    fd: int
    width: int
    count: int
    fence: NDArray[np.uint64]
    sums: NDArray[np.uint64]


def _block_sums(data: NDArray[np.uint8], width: int) -> NDArray[np.uint64]:
    """The checksum of each block of ``data`` (whole digests from a block boundary):
    the wrapping sum of its little-endian words, the last block zero padded."""
    size = BLOCK * width
    pad = -len(data) % size
    if pad:
        data = np.concatenate([data, np.zeros(pad, np.uint8)])
    words = data.view("<u8").reshape(-1, size // 8)
    sums: NDArray[np.uint64] = words.sum(axis=1, dtype=np.uint64)
    return sums


class _Writer:
    """Writes one run from sorted, duplicate-free chunks of digests (each chunk's
    first key greater than the last one written), to a temporary file."""

    def __init__(self, path: Path, width: int) -> None:
        self.path, self.width = path, width
        self._f = open(path, "wb")  # noqa: SIM115 - closed in finish/abort
        self._f.write(bytes(_HEADER.size))
        self._carry = np.zeros((0, width), np.uint8)
        self._fence: list[NDArray[np.uint64]] = []
        self._sums: list[NDArray[np.uint64]] = []
        self.count = 0
        self.last: bytes | None = None

    def append(self, keys: NDArray[np.uint8]) -> None:
        if len(keys) == 0:
            return
        self._f.write(keys.tobytes())
        self.count += len(keys)
        self.last = keys[-1].tobytes()
        rows = np.concatenate([self._carry, keys]) if len(self._carry) else keys
        whole = len(rows) - len(rows) % BLOCK
        self._blocks(rows[:whole])
        self._carry = rows[whole:].copy()

    def _blocks(self, rows: NDArray[np.uint8]) -> None:
        if len(rows):
            self._fence.append(heads(rows[::BLOCK]))
            self._sums.append(_block_sums(rows.reshape(-1), self.width))

    def finish(self) -> None:
        """Write the fence, checksums, trailer and header; fsync; close."""
        self._blocks(self._carry)
        fence = np.concatenate([*self._fence, np.zeros(0, np.uint64)]).astype("<u8")
        sums = np.concatenate([*self._sums, np.zeros(0, np.uint64)]).astype("<u8")
        header = _HEADER.pack(_MAGIC, self.width, BLOCK, self.count, 0)
        tail = fence.tobytes() + sums.tobytes()
        crc = zlib.crc32(tail, zlib.crc32(header))
        self._f.write(tail + _TRAILER.pack(crc, _END))
        self._f.seek(0)
        self._f.write(header)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()

    def abort(self) -> None:
        self._f.close()
        self.path.unlink(missing_ok=True)


def _open_run(path: Path, width: int, count: int) -> _Open:
    """Open a run and read its fence and checksums (validated by the trailer's CRC)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        blocks = -(-count // BLOCK)
        size = _HEADER.size + count * width + 16 * blocks + _TRAILER.size
        if os.fstat(fd).st_size != size:
            raise RunDamaged(path, f"{os.fstat(fd).st_size} bytes, {size} expected")
        header = os.pread(fd, _HEADER.size, 0)
        tail = os.pread(fd, 16 * blocks + _TRAILER.size, _HEADER.size + count * width)
        magic, w, block, n, _ = _HEADER.unpack(header)
        crc, end = _TRAILER.unpack(tail[-_TRAILER.size :])
        if (magic, w, block, n, end) != (_MAGIC, width, BLOCK, count, _END):
            raise RunDamaged(path, "header or trailer does not match the manifest")
        if zlib.crc32(tail[: -_TRAILER.size], zlib.crc32(header)) != crc:
            raise RunDamaged(path, "fence checksum mismatch")
        table = np.frombuffer(tail, "<u8", count=2 * blocks).astype(np.uint64)
        return _Open(path, fd, width, count, table[:blocks], table[blocks:])
    except BaseException:
        os.close(fd)
        raise


def _ranges(blocks: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Sorted distinct blocks as ``[start, end)`` ranges, gaps under :data:`GAP` filled."""
    cut = np.flatnonzero(np.diff(blocks) > GAP + 1) + 1
    starts = blocks[np.r_[0, cut]]
    ends = blocks[np.r_[cut - 1, len(blocks) - 1]] + 1
    return starts, ends


def _probe(run: _Open, keys: NDArray[np.uint8]) -> NDArray[np.bool_]:
    """Which of ``keys`` (sorted digests, one a row) are in ``run``."""
    out = np.zeros(len(keys), np.bool_)
    if run.count == 0 or len(keys) == 0:
        return out
    head = heads(keys)
    last = len(run.fence) - 1
    lo = np.clip(np.searchsorted(run.fence, head, "left") - 1, 0, last)
    hi = np.searchsorted(run.fence, head, "right") - 1  # -1: below the first key
    multi = np.flatnonzero(hi > lo)  # a head repeated across blocks: rare
    if multi.size:
        out[multi] = _probe_part(run, keys[multi], lo[multi], hi[multi])
    single = np.flatnonzero((hi >= 0) & (hi == lo))
    # Parts of at most _PART_BLOCKS distinct blocks (each read with at most GAP
    # neighbours: at most PROBE_BLOCKS a buffer), so a batch whose keys cluster in a few
    # blocks is one part however far apart they lie in the run.
    block = lo[single]  # non-decreasing: the keys are sorted
    ordinal = np.cumsum(np.r_[True, block[1:] != block[:-1]]) - 1 if block.size else block
    window = ordinal // _PART_BLOCKS
    for part in np.split(single, np.flatnonzero(np.diff(window)) + 1):
        if part.size:
            out[part] = _probe_part(run, keys[part], lo[part], hi[part])
    return out


def _probe_part(
    run: _Open, keys: NDArray[np.uint8], lo: NDArray[np.int64], hi: NDArray[np.int64]
) -> NDArray[np.bool_]:
    ask = hi >= 0
    if not ask.any():
        return np.zeros(len(keys), np.bool_)
    lo, hi = lo[ask], hi[ask]
    span = hi - lo + 1  # > 1 only where a head repeats across a block boundary
    blocks = np.unique(np.repeat(lo, span) + _steps(span))
    starts, ends = _ranges(blocks)
    w, size = run.width, BLOCK * run.width
    buf = np.zeros(int((ends - starts).sum()) * size, np.uint8)
    _read(run, buf, starts, ends)
    read = np.repeat(starts, ends - starts) + _steps(ends - starts)
    if not (_block_sums(buf, w) == run.sums[read]).all():
        raise RunDamaged(run.path, "block checksum mismatch")
    rows = buf.reshape(-1, w)
    if ends[-1] * BLOCK > run.count:  # the last block is partial: drop its padding
        rows = rows[: len(rows) - (ends[-1] * BLOCK - run.count)]
    # Each key's blocks lo..hi are consecutive, so one span of the buffer's rows.
    first = np.cumsum(ends - starts) - (ends - starts)  # each range's first block in buf
    which = np.searchsorted(starts, lo, "right") - 1
    begin = (first[which] + lo - starts[which]) * BLOCK
    end = np.minimum(begin + span * BLOCK, len(rows))
    out = np.zeros(len(keys), np.bool_)
    out[ask] = _member(rows, keys[ask], begin, end)
    return out


def _read(
    run: _Open, buf: NDArray[np.uint8], starts: NDArray[np.int64], ends: NDArray[np.int64]
) -> None:
    """Blocks ``[starts[i], ends[i])`` of ``run``, back to back into ``buf``: one
    ``preadv`` a range (the loop's only Python work per range)."""
    size = BLOCK * run.width
    want = (np.minimum(ends * BLOCK, run.count) - starts * BLOCK) * run.width
    into = np.cumsum((ends - starts) * size) - (ends - starts) * size
    view, fd, pread = memoryview(buf), run.fd, os.preadv  # type: ignore[arg-type]
    offsets = (starts * size + _HEADER.size).tolist()
    for at, n, off in zip(into.tolist(), want.tolist(), offsets, strict=True):
        if pread(fd, [view[at : at + n]], off) != n:
            raise RunDamaged(run.path, f"short read at byte {off}")


def _member(
    rows: NDArray[np.uint8],
    keys: NDArray[np.uint8],
    begin: NDArray[np.int64],
    end: NDArray[np.int64],
) -> NDArray[np.bool_]:
    """Whether each key is among ``rows[begin:end]`` (sorted digests): a binary search
    on the rows' heads, all keys at once (a few numpy steps, not one per key; a
    ``searchsorted`` on the digests as ``S`` strings costs ~1.5 µs a key), or, where
    the rows are few per key (:data:`_DENSE`), one ``searchsorted`` of all their
    heads; then the whole digest of each row whose head matches."""
    want = np.ascontiguousarray(keys[:, :8]).view(">u8")[:, 0]
    if len(rows) <= _DENSE * len(keys):
        # Few rows a key (an asset-keyed batch: ~6): one search of all the heads,
        # copied once (the rows read are sorted, a subset of the run in order), costs
        # half the loop below; for one block a key (128 rows) the copy costs 3x more.
        heads = np.ascontiguousarray(rows[:, :8]).view(">u8")[:, 0].astype(np.uint64)
        want = want.astype(np.uint64)
        lo = np.searchsorted(heads, want, "left")
        end = np.full(len(keys), len(rows), np.int64)
    else:
        heads = rows[:, :8].view(">u8")[:, 0]  # a strided view: no copy
        lo, hi = begin.copy(), end.copy()
        while (live := np.flatnonzero(lo < hi)).size:
            mid = (lo[live] + hi[live]) // 2
            less = heads[mid] < want[live]
            lo[live[less]] = mid[less] + 1
            hi[live[~less]] = mid[~less]
    out = np.zeros(len(keys), np.bool_)
    ask = np.flatnonzero(lo < end)
    while ask.size:  # a step past each row while the head still matches
        ask = ask[heads[lo[ask]] == want[ask]]
        hit = (rows[lo[ask]] == keys[ask]).all(axis=1)
        out[ask[hit]] = True
        ask = ask[~hit]
        lo[ask] += 1
        ask = ask[lo[ask] < end[ask]]
    return out


def _steps(span: NDArray[np.int64]) -> NDArray[np.int64]:
    """0 .. span[i] - 1 for each i, concatenated."""
    if (span == 1).all():
        return np.zeros(len(span), np.int64)
    first = np.repeat(np.cumsum(span) - span, span)
    steps: NDArray[np.int64] = np.arange(int(span.sum())) - first
    return steps


def _sorted_unique(data: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """Digests (one a row) in byte order, each once."""
    width = data.shape[1]
    flat = np.sort(data.view(f"S{width}").ravel())
    rows = flat.view(np.uint8).reshape(-1, width)
    if len(rows) > 1:
        keep = np.r_[True, (rows[1:] != rows[:-1]).any(axis=1)]
        rows = rows[keep]
    return rows


def _merge_two(a: NDArray[np.uint8], b: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """Two sorted digest arrays as one (duplicates kept)."""
    w = a.shape[1]
    fa, fb = a.view(f"V{w}").ravel(), b.view(f"V{w}").ravel()
    at = np.searchsorted(a.view(f"S{w}").ravel(), b.view(f"S{w}").ravel())
    merged: NDArray[np.uint8] = np.insert(fa, at, fb).view(np.uint8).reshape(-1, w)
    return merged


def merge_plan(counts: list[int]) -> int | None:
    """Given a view's run sizes, largest first, the index from which to merge the
    runs into one (None: leave them): the first run that the runs smaller than it
    together reach 1/:data:`FAN` of."""
    for i in range(len(counts) - 1):
        if FAN * sum(counts[i + 1 :]) >= counts[i]:
            return i
    return None


class _Reader:
    """A run's digests in chunks of :data:`CHUNK_KEYS` (whole blocks), in order, each
    block checked against its checksum: a merge must not carry a damaged input into a
    run whose checksums it computes afresh."""

    def __init__(self, run: _Open) -> None:
        self.run, self.at = run, 0

    def next(self) -> NDArray[np.uint8]:
        whole = max(BLOCK, CHUNK_KEYS - CHUNK_KEYS % BLOCK)  # chunks of whole blocks
        w, n = self.run.width, min(whole, self.run.count - self.at)
        data = os.pread(self.run.fd, n * w, _HEADER.size + self.at * w)
        if len(data) != n * w:
            raise RunDamaged(self.run.path, "short read")
        first = self.at // BLOCK
        sums = _block_sums(np.frombuffer(data, np.uint8), w)
        if not (sums == self.run.sums[first : first + len(sums)]).all():
            raise RunDamaged(self.run.path, "block checksum mismatch")
        self.at += n
        return np.frombuffer(data, np.uint8).reshape(-1, w)


class KeyRuns:
    """The run files of one index (a directory beside its SQLite file).

    Args:
        root: The directory of the run files.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._open: dict[str, _Open] = {}
        self._pid = os.getpid()
        self._published: list[Path] = []
        self._doomed: list[Path] = []

    # -- transactions (called by the index around each write transaction) ---------
    def committed(self) -> None:
        """The transaction committed: remove the files it stopped naming."""
        for path in self._doomed:
            self._forget(path.name)
            path.unlink(missing_ok=True)
        self._doomed.clear()
        self._published.clear()

    def rolled_back(self) -> None:
        """The transaction rolled back: remove the files it had published."""
        for path in self._published:
            path.unlink(missing_ok=True)
        self._published.clear()
        self._doomed.clear()

    # -- writes (inside a write transaction) --------------------------------------
    def add(self, conn: sqlite3.Connection, view: str, groups: list[Packed]) -> None:
        """Write ``groups``' digests as new runs of ``view`` (one per width and
        :data:`CHUNK_KEYS` keys) and name them in the manifest."""
        by_width: dict[int, list[bytes]] = {}
        for group in groups:
            if len(group.rows):
                by_width.setdefault(group.width, []).append(group.data)
        for width, parts in by_width.items():
            data = np.frombuffer(b"".join(parts), np.uint8).reshape(-1, width)
            for start in range(0, len(data), CHUNK_KEYS):
                keys = _sorted_unique(data[start : start + CHUNK_KEYS])
                writer = self._writer(width)
                try:
                    writer.append(keys)
                    writer.finish()
                except BaseException:
                    writer.abort()
                    raise
                self._publish(conn, view, writer)

    def clear(self, conn: sqlite3.Connection, view: str) -> None:
        """Drop every run of ``view`` (its files go when the transaction commits)."""
        rows = conn.execute("SELECT name FROM runs WHERE view = ?", (view,)).fetchall()
        conn.execute("DELETE FROM runs WHERE view = ?", (view,))
        self._doomed += [self.root / str(name) for (name,) in rows]

    def _writer(self, width: int) -> _Writer:
        self.root.mkdir(parents=True, exist_ok=True)
        return _Writer(self.root / f".tmp-{os.getpid()}-{uuid.uuid4().hex}", width)

    def _publish(self, conn: sqlite3.Connection, view: str, writer: _Writer) -> None:
        """Rename a finished run to its final name and name it in the manifest."""
        name = f"{view}-{writer.width}-{uuid.uuid4().hex}.run"
        final = self.root / name
        os.replace(writer.path, final)
        self._published.append(final)
        fsync_dir(self.root)
        conn.execute(
            "INSERT INTO runs (name, view, width, count) VALUES (?, ?, ?, ?)",
            (name, view, writer.width, writer.count),
        )

    def unnamed(self, conn: sqlite3.Connection) -> list[Path]:
        """Files no manifest row names (run files) or whose writer is gone (temporary
        files of dead processes). Final only under the write lock: outside it, a
        writer may be between renaming a run and committing its row."""
        if not self.root.is_dir():
            return []
        named = {str(n) for (n,) in conn.execute("SELECT name FROM runs")}
        out = []
        for path in self.root.iterdir():
            orphan = path.name.endswith(".run") and path.name not in named
            if orphan or (path.name.startswith(".tmp-") and not _alive(path.name.split("-")[1])):
                out.append(path)
        return out

    def sweep(self, conn: sqlite3.Connection) -> None:
        """Remove :meth:`unnamed` files (call with the write lock held)."""
        for path in self.unnamed(conn):
            path.unlink(missing_ok=True)

    # -- reads --------------------------------------------------------------------
    def listed(
        self, conn: sqlite3.Connection, view: str, width: int | None = None
    ) -> list[_Listed]:
        """``view``'s runs (of ``width``, when given), largest first."""
        rows = conn.execute(
            "SELECT name, width, count FROM runs WHERE view = ? ORDER BY count DESC, name",
            (view,),
        ).fetchall()
        runs = [_Listed(str(n), int(w), int(c)) for n, w, c in rows]
        return [r for r in runs if width is None or r.width == width]

    def has(self, conn: sqlite3.Connection, view: str, group: Packed) -> NDArray[np.bool_]:
        """Which of ``group``'s digests ``view`` holds; ``group`` must be sorted by
        head (:meth:`~catalog.key_index_rows.Packed.sorted`).

        Raises:
            RunDamaged: a run the manifest names is missing or damaged.
        """
        keys = np.frombuffer(group.data, np.uint8).reshape(-1, group.width)
        for attempt in range(3):
            try:
                out = np.zeros(len(keys), np.bool_)
                for run in self._runs(conn, view, group.width):
                    rest = np.flatnonzero(~out)
                    if len(rest) == 0:
                        break
                    out[rest] = _probe(run, keys[rest])
                return out
            except FileNotFoundError as exc:  # a merge replaced a run: read the list again
                if attempt == 2:
                    raise RunDamaged(Path(str(exc.filename)), "missing") from exc
        raise AssertionError("unreachable")

    def _runs(self, conn: sqlite3.Connection, view: str, width: int) -> Iterator[_Open]:
        listed = self.listed(conn, view, width)
        names = {r.name for r in listed}
        prefix = f"{view}-{width}-"  # runs of other widths stay open
        for stale in [n for n in self._open if n.startswith(prefix) and n not in names]:
            self._forget(stale)
        for run in listed:
            if (held := self._open.get(run.name)) is None:
                try:
                    held = self._open[run.name] = _open_run(
                        self.root / run.name, run.width, run.count
                    )
                except FileNotFoundError:
                    if self.listed(conn, view, width) == listed:  # still named: damage
                        raise RunDamaged(self.root / run.name, "missing") from None
                    raise
            yield held

    def _forget(self, name: str) -> None:
        held = self._open.pop(name, None)
        if held is not None:
            os.close(held.fd)

    # -- merging ------------------------------------------------------------------
    def settle(
        self,
        view: str,
        db: Callable[[], sqlite3.Connection],
        write: Callable[[], AbstractContextManager[sqlite3.Connection]],
    ) -> None:
        """Merge ``view``'s runs while :func:`merge_plan` asks for it. The merge reads
        immutable files outside any transaction; its result replaces its inputs only
        if the manifest still names them all (else it is discarded)."""
        for width in sorted({r.width for r in self.listed(db(), view)}):
            while True:
                runs = self.listed(db(), view, width)
                start = merge_plan([r.count for r in runs])
                if start is None or not self._merge(view, runs[start:], write):
                    break

    def _merge(
        self,
        view: str,
        inputs: list[_Listed],
        write: Callable[[], AbstractContextManager[sqlite3.Connection]],
    ) -> bool:
        try:
            opened = [_open_run(self.root / r.name, r.width, r.count) for r in inputs]
        except FileNotFoundError:
            return False  # another process merged them first
        writer = self._writer(inputs[0].width)
        try:
            _stream_merge([_Reader(o) for o in opened], writer)
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        finally:
            for o in opened:
                os.close(o.fd)
        with write() as conn:
            names = [r.name for r in inputs]
            marks = ",".join("?" * len(names))
            held = conn.execute(f"SELECT count(*) FROM runs WHERE name IN ({marks})", names)
            if held.fetchone()[0] != len(names):
                writer.path.unlink(missing_ok=True)
                return False
            conn.execute(f"DELETE FROM runs WHERE name IN ({marks})", names)
            self._doomed += [self.root / n for n in names]
            self._publish(conn, view, writer)
        return True

    # -- whole store ----------------------------------------------------------------
    def close(self) -> None:
        """Close every open run (a forked child's copies are left to the parent)."""
        if self._pid == os.getpid():
            for name in list(self._open):
                self._forget(name)
        self._open.clear()
        self._pid = os.getpid()

    def discard(self) -> None:
        """Remove every run file (the index is being rebuilt or purged)."""
        self.close()
        with suppress(FileNotFoundError):
            shutil.rmtree(self.root)


def _stream_merge(readers: list[_Reader], writer: _Writer) -> None:
    """Merge sorted runs chunk by chunk into ``writer``, each key once."""
    bufs = [r.next() for r in readers]
    while True:
        live = [k for k, b in enumerate(bufs) if len(b)]
        if not live:
            return
        w = writer.width
        bound = min(bufs[k][-1].view(f"S{w}")[0] for k in live)
        taken = []
        for k in live:
            cut = int(np.searchsorted(bufs[k].view(f"S{w}").ravel(), bound, "right"))
            taken.append(bufs[k][:cut])
            bufs[k] = bufs[k][cut:]
            if len(bufs[k]) == 0 and readers[k].at < readers[k].run.count:
                bufs[k] = readers[k].next()
        merged = taken[0]
        for more in taken[1:]:
            merged = _merge_two(merged, more)
        if len(merged) > 1:
            merged = merged[np.r_[True, (merged[1:] != merged[:-1]).any(axis=1)]]
        if len(merged) and writer.last is not None and merged[0].tobytes() == writer.last:
            merged = merged[1:]
        writer.append(merged)


def _alive(pid: str) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
