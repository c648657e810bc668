"""Decode a latent into tensors by its format: ``safetensors``, ``pt`` or ``npy``.

Files in the node cache are decoded in place. For safetensors the loader goes further:
:func:`safetensors_specs` reads only the JSON header, and :func:`read_into` reads each
tensor's bytes straight from the cached file into its row of the batch tensor — one
copy from the page cache, no intermediate tensor, no stacking. :func:`decode_file`
(``safe_open``, a copy-on-write map for ``.npy``) serves everything else.

A ``.pt`` file is a pickle, and a pickle parser must never see bytes that are not the
ones that were hashed: ``.pt`` bytes are read once, hashed against their SHA-256 and
only then handed to ``torch.load(weights_only=True)`` — whatever the cache checked.

:func:`read_member` reads a packed member by (offset, length) and checks its SHA-256
before returning it, so corrupted bytes raise :class:`ChecksumMismatch` and go nowhere.
"""

from __future__ import annotations

import io
import json
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load as st_load

from catalog.errors import ChecksumMismatch, IntegrityError, InvalidInput
from catalog.hashing import sha256_bytes

__all__ = [
    "FORMATS",
    "TensorSpec",
    "copy_into",
    "decode_bytes",
    "decode_file",
    "pread_frames_into",
    "read_into",
    "read_member",
    "safetensors_header_fd",
    "safetensors_header_specs",
    "safetensors_specs",
    "safetensors_specs_fd",
    "sniff_format",
    "trim_frames",
    "whole_file_order",
]

FORMATS = ("safetensors", "pt", "npy")

_NPY_MAGIC = b"\x93NUMPY"


def sniff_format(head: bytes) -> str:
    """Guess a latent's format from its first bytes (used for text embeddings).

    Raises:
        IntegrityError: the bytes look like none of the supported formats.
    """
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return "pt"  # torch.save's zip container, or a legacy pickle
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"  # 8-byte little-endian header length, then JSON
    raise IntegrityError(f"unrecognised latent format (first bytes {head[:16]!r})")


def _check(data: bytes, sha256: str, what: str) -> None:
    actual = sha256_bytes(data)
    if actual != sha256:
        raise ChecksumMismatch(
            f"{what}: SHA-256 {actual} does not match {sha256}; refusing to deserialise it",
            sha256=sha256,
            actual=actual,
        )


def read_member(path: str | os.PathLike[str], offset: int, length: int, sha256: str) -> bytes:
    """``length`` bytes at ``offset`` of a local file, verified against ``sha256``.

    Raises:
        ChecksumMismatch: short read or a hash mismatch.
    """
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise ChecksumMismatch(
            f"{path}@{offset}: wanted {length} bytes, file holds {len(data)}",
            sha256=sha256,
            expected_size=length,
            actual_size=len(data),
        )
    _check(data, sha256, f"{path}@{offset}+{length}")
    return data


def _select(
    tensors: dict[str, torch.Tensor], keys: list[str], what: str
) -> dict[str, torch.Tensor]:
    if not keys:
        return tensors
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise IntegrityError(f"{what} lacks tensors {missing} (has {sorted(tensors)})")
    return {k: tensors[k] for k in keys}


