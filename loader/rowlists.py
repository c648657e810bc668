"""Records of a mapped index straight to Python lists, one vectorised gather a column.

A step's rows are spread over the index's record batches (shuffled: at 16M clips in
batches of 4,096, 256 rows touch ~250 of them). Arrow's ``take`` is one call per
batch touched and column, ~60-100 µs per batch for a step's columns, then the
values become Python lists anyway (``to_pylist``): 1.4 ms + 0.2 ms a 256-row step
over 5 batches, the largest cost of a 16 KB step in round 5's profile.

:class:`RowLists` instead reads the buffers where they lie in the mapping: once per
record batch it notes where each column's buffers start in the file (their byte
addresses, from the IPC reader, which checked them), and then a step's rows are one
numpy fancy index per buffer, whatever the number of batches touched: fixed-width
values at ``base + pos * size``, strings by their offsets, ``list<string>`` by two
levels of offsets. Strings come out of one gathered blob cut in Python (the only
per-row work: the lists the dataset needs). Only the pages holding those rows are
read. Every index read is bounds-checked by numpy; out-of-file addresses are an
:class:`~catalog.errors.IntegrityError`, rows not where the layout says come back as
``row`` -1 (the caller rebuilds the batch offsets, as for :func:`loader.gather.gather`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from catalog.errors import IntegrityError
from loader.mapped import MappedFile

__all__ = ["RowLists"]

#: How a column is read: a fixed-width number, a string, or a list of strings.
_FIXED, _STRING, _LIST = 0, 1, 2


class RowLists:
    """Gathers index records of ``file`` as Python lists (columns ``names``)."""

    def __init__(self, file: MappedFile, names: list[str]) -> None:
        self.file = file
        self.names = names
        schema = file.schema
        self._kinds: list[tuple[int, np.dtype[Any] | None]] = []
        slots = 0
        for name in names:
            t = schema.field(name).type
            if pa.types.is_integer(t):
                self._kinds.append((_FIXED, np.dtype(t.to_pandas_dtype()).newbyteorder("<")))
                slots += 1
            elif pa.types.is_string(t):
                self._kinds.append((_STRING, None))
                slots += 2
            elif pa.types.is_list(t) and pa.types.is_string(t.value_type):
                self._kinds.append((_LIST, None))
                slots += 3
            else:
                raise TypeError(f"column {name} of type {t} cannot be gathered as lists")
        nb = file.num_batches
        #: Per record batch: its row count, then each column's buffer addresses (bytes
        #: from the start of the file); -1 rows: not looked at yet.
        self._where = np.full((nb, 1 + slots), -1, dtype=np.int64)
        self._bytes: NDArray[np.uint8] | None = None
        #: Per string or list column: the id of the one value all of a record batch's
        #: rows hold (-1: they differ), and those values. A layout column (format,
        #: tensor keys) is mostly one value: a step then copies no bytes for it.
        self._same: dict[str, NDArray[np.int64]] = {
            n: np.full(nb, -1, dtype=np.int64)
            for n, (kind, _) in zip(names, self._kinds, strict=True)
            if kind != _FIXED
        }
        self._same_values: list[Any] = []
        self._same_ids: dict[Any, int] = {}

    def _file_bytes(self) -> NDArray[np.uint8]:
        if self._bytes is None:
            self._bytes = self.file.whole()
        return self._bytes

    def _learn(self, batches: NDArray[np.int64]) -> None:
        """Note where the buffers of ``batches`` lie (each batch once per process)."""
        base, size = self.file.whole_address(), len(self._file_bytes())
        for b in batches.tolist():
            batch = self.file.batch(b)
            row = [batch.num_rows]
            for name, (kind, dtype) in zip(self.names, self._kinds, strict=True):
                arr = batch.column(name)
                if arr.null_count:
                    raise IntegrityError(f"{self.file.what}: column {name} holds nulls")
                bufs = arr.buffers()
                if kind == _FIXED:
                    assert dtype is not None
                    row.append(bufs[1].address - base + arr.offset * dtype.itemsize)
                elif kind == _STRING:
                    row += [bufs[1].address - base + arr.offset * 4, _address(bufs[2], base)]
                else:
                    child = arr.values
                    cb = child.buffers()
                    row += [
                        bufs[1].address - base + arr.offset * 4,
                        cb[1].address - base + child.offset * 4,
                        _address(cb[2], base),
                    ]
            if min(row) < 0 or max(row[1:], default=0) > size:
                # Only zero-copy buffers of this mapping can be read by address (an IPC
                # file with compressed buffers would decode them elsewhere).
                raise IntegrityError(
                    f"{self.file.what} at {self.file.path}: record batch {b} is not "
                    "readable in place (its buffers are not in the mapped file)",
                    path=str(self.file.path),
                )
            self._where[b] = row
            self._note_same(b, row)

    def _note_same(self, b: int, row: list[int]) -> None:
        """Which string and list columns of batch ``b`` hold one value in every row."""
        data, n, slot = self._file_bytes(), row[0], 1
        for name, (kind, _) in zip(self.names, self._kinds, strict=True):
            if kind != _FIXED and n:
                value = _one_value(data, n, row[slot : slot + (2 if kind == _STRING else 3)])
                if value is not None:
                    key = tuple(value) if isinstance(value, list) else value
                    vid = self._same_ids.setdefault(key, len(self._same_values))
                    if vid == len(self._same_values):
                        self._same_values.append(value)
                    self._same[name][b] = vid
            slot += 1 if kind == _FIXED else 2 if kind == _STRING else 3

    def gather(self, keys: NDArray[np.int64]) -> Gathered:
        """Records ``keys`` in that order (``Gathered.row`` is -1 where a key is not
        where the layout says); columns are read when asked for."""
        file = self.file
        b, pos = file.split(keys)
        inside = (b >= 0) & (b < file.num_batches)
        b = np.where(inside, b, 0)
        seen = np.unique(b)
        new = seen[self._where[seen, 0] < 0]
        if len(new):
            self._learn(new)
        where = self._where[b]
        inside &= (pos >= 0) & (pos < where[:, 0])
        pos = np.where(inside, pos, 0)
        got = Gathered(self, where, pos, np.full(len(keys), -1, dtype=np.int64))
        got.batches = b
        got.row = np.where(inside, got.array("row").astype(np.int64), -1)
        return got


class Gathered:
    """A step's records, column by column: numbers as arrays or lists, strings as
    lists, ``list<string>`` as lists of lists or one picked item a row."""

    def __init__(
        self,
        lists: RowLists,
        where: NDArray[np.int64],
        pos: NDArray[np.int64],
        row: NDArray[np.int64],
    ) -> None:
        self._lists, self._where, self._pos, self.row = lists, where, pos, row
        self.batches: NDArray[np.int64] = np.zeros(len(pos), dtype=np.int64)
        self._data = lists._file_bytes()
        self._slots: dict[str, tuple[int, int, np.dtype[Any] | None]] = {}
        slot = 1
        for name, (kind, dtype) in zip(lists.names, lists._kinds, strict=True):
            self._slots[name] = (slot, kind, dtype)
            slot += 1 if kind == _FIXED else 2 if kind == _STRING else 3

    def _fail(self, exc: Exception) -> IntegrityError:
        file = self._lists.file
        return IntegrityError(
            f"{file.what} at {file.path}: a record's buffers lie outside the file ({exc})",
            path=str(file.path),
        )

    def array(self, name: str) -> NDArray[Any]:
        """A fixed-width column as a numpy array."""
        slot, kind, dtype = self._slots[name]
        assert kind == _FIXED and dtype is not None
        try:
            return _fixed(self._data, self._where[:, slot] + self._pos * dtype.itemsize, dtype)
        except (IndexError, ValueError) as exc:
            raise self._fail(exc) from exc

    def values(self, name: str) -> list[Any]:
        """Any column as a list, one value a row (rows with equal ``list<string>``
        values share one list object: read it, never change it)."""
        slot, kind, _ = self._slots[name]
        if kind == _FIXED:
            values: list[Any] = self.array(name).tolist()
            return values
        ids = self._lists._same[name][self.batches]
        if len(ids) and ids[0] >= 0 and (ids == ids[0]).all():
            return [self._lists._same_values[int(ids[0])]] * len(ids)
        w, pos = self._where, self._pos
        try:
            if kind == _STRING:
                return _strings(self._data, w[:, slot] + pos * 4, w[:, slot + 1])
            first, counts = self._items(slot)
            child = _ranges(first, counts)
            flat = _strings(
                self._data,
                np.repeat(w[:, slot + 1], counts) + child * 4,
                np.repeat(w[:, slot + 2], counts),
            )
        except (IndexError, ValueError, UnicodeDecodeError) as exc:
            raise self._fail(exc) from exc
        n = len(counts)
        if n and (counts == counts[0]).all():
            c = int(counts[0])
            same = flat[:c]
            if flat == same * n:  # one C-level compare: the common case (one layout)
                return [same] * n
        return [flat[i:j] for i, j in itertools.pairwise([0, *np.cumsum(counts).tolist()])]

    def counts(self, name: str) -> NDArray[np.int64]:
        """Items in each row's ``list<string>`` value."""
        try:
            return self._items(self._slots[name][0])[1]
        except (IndexError, ValueError) as exc:
            raise self._fail(exc) from exc

    def pick(self, name: str, item: NDArray[np.int64]) -> list[str | None]:
        """Item ``item[r]`` of each row ``r``'s ``list<string>`` value (None where
        ``item`` is negative; the caller keeps it below the row's count)."""
        slot = self._slots[name][0]
        w = self._where
        out: list[str | None] = [None] * len(item)
        want = np.flatnonzero(item >= 0)
        if not len(want):
            return out
        try:
            first, counts = self._items(slot)
            if (item[want] >= counts[want]).any():
                raise ValueError(f"an item past the end of a row's {name}")
            child = first[want] + item[want]
            got = _strings(self._data, w[want, slot + 1] + child * 4, w[want, slot + 2])
        except (IndexError, ValueError, UnicodeDecodeError) as exc:
            raise self._fail(exc) from exc
        if len(want) == len(item):
            return got  # type: ignore[return-value]
        for i, value in zip(want.tolist(), got, strict=True):
            out[i] = value
        return out

    def _items(self, slot: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Each row's first child index and item count of the list column at ``slot``."""
        bounds = _pairs(self._data, self._where[:, slot] + self._pos * 4)
        first, counts = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
        if (counts < 0).any():
            raise ValueError("list offsets go backwards")
        return first, counts


def _address(buf: pa.Buffer | None, base: int) -> int:
    # An all-empty string column may have no data buffer, or one of no bytes anywhere.
    return buf.address - base if buf is not None and buf.size else 0


def _fixed(data: NDArray[np.uint8], at: NDArray[np.int64], dtype: np.dtype[Any]) -> NDArray[Any]:
    """Little-endian values of ``dtype`` at byte addresses ``at`` (any alignment)."""
    if not len(at):
        return np.empty(0, dtype=dtype)
    if at.min() < 0:  # numpy would wrap a negative index round to the file's end
        raise IndexError("a buffer address before the start of the file")
    out: NDArray[Any] = data[at[:, None] + np.arange(dtype.itemsize)].view(dtype).reshape(-1)
    return out


def _ranges(starts: NDArray[np.int64], lengths: NDArray[np.int64]) -> NDArray[np.int64]:
    """Concatenated ``range(s, s + n)`` for each (start, length)."""
    total = int(lengths.sum())
    if not total:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    out: NDArray[np.int64] = np.arange(total, dtype=np.int64)
    out += np.repeat(starts - (ends - lengths), lengths)
    return out


def _pairs(data: NDArray[np.uint8], at: NDArray[np.int64]) -> NDArray[np.int64]:
    """The two consecutive int32 offsets at each of ``at``: (start, end) a row."""
    pairs = _fixed(data, (at[:, None] + np.array([0, 4])).reshape(-1), np.dtype("<i4"))
    out: NDArray[np.int64] = pairs.astype(np.int64).reshape(-1, 2)
    return out


def _strings(
    data: NDArray[np.uint8], offsets_at: NDArray[np.int64], data_at: NDArray[np.int64]
) -> list[str]:
    """Strings whose offsets are at ``offsets_at`` and bytes from ``data_at`` on."""
    n = len(offsets_at)
    if not n:
        return []
    bounds = _pairs(data, offsets_at)
    lengths = bounds[:, 1] - bounds[:, 0]
    if (lengths < 0).any():
        raise ValueError("string offsets go backwards")
    starts = data_at + bounds[:, 0]
    if starts.min() < 0:
        raise IndexError("string bytes before the start of the file")
    # The bytes gathered into one blob, then Arrow makes the strings: ~9 µs for 256
    # digests, against ~25-45 µs for numpy's or Python's own decoding (2-core box).
    width = int(lengths[0])
    if (lengths == width).all():  # digests, ids, formats: no ragged ranges to build
        blob = data[(starts[:, None] + np.arange(width)).reshape(-1)]
        ends = np.arange(0, (n + 1) * width, max(width, 1), dtype=np.int64)[: n + 1]
        if not width:
            return [""] * n
    else:
        blob = data[_ranges(starts, lengths)]
        ends = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])
    kind, offsets = pa.large_string(), pa.py_buffer(ends)
    if ends[-1] < 1 << 31:
        kind, offsets = pa.string(), pa.py_buffer(ends.astype(np.int32))
    strings = pa.Array.from_buffers(kind, n, [None, offsets, pa.py_buffer(blob)])
    out: list[str] = strings.to_pylist()
    return out


