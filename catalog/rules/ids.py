"""Pure id rules: the eval carve-out and clip ids.

**Eval carve-out.** An asset is ``eval`` iff ``H / 2**256 < eval_fraction`` where
``H = int.from_bytes(sha256(bytes.fromhex(salt) + bytes.fromhex(asset_id)), "big")``:
the 32 raw bytes of the salt followed by the 32 raw bytes of the asset id (not their
hex text). The comparison is exact (rational arithmetic on the tie case).

**Clip ids.** ``clip_id = sha256(f"{asset_id}:{t_start_s:.6f}:{t_end_s:.6f}:{split_version}"
.encode("utf-8")).hexdigest()[:32]``: 128 bits, lowercase hex, ``-0.0`` taken as ``0.0``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog.hash_worker import sha256_prefixes

__all__ = ["clip_id", "clip_ids", "eval_mask", "new_eval_salt"]


def new_eval_salt() -> str:
    """A fresh random salt: 32 bytes as 64 lowercase hex characters."""
    return secrets.token_hex(32)


def eval_mask(
    asset_ids: Sequence[str] | pa.Array | pa.ChunkedArray, salt: str, fraction: float
) -> NDArray[np.bool_]:
    """Which assets fall in the eval split (see the module docstring for the rule).

    Args:
        asset_ids: 64-hex asset ids (validated by the caller).
        salt: The catalog's frozen salt, hex.
        fraction: The catalog's frozen eval fraction, in ``[0, 1]``.

    Returns:
        A boolean array, True where the asset is ``eval``.
    """
    ids = (
        asset_ids.to_pylist()
        if isinstance(asset_ids, pa.Array | pa.ChunkedArray)
        else list(asset_ids)
    )
    n = len(ids)
    if fraction <= 0.0 or n == 0:
        return np.zeros(n, dtype=np.bool_)
    if fraction >= 1.0:
        return np.ones(n, dtype=np.bool_)
    salt_bytes = bytes.fromhex(salt)
    digests = b"".join(hashlib.sha256(salt_bytes + bytes.fromhex(a)).digest() for a in ids)
    words = np.frombuffer(digests, dtype=">u8").reshape(n, 4)
    # H < fraction * 2**256 decided on the top 64 bits; only an exact tie on them (odds
    # 2**-64) needs the full 256-bit comparison.
    threshold = Fraction(fraction) * 2**256
    top_threshold = int(threshold // 2**192)
    top = words[:, 0].astype(np.uint64)
    mask = top < np.uint64(top_threshold)
    for i in np.flatnonzero(top == np.uint64(top_threshold)):
        h = int.from_bytes(digests[32 * i : 32 * i + 32], "big")
        mask[i] = h < threshold
    return mask


# -- clip ids ---------------------------------------------------------------------------
def clip_id(asset_id: str, t_start_s: float, t_end_s: float, split_version: str) -> str:
    """The deterministic id of a clip (see the module docstring)."""
    text = f"{asset_id}:{t_start_s + 0.0:.6f}:{t_end_s + 0.0:.6f}:{split_version}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def clip_ids(
    asset_ids: pa.Array | pa.ChunkedArray | Sequence[str],
    t_start_s: NDArray[np.float64] | Sequence[float],
    t_end_s: NDArray[np.float64] | Sequence[float],
    split_versions: pa.Array | pa.ChunkedArray | Sequence[str],
) -> pa.Array:
    """:func:`clip_id` over aligned columns, vectorised but for the hash itself.

    The ``.6f`` texts are built in Arrow from the rounded microsecond count; a value
    whose rounding is not clear-cut in binary (within float error of a half
    microsecond), negative, huge or non-finite is formatted by Python instead, so the
    result always equals :func:`clip_id`.

    Raises:
        ValueError: A row has a null input.
    """
    texts = pc.binary_join_element_wise(
        _as_strings(asset_ids),
        _fixed6(t_start_s),
        _fixed6(t_end_s),
        _as_strings(split_versions),
        _large(":"),
    )
    texts = (texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts).cast(
        pa.large_binary()  # the UTF-8 bytes, as Python ``bytes`` below
    )
    n = len(texts)
    if n == 0:
        return pa.array([], pa.large_string())
    if texts.null_count:
        row = int(pc.index(pc.is_null(texts), True).as_py())
        raise ValueError(f"clip_ids: row {row} has a null input (a clip's fields are required)")
    # The one per-row step: the digests' first 16 bytes in one buffer (a large batch's
    # hashed in a worker process, off this one's GIL: catalog.hash_worker), then hex
    # in numpy (no per-row str objects, no list-to-Arrow conversion).
    digests = sha256_prefixes(texts, 16)
    return _hex_prefix_strings(np.frombuffer(digests, dtype=np.uint8).reshape(n, 16))


#: The two hex digits of each byte value, as one 2-byte unit (one gather per byte).
_HEX_PAIRS = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), dtype="V2")


def _hex_prefix_strings(raw: NDArray[np.uint8]) -> pa.Array:
    """Rows of bytes as lowercase hex strings (``large_string``), vectorised."""
    n, width = raw.shape
    text = np.ascontiguousarray(_HEX_PAIRS[raw])
    offsets = np.arange(0, 2 * width * n + 1, 2 * width, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))


def _large(text: str) -> pa.Scalar:
    return pa.scalar(text, pa.large_string())


def _as_strings(values: pa.Array | pa.ChunkedArray | Sequence[str]) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.cast(pa.large_string())
    return pa.array(list(values), pa.large_string())


def _fixed6(values: NDArray[np.float64] | Sequence[float]) -> pa.Array:
    """``f"{x + 0.0:.6f}"`` for every value, vectorised where that is exact."""
    x = np.asarray(values, dtype=np.float64) + 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = x * 1e6
        half = np.abs(scaled - np.floor(scaled) - 0.5)
        risky = (
            ~np.isfinite(scaled) | (x < 0) | (scaled >= 2.0**52) | (half < 1e-6 + scaled * 1e-15)
        )
    micros = np.where(risky, 0, np.rint(np.where(risky, 0, scaled))).astype(np.int64)
    text = _micros_text(micros)
    if risky.any():
        fixed = text.to_pylist()
        for i in np.flatnonzero(risky):
            fixed[i] = f"{x[i]:.6f}"
        text = pa.array(fixed, pa.large_string())
    return text


#: A decimal of scale 6 prints as ``<whole>.<six digits>``: exactly ``.6f`` of a
#: non-negative microsecond count (precision 38 holds any int64).
_SCALE6 = pa.decimal128(38, 6)


def _micros_text(micros: NDArray[np.int64]) -> pa.Array:
    """``f"{m / 1e6:.6f}"`` of non-negative microsecond counts, as one Arrow cast: each
    count is the unscaled value of a scale-6 decimal (little-endian 128-bit words),
    2.5x faster than joining the whole and zero-padded fractional parts."""
    words = np.zeros((len(micros), 2), dtype=np.int64)
    words[:, 0] = micros
    words[:, 1] = micros >> 63  # the sign extension (0: the counts are non-negative)
    decimals = pa.Array.from_buffers(_SCALE6, len(micros), [None, pa.py_buffer(words)])
    return decimals.cast(pa.large_string())
