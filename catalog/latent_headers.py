"""Latent headers, read by range at ingest and checked against their rows.

A latent row states what its bytes hold (``tensor_keys``, ``shapes``, ``dtypes``,
``latent_frames``); a row that lies fails much later, in a training step, far from
the producer that wrote it. So :func:`check_latent_headers` reads each member's
header where the member starts (``offset`` in its object: a packed member's header
lives there, not at 0), a few KB per member with one ranged read (two for a long
header), from a small thread pool, and rejects the batch at the first row whose
header disagrees:

* ``safetensors``: the 8-byte little-endian header length and the JSON header; every
  entry must have a known dtype, a shape and a byte range that fits its dtype and
  shape and lies inside the member.
* ``npy``: the magic, version and header dict (``descr``, ``fortran_order``,
  ``shape``; parsed with :func:`ast.literal_eval`, never evaluated); the dtype must be
  a plain native-order number type (no objects: the loader loads without pickle), and
  the data must fit inside the member. A ``.npy`` holds one array, so the row names one
  tensor key.
* ``pt`` (a torch pickle): there is no header to read without unpickling, which a
  catalog must never do with producer bytes. Only what the store proves is checked
  (the object exists, the range fits, a whole-object member's hash is the object's);
  the loader hashes the bytes before ``torch.load(weights_only=True)``.

Before the headers, :func:`member_ranges` resolves each row's ``(offset, length)``
(a packed member must state its length; the range must fit the object) and
:func:`member_hashes` its member SHA-256: a member that is the whole object must carry
the object's hash (the store verified those bytes against it), a packed member its own.

Against the row: every key in ``tensor_keys`` is in the header; ``shapes[i]`` (when
given) is the header's shape of ``tensor_keys[i]``; ``dtypes[i]`` (when given) names
the header's dtype (:func:`canonical_dtype` accepts ``bfloat16``, ``BF16``,
``torch.bfloat16``, ``<f4``...); ``latent_frames`` (when given) is axis 1 of every 4-D
``(C, T, H, W)`` tensor the row names, the axis the loader cuts a bucket's frames on.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog.errors import InvalidBatch, NotFound
from catalog.objects import ObjectStore
from catalog.objects.refs import resolve_range

__all__ = [
    "TensorHeader",
    "canonical_dtype",
    "check_latent_headers",
    "member_hashes",
    "member_ranges",
    "parse_header",
]

#: Bytes read first: a latent's header is usually a few hundred bytes.
HEAD_BYTES = 4096
#: The longest safetensors header accepted (the loader's limit).
MAX_HEADER = 100 << 20
_WORKERS = 16
_NPY_MAGIC = b"\x93NUMPY"

#: safetensors dtype code -> (canonical name, bytes per element)
_ST_DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "U16": ("uint16", 2),
    "I16": ("int16", 2),
    "U32": ("uint32", 4),
    "I32": ("int32", 4),
    "U64": ("uint64", 8),
    "I64": ("int64", 8),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F32": ("float32", 4),
    "F64": ("float64", 8),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}
_CANONICAL = frozenset(name for name, _ in _ST_DTYPES.values())
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
_NUMPY_DESCR = re.compile(r"^[<>|=]?[biuf][1248]$")

Read = Callable[[int, int], bytes]


class HeaderError(ValueError):
    """A member's bytes are not a well-formed latent of its format."""


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its header describes it: canonical dtype name and shape."""

    dtype: str
    shape: tuple[int, ...]


def canonical_dtype(name: object) -> str | None:
    """The canonical (torch-style) name of a dtype a row names, or None if unknown.

    Accepts canonical names (``bfloat16``), safetensors codes (``BF16``), a
    ``torch.`` prefix, a few aliases (``bf16``, ``fp16``, ``half``, ``fp32``) and
    numpy type strings (``<f4``, ``u1``).
    """
    if not isinstance(name, str):
        return None
    text = name.strip()
    if text.upper() in _ST_DTYPES:
        return _ST_DTYPES[text.upper()][0]
    low = text.lower().removeprefix("torch.")
    low = _ALIASES.get(low, low)
    if low in _CANONICAL:
        return low
    if _NUMPY_DESCR.match(text):
        return str(np.dtype(text).name)
    return None


Header = dict[str, TensorHeader] | TensorHeader | None


def parse_header(fmt: str, read: Read, length: int) -> Header:
    """The tensors a member's header describes: ``{key: tensor}`` for safetensors, the
    one (unnamed) array of a ``.npy``, None for ``pt`` (no header to read).

    Args:
        fmt: ``safetensors``, ``npy`` or ``pt``.
        read: ``read(start, n)``: ``n`` bytes at ``start`` of the member.
        length: The member's length.

    Raises:
        HeaderError: the header is malformed, or describes data the member cannot hold.
    """
    if fmt == "safetensors":
        return _safetensors(read, length)
    if fmt == "npy":
        return _npy(read, length)
    return None


def _safetensors(read: Read, length: int) -> dict[str, TensorHeader]:
    head = read(0, min(length, HEAD_BYTES))
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if not 0 < n <= min(MAX_HEADER, length - 8):
        raise HeaderError(f"not a safetensors file (header length {n}, member {length} bytes)")
    raw = head[8 : 8 + n] if 8 + n <= len(head) else read(8, n)
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise HeaderError(f"the safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError("the safetensors header is not a JSON object")
    data_len = length - 8 - n
    out: dict[str, TensorHeader] = {}
    for key, entry in header.items():
        if key != "__metadata__":
            out[key] = _st_entry(key, entry, data_len)
    return out


def _st_entry(key: str, entry: Any, data_len: int) -> TensorHeader:
    try:
        name, itemsize = _ST_DTYPES[entry["dtype"]]
        shape = tuple(_dim(d) for d in entry["shape"])
        begin, end = (_dim(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise HeaderError(f"bad safetensors header entry for {key!r}: {exc!r}") from None
    if end - begin != math.prod(shape) * itemsize or end > data_len:
        raise HeaderError(
            f"tensor {key!r}: bytes [{begin}, {end}) do not hold {name}{list(shape)} "
            f"inside the member's {data_len} data bytes"
        )
    return TensorHeader(name, shape)


def _dim(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


def _npy(read: Read, length: int) -> TensorHeader:
    head = read(0, min(length, HEAD_BYTES))
    if not head.startswith(_NPY_MAGIC) or len(head) < 10:
        raise HeaderError("not a .npy file (no NUMPY magic)")
    major = head[6]
    if major not in (1, 2, 3):
        raise HeaderError(f"unsupported .npy version {major}.{head[7]}")
    start = 10 if major == 1 else 12
    n = int.from_bytes(head[8:start], "little")
    if start + n > length:
        raise HeaderError(f".npy header of {n} bytes passes the member's end")
    raw = head[start : start + n] if start + n <= len(head) else read(start, n)
    try:
        meta = ast.literal_eval(raw.decode("utf-8" if major == 3 else "latin1"))
        descr, shape = meta["descr"], tuple(_dim(d) for d in meta["shape"])
        if not isinstance(descr, str) or not isinstance(meta["fortran_order"], bool):
            raise ValueError("descr must be a type string and fortran_order a bool")
        dtype = np.dtype(descr)
    except (ValueError, SyntaxError, TypeError, KeyError, MemoryError, RecursionError) as exc:
        raise HeaderError(f"bad .npy header: {exc!r}") from None
    if dtype.kind not in "biuf" or not dtype.isnative:
        raise HeaderError(f".npy dtype {descr!r} is not a native-order number type")
    if start + n + math.prod(shape) * dtype.itemsize > length:
        raise HeaderError(f".npy data {dtype.name}{list(shape)} passes the member's end")
    return TensorHeader(str(dtype.name), shape)


# -- checking a batch -------------------------------------------------------------------
def member_ranges(
    batch: pa.Table, size: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each latent's ``(offset, length)`` in its object of ``size`` bytes (an absent
    length runs to the end, which only a standalone latent at offset 0 may omit)."""
    offset = _np(batch["offset"]).astype(np.int64)
    given = batch["length"] if "length" in batch.column_names else pa.nulls(len(batch), pa.int64())
    length_null = _np(pc.is_null(given)).astype(np.bool_)
    if (row := _first_bad(~length_null | (offset == 0))) is not None:
        raise InvalidBatch(
            f"row {row}, field 'length': required for a packed member", row=row, field="length"
        )
    length = np.where(length_null, size - offset, _np(pc.fill_null(given, 0)).astype(np.int64))
    if (row := _first_bad(offset + length <= size)) is not None:
        raise InvalidBatch(
            f"row {row}, field 'length': [{offset[row]}, +{length[row]}) "
            f"passes the object's end {size[row]}",
            row=row,
            field="length",
        )
    return offset, length