def _from_pt(obj: Any, keys: list[str], what: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return {keys[0] if keys else "latent": obj}
    if isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return _select({str(k): v for k, v in obj.items()}, keys, what)
    raise IntegrityError(f"{what} holds a {type(obj).__name__}, not a tensor or dict of tensors")


def _from_npy(array: np.ndarray[Any, Any], keys: list[str], what: str) -> dict[str, torch.Tensor]:
    if len(keys) > 1:
        raise IntegrityError(f"{what} is .npy (one array) but the index names keys {keys}")
    return {keys[0] if keys else "latent": torch.from_numpy(array)}


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InvalidInput(f"unknown latent format {fmt!r}; supported: {list(FORMATS)}", format=fmt)


def decode_bytes(
    data: bytes, fmt: str, tensor_keys: list[str], *, sha256: str | None
) -> dict[str, torch.Tensor]:
    """Decode a latent held in memory.

    Args:
        data: the latent's bytes.
        fmt: ``safetensors``, ``pt`` or ``npy``.
        tensor_keys: tensors to return (all when empty).
        sha256: when given, ``data`` is checked against it before any parsing.

    Returns:
        Tensor name → CPU tensor.
    """
    _check_format(fmt)
    what = f"{fmt} latent {sha256 or ''}".strip()
    if sha256 is not None:
        _check(data, sha256, what)
    try:
        if fmt == "safetensors":
            return _select(st_load(data), tensor_keys, what)
        if fmt == "pt":
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            return _from_pt(obj, tensor_keys, what)
        return _from_npy(np.load(io.BytesIO(data), allow_pickle=False), tensor_keys, what)
    except IntegrityError:
        raise
    except Exception as exc:  # a parser's own error: the bytes are not what they claim
        raise IntegrityError(f"cannot decode {what}: {exc}", format=fmt) from exc


def decode_file(
    path: str | os.PathLike[str], fmt: str, tensor_keys: list[str], *, sha256: str | None = None
) -> dict[str, torch.Tensor]:
    """Decode a latent stored as a whole file (a node-cache entry).

    ``sha256`` is checked before parsing for ``pt`` (always re-read and hashed when
    given); the other formats trust the caller's verification (the cache's).
    """
    _check_format(fmt)
    what = f"{fmt} latent at {path}"
    if fmt == "pt":
        data = Path(path).read_bytes()
        return decode_bytes(data, fmt, tensor_keys, sha256=sha256)
    try:
        if fmt == "safetensors":
            with safe_open(os.fspath(path), framework="pt") as f:
                names = tensor_keys or list(f.keys())
                missing = [k for k in names if k not in f.keys()]  # noqa: SIM118 - not a dict
                if missing:
                    raise IntegrityError(f"{what} lacks tensors {missing}")
                return {k: f.get_tensor(k) for k in names}
        # Copy-on-write map: writable (torch wants that), read lazily, never written back.
        array = np.load(os.fspath(path), mmap_mode="c", allow_pickle=False)
        return _from_npy(array, tensor_keys, what)
    except IntegrityError:
        raise
    except Exception as exc:
        raise IntegrityError(f"cannot decode {what}: {exc}", format=fmt) from exc


# -- safetensors, read in place ------------------------------------------------------------
_ST_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "U16": torch.uint16,
    "I16": torch.int16,
    "U32": torch.uint32,
    "I32": torch.int32,
    "U64": torch.uint64,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor of a safetensors file lives: dtype, shape, byte range."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def safetensors_specs(f: BinaryIO, tensor_keys: list[str], what: str) -> dict[str, TensorSpec]:
    """Parse a safetensors header (only the header) into :class:`TensorSpec` s.

    Args:
        f: the file, positioned anywhere (it is read from offset 0).
        tensor_keys: the tensors wanted (all when empty).
        what: names the file in errors.

    Raises:
        IntegrityError: a malformed header, a missing tensor, or a range that
            disagrees with its dtype and shape or runs past the end of the file.
    """
    return safetensors_specs_fd(f.fileno(), os.fstat(f.fileno()).st_size, tensor_keys, what)


_HEAD_READ = 4096
_SPECS_MEMO: OrderedDict[tuple[bytes, tuple[str, ...]], dict[str, TensorSpec]] = OrderedDict()
_SPECS_MEMO_MAX = 256
_SPECS_LOCK = threading.Lock()


def safetensors_specs_fd(
    fd: int, size: int, tensor_keys: list[str], what: str
) -> dict[str, TensorSpec]:
    """:func:`safetensors_specs` of an open file descriptor of ``size`` bytes, read
    with ``pread`` (no file position, no buffered reader).

    Latents of one bucket share one header byte for byte, so parsed headers are
    memoised by their bytes (the ranges are then only checked against ``size``).
    """
    return safetensors_header_fd(fd, size, tensor_keys, what)[0]


def safetensors_header_fd(
    fd: int, size: int, tensor_keys: list[str], what: str
) -> tuple[dict[str, TensorSpec], bytes]:
    """:func:`safetensors_specs_fd` and the header's bytes as read (the length prefix
    and the JSON): with the tensors' bytes in file order, what the file hashes to."""
    head = os.pread(fd, _HEAD_READ, 0)
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if not 0 < n <= min(_MAX_HEADER, size - 8):
        raise IntegrityError(f"{what}: not a safetensors file (header length {n})")
    raw = head[8 : 8 + n] if 8 + n <= len(head) else os.pread(fd, n, 8)
    if len(raw) != n:
        raise IntegrityError(f"{what}: header of {n} bytes, file ends after {len(raw)}")
    return safetensors_header_specs(raw, size, tensor_keys, what), head[:8] + raw


def safetensors_header_specs(
    raw: bytes, size: int, tensor_keys: list[str], what: str
) -> dict[str, TensorSpec]:
    """The :class:`TensorSpec` s of header JSON ``raw`` (the bytes after the length
    prefix) of a file of ``size`` bytes; parsed once per distinct header (memoised).

    Raises:
        IntegrityError: as :func:`safetensors_specs`.
    """
    memo_key = (raw, tuple(tensor_keys))
    specs = _SPECS_MEMO.get(memo_key)
    if specs is None:
        specs = _parse_header(raw, len(raw), tensor_keys, what)
        with _SPECS_LOCK:
            _SPECS_MEMO[memo_key] = specs
            while len(_SPECS_MEMO) > _SPECS_MEMO_MAX:
                _SPECS_MEMO.popitem(last=False)
    for name, spec in specs.items():
        if spec.end > size:
            raise IntegrityError(f"{what}: tensor {name!r} has an inconsistent byte range")
    return specs


def whole_file_order(specs: dict[str, TensorSpec], header_bytes: int, size: int) -> list[str]:
    """The tensor names in file order when they and the header tile the whole file of
    ``size`` bytes, without gap or overlap; else ``[]`` (hashing what was read would
    then not be hashing the file)."""
    order = sorted(specs, key=lambda k: specs[k].start)
    at = header_bytes
    for name in order:
        if specs[name].start != at:
            return []
        at = specs[name].end
    return order if at == size else []


def _parse_header(raw: bytes, n: int, tensor_keys: list[str], what: str) -> dict[str, TensorSpec]:
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise IntegrityError(f"{what}: safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise IntegrityError(f"{what}: safetensors header is not a JSON object")
    names = tensor_keys or [k for k in header if k != "__metadata__"]
    missing = [k for k in names if k not in header]
    if missing:
        raise IntegrityError(f"{what} lacks tensors {missing}")
    specs: dict[str, TensorSpec] = {}
    for name in names:
        entry = header[name]
        try:
            dtype = _ST_DTYPES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (8 + n + int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"{what}: bad header entry for {name!r}: {exc}") from exc
        if end - begin != math.prod(shape) * dtype.itemsize or begin < 8 + n:
            raise IntegrityError(f"{what}: tensor {name!r} has an inconsistent byte range")
        specs[name] = TensorSpec(dtype, shape, begin, end)
    return specs


def pread_frames_into(fd: int, spec: TensorSpec, shape: tuple[int, ...], dest: memoryview) -> None:
    """Read a tensor of ``fd`` into ``dest``, the bytes of a C-contiguous tensor of
    ``shape``: the whole tensor, or (``shape`` from :func:`keep_frames`) its leading
    frames, one ``preadv`` per channel. Still one copy, straight into the batch.

    Raises:
        IntegrityError: the file ends before the tensor does.
    """
    runs: list[tuple[int, int]]  # (file offset, bytes)
    if shape == spec.shape:
        runs = [(spec.start, spec.end - spec.start)]
    else:
        c, t, h, w = spec.shape[-4:]
        item = spec.dtype.itemsize
        run, stride = shape[-3] * h * w * item, t * h * w * item
        runs = [(spec.start + ch * stride, run) for ch in range(c)]
    if sum(n for _, n in runs) != len(dest):
        raise InvalidInput(f"destination of {len(dest)} bytes does not fit {spec} as {shape}")
    at = 0
    for offset, n in runs:
        if n and os.preadv(fd, [dest[at : at + n]], offset) != n:
            raise IntegrityError(f"short read of {n} bytes at {offset}")
        at += n


def _bytes_of(t: torch.Tensor) -> Any:
    """A writable uint8 numpy view of a contiguous tensor's memory."""
    return t.reshape(-1).view(torch.uint8).numpy()


def read_into(f: BufferedReader, spec: TensorSpec, out: torch.Tensor) -> None:
    """Read one tensor's bytes from ``f`` into ``out`` (contiguous, same dtype and shape).

    Raises:
        IntegrityError: the file ends before the tensor does.
    """
    if out.dtype != spec.dtype or tuple(out.shape) != spec.shape or not out.is_contiguous():
        raise InvalidInput(f"destination {out.dtype}{tuple(out.shape)} does not fit {spec}")
    if spec.end == spec.start:
        return
    f.seek(spec.start)
    got = f.readinto(memoryview(_bytes_of(out)))
    if got != spec.end - spec.start:
        raise IntegrityError(f"short read: {got} of {spec.end - spec.start} bytes")


def keep_frames(shape: tuple[int, ...], frames: int | None) -> tuple[int, ...]:
    """The shape after keeping the first ``frames`` latent frames.

    Latents are ``(C, T, H, W)`` or ``(1, C, T, H, W)`` (a batch of one, as many
    caches store them); a bucket holds clips with at least its frame count, and the
    loader keeps the leading ``frames`` of the T axis so that every sample of a step
    has one shape. Tensors of another rank, or no longer than ``frames``, are unchanged.
    """
    axis = _frames_axis(shape)
    if frames is None or axis is None or shape[axis] <= frames:
        return shape
    return (*shape[:axis], frames, *shape[axis + 1 :])


def _frames_axis(shape: tuple[int, ...]) -> int | None:
    if len(shape) == 4:
        return 1
    if len(shape) == 5 and shape[0] == 1:
        return 2
    return None


def trim_frames(t: torch.Tensor, frames: int | None) -> torch.Tensor:
    """``t`` cut to the shape :func:`keep_frames` gives (a contiguous copy when cut)."""
    shape = tuple(t.shape)
    if keep_frames(shape, frames) == shape:
        return t
    return t[:, :frames].contiguous() if len(shape) == 4 else t[:, :, :frames].contiguous()


def read_frames_into(f: BufferedReader, spec: TensorSpec, out: torch.Tensor) -> None:
    """:func:`read_into` for a ``(C, T, H, W)`` (or ``(1, C, T, H, W)``) tensor cut to
    ``out``'s leading frames.

    Reads each channel's first ``out.shape[1]`` frames (one contiguous run per channel)
    straight into ``out``: still one copy.
    """
    if tuple(out.shape) == spec.shape:
        read_into(f, spec, out)
        return
    if len(spec.shape) == 5 and out.dim() == 5:  # (1, C, T, H, W): its one (C, T, H, W)
        spec = TensorSpec(spec.dtype, spec.shape[1:], spec.start, spec.end)
        out = out[0]
    c, t, h, w = spec.shape
    if out.dtype != spec.dtype or tuple(out.shape) != (c, out.shape[1], h, w) or out.shape[1] > t:
        raise InvalidInput(f"destination {out.dtype}{tuple(out.shape)} does not fit {spec}")
    itemsize = spec.dtype.itemsize
    run = out.shape[1] * h * w * itemsize
    stride = t * h * w * itemsize
    dest = memoryview(_bytes_of(out))
    for ch in range(c):
        f.seek(spec.start + ch * stride)
        got = f.readinto(dest[ch * run : (ch + 1) * run])
        if got != run:
            raise IntegrityError(f"short read: {got} of {run} bytes")


def copy_into(out: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``out`` byte for byte, without a torch kernel (thread-friendly)."""
    if out.dtype != src.dtype or out.shape != src.shape:
        raise InvalidInput(f"cannot copy {src.dtype}{tuple(src.shape)} into {out.dtype}")
    np.copyto(_bytes_of(out), _bytes_of(src.contiguous()))