def _one_value(data: NDArray[np.uint8], n: int, at: list[int]) -> str | list[str] | None:
    """The value every one of a batch's ``n`` rows holds in a string column (buffer
    addresses ``at``: offsets, bytes) or a ``list<string>`` one (list offsets, string
    offsets, bytes); None when they differ (or the buffers do not add up: the gather
    path then reports what is wrong)."""
    i32 = np.dtype("<i4")
    try:
        offsets = _fixed(data, at[0] + 4 * np.arange(n + 1, dtype=np.int64), i32).astype(np.int64)
        counts = np.diff(offsets)
        if (counts != counts[0]).any():
            return None
        if len(at) == 2:  # a string column: offsets are the strings'
            strings, lengths, data_at = offsets, counts[:1], at[1]
        else:  # a list column: each row's strings are alike in number and length
            per_row = int(counts[0])
            if not per_row:
                return []
            index = int(offsets[0]) + np.arange(n * per_row + 1, dtype=np.int64)
            strings = _fixed(data, at[1] + 4 * index, i32).astype(np.int64)
            lengths = np.diff(strings).reshape(n, per_row)
            if (lengths != lengths[0]).any():
                return None
            lengths, data_at = lengths[0], at[2]
        width = int(strings[-1] - strings[0]) // n
        start = data_at + int(strings[0])
        if width < 0 or start < 0:
            return None
        rows = data[start : start + n * width].reshape(n, width)
        if (rows != rows[0]).any():
            return None
        first = bytes(rows[0])
        cuts = np.concatenate(([0], np.cumsum(lengths))).tolist()
        items = [first[i:j].decode() for i, j in itertools.pairwise(cuts)]
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    return items[0] if len(at) == 2 else items
