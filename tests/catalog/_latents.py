"""Real latent bytes for catalog tests: safetensors and ``.npy`` members whose headers
say what a row claims (the catalog reads them at ingest)."""

from __future__ import annotations

import io
import json
import math
import struct
from collections.abc import Mapping, Sequence

import numpy as np

_ST_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1}


def safetensors_bytes(
    tensors: Mapping[str, tuple[str, Sequence[int]]], *, header: Mapping[str, object] | None = None
) -> bytes:
    """A safetensors file of zero-filled tensors ``{key: (dtype code, shape)}``;
    ``header`` overrides entries of the JSON header (to make a broken one)."""
    entries: dict[str, object] = {}
    at = 0
    for key, (dtype, shape) in tensors.items():
        n = math.prod(shape) * _ST_SIZES[dtype]
        entries[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    entries.update(header or {})
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * at


def npy_bytes(shape: Sequence[int], dtype: str = "<f2") -> bytes:
    """A ``.npy`` file of a zero array."""
    buf = io.BytesIO()
    np.save(buf, np.zeros(tuple(shape), dtype=np.dtype(dtype)), allow_pickle=False)
    return buf.getvalue()