def member_hashes(batch: pa.Table, whole: NDArray[np.bool_]) -> pa.ChunkedArray | pa.Array:
    """Each latent's member SHA-256: given for a packed member; for a member that is
    the whole object, the object's (the store verified those bytes hash to it, so a
    different given hash is a lie the loader would trip over at training time)."""
    obj = batch["object_sha256"]
    member = (
        batch["member_sha256"]
        if "member_sha256" in batch.column_names
        else pa.nulls(len(batch), obj.type)
    )
    member_null = _np(pc.is_null(member)).astype(np.bool_)
    same = _np(pc.fill_null(pc.equal(member, obj), False)).astype(np.bool_)
    if (row := _first_bad(member_null | same | ~whole)) is not None:
        raise InvalidBatch(
            f"row {row}, field 'member_sha256': the latent is the whole object "
            f"{obj[row]}, so its member hash is the object's, not {member[row]}",
            row=row,
            field="member_sha256",
            object_sha256=obj[row].as_py(),
        )
    if (row := _first_bad(~(member_null | same) | whole)) is not None:
        raise InvalidBatch(
            f"row {row}, field 'member_sha256': needed unless the latent is the whole object",
            row=row,
            field="member_sha256",
        )
    return pc.coalesce(member, obj)


def _first_bad(good: NDArray[np.bool_]) -> int | None:
    bad = np.flatnonzero(~good)
    return int(bad[0]) if len(bad) else None


