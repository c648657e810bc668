"""The tensors a ``torch.save`` member holds (names, shapes, dtypes), read by range.

A ``.pt`` file is a zip whose ``data.pkl`` describes every tensor (its storage type,
shape and strides); the tensor bytes sit in other zip entries. :func:`pt_specs` reads
the zip's central directory (one read of the member's last 4 KiB) and ``data.pkl``
(one read of 8 KiB) by range — a few KiB of a member of any size — and walks the
pickle with an unpickler that builds nothing: it knows only the handful of globals a
tensor's pickle uses and maps each to a stub, so no code in the (not yet verified)
bytes can run. Anything else — a legacy non-zip
``.pt``, a pickle naming another global — raises :class:`IntegrityError`, and the
importer falls back to what the sidecar declares.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from catalog.errors import IntegrityError

__all__ = ["PtTensor", "pt_specs"]

ReadRange = Callable[[int, int], bytes]

#: torch storage class name -> the dtype name the latents table records.
_STORAGES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}
_MAX_PICKLE = 16 << 20
#: Bytes read at once at a member's end (its zip central directory).
_TAIL = 4096


@dataclass(frozen=True)
class PtTensor:
    """One tensor of a ``.pt`` member: its dtype name and shape."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Storage:
    dtype: str


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over ``read(offset, n)`` of a ``size``-byte member."""

    def __init__(self, read: ReadRange, size: int) -> None:
        self._read, self._size, self._pos = read, size, 0
        self._tail_at = max(0, size - _TAIL)
        self._tail: bytes | None = None  # the zip's end: EOCD and central directory

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        if self._pos >= self._tail_at:  # one request serves every central-directory read
            if self._tail is None:
                self._tail = self._read(self._tail_at, self._size - self._tail_at)
            start = self._pos - self._tail_at
            data = self._tail[start : start + n]
        else:
            data = self._read(self._pos, min(n, self._tail_at - self._pos))
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _rebuild(storage: Any, _offset: Any, size: Any, *_rest: Any) -> PtTensor:
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor without a storage")
    return PtTensor(storage.dtype, tuple(int(x) for x in size))


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild
        if module == "collections" and name == "OrderedDict":
            return dict
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        raise pickle.UnpicklingError(f"global {module}.{name} is not part of a tensor dict")

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 2 and pid[0] == "storage":
            kind = pid[1]
            if isinstance(kind, str):
                return _Storage(kind)
        raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")


def pt_specs(read: ReadRange, size: int, what: str) -> dict[str, PtTensor]:
    """Name -> :class:`PtTensor` of a ``.pt`` member holding a tensor or a dict of them.

    Args:
        read: ``read(offset, n)`` within the member (a ranged GET).
        size: The member's size.
        what: Names the member in errors.

    Raises:
        IntegrityError: not a zip ``torch.save`` of a tensor or a dict of tensors.
    """
    try:
        with zipfile.ZipFile(io.BufferedReader(_RangeFile(read, size), 8192)) as z:
            names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(names) != 1 or z.getinfo(names[0]).file_size > _MAX_PICKLE:
                raise IntegrityError(f"{what}: no data.pkl of a sane size")
            obj = _Unpickler(io.BytesIO(z.read(names[0]))).load()
    except IntegrityError:
        raise
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, KeyError) as exc:
        raise IntegrityError(f"{what}: cannot read the tensor header: {exc}") from exc
    if isinstance(obj, PtTensor):
        return {"latent": obj}
    if isinstance(obj, dict) and obj and all(isinstance(v, PtTensor) for v in obj.values()):
        return {str(k): v for k, v in obj.items()}
    raise IntegrityError(f"{what}: holds {type(obj).__name__}, not a tensor or dict of tensors")