def _np(col: pa.ChunkedArray | pa.Array) -> NDArray[Any]:
    return np.asarray(col.to_numpy(zero_copy_only=False))


_Member = tuple[str, int, int, str]  # object sha256, offset, length, format


def check_latent_headers(
    store: ObjectStore, rows: pa.Table, offset: Sequence[int], length: Sequence[int]
) -> None:
    """Check every row of a latent batch against its member's header (module docstring).

    Args:
        store: The object store (stored or referenced objects).
        rows: The batch (``object_sha256``, ``format``, ``tensor_keys``, ``shapes``,
            ``dtypes``, ``latent_frames``).
        offset, length: Each row's member range (already checked to fit its object).

    Raises:
        InvalidBatch: the first row whose header is malformed (field ``format``) or
            disagrees with it (``tensor_keys``, ``shapes``, ``dtypes``,
            ``latent_frames``), or whose dtype names are unknown (``dtypes``).
    """
    cols = {
        c: rows[c].to_pylist()
        for c in ("object_sha256", "format", "tensor_keys", "shapes", "dtypes", "latent_frames")
    }
    members: list[_Member] = [
        (sha, int(o), int(n), fmt)
        for sha, o, n, fmt in zip(
            cols["object_sha256"], offset, length, cols["format"], strict=True
        )
    ]
    headers = _read_all(store, sorted({m for m in members if m[3] != "pt"}))
    for row, member in enumerate(members):
        header = headers.get(member)
        if isinstance(header, HeaderError):
            raise InvalidBatch(
                f"row {row}, field 'format': {member[3]} latent at {member[0]}"
                f"@{member[1]}+{member[2]}: {header}",
                row=row,
                field="format",
                object_sha256=member[0],
            )
        problem = _disagreement(
            header,
            cols["tensor_keys"][row],
            cols["shapes"][row],
            cols["dtypes"][row],
            cols["latent_frames"][row],
        )
        if problem is not None:
            field, what = problem
            raise InvalidBatch(
                f"row {row}, field {field!r}: {what} (object {member[0]}@{member[1]})",
                row=row,
                field=field,
                object_sha256=member[0],
            )


def _read_all(store: ObjectStore, members: list[_Member]) -> dict[_Member, Header | HeaderError]:
    """Each member's parsed header (or its HeaderError), read in parallel."""

    def one(member: _Member) -> Header | HeaderError:
        sha, offset, length, fmt = member

        def read(start: int, n: int) -> bytes:
            return resolve_range(store, sha, offset + start, n)

        try:
            return parse_header(fmt, read, length)
        except HeaderError as exc:
            return exc
        except NotFound as exc:  # deleted since its size was read
            return HeaderError(f"the object is gone: {exc}")

    if len(members) <= 8:
        return {m: one(m) for m in members}
    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="vidlake-header") as pool:
        return dict(zip(members, pool.map(one, members), strict=True))


def _disagreement(
    header: Header,
    keys: list[str],
    shapes: list[list[int]] | None,
    dtypes: list[str] | None,
    frames: int | None,
) -> tuple[str, str] | None:
    """``(field, what)`` of the first way a row disagrees with its header, or None."""
    names = dtypes or []
    wanted = [canonical_dtype(d) for d in names]
    if None in wanted:
        return "dtypes", f"unknown dtype {names[wanted.index(None)]!r}"
    if header is None:
        return None  # pt: nothing to read without unpickling
    if isinstance(header, TensorHeader):  # a .npy: one array, under the row's one key
        if len(keys) != 1:
            return "tensor_keys", f"a .npy holds one array, the row names {len(keys)} keys"
        header = {keys[0]: header}
    missing = [k for k in keys if k not in header]
    if missing:
        return "tensor_keys", f"the header lacks tensors {missing} (has {sorted(header)})"
    for i, key in enumerate(keys):
        t = header[key]
        if shapes is not None and tuple(shapes[i]) != t.shape:
            return "shapes", f"tensor {key!r} is {list(t.shape)}, the row says {shapes[i]}"
        if dtypes is not None and wanted[i] != t.dtype:
            return "dtypes", f"tensor {key!r} is {t.dtype}, the row says {names[i]!r}"
        if frames is not None and len(t.shape) == 4 and t.shape[1] != frames:
            return "latent_frames", (
                f"tensor {key!r} {list(t.shape)} has {t.shape[1]} frames on axis 1, "
                f"the row says {frames}"
            )
    return None
