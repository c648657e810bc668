"""The near-duplicate rule: fingerprints and the exact candidate search.

A fingerprint is a sequence of 64-bit perceptual frame hashes, each stored big-endian (8
bytes per frame). Two assets A and B are near-duplicates iff,
over the first ``L = min(len(A), len(B), window)`` aligned frames, at least
``min_frames`` positions ``i`` have ``popcount(A[i] ^ B[i]) <= max_distance`` and both
``A[i]`` and ``B[i]`` are *informative* (between :data:`MIN_FRAME_BITS` and
``64 - MIN_FRAME_BITS`` bits set: blank and constant frames hash to nearly all-0 or
all-1 and must not make every video with a black intro a duplicate of every other).
Frames are compared at the same index only (re-encodes of one video, not trims).

Candidates are found without comparing every pair, by keys that any matching pair
shares (:func:`band_keys`); only pairs that share a key are verified, vectorised. Two
hashes within ``max_distance`` bits agree exactly on at least one of ``max_distance + 1``
disjoint bit bands, so a matching *position* shares a (position, band, value) key. A
match needs ``min_frames`` of the first ``window`` positions, so at most
``s = window - min_frames`` of them fail, and:

* **pair keys** (when ``2 (s + 1) <= window`` and ``max_distance <= 7``): of the ``s + 1``
  disjoint position pairs ``(0, 1), (2, 3), ...`` at least one has both positions
  matching, so the pair shares a key made of one band of each of its two frames:
  ``(s + 1)·(max_distance + 1)²`` keys per fingerprint (75 for the default rule) of two
  bands' bits together (~25), where one position's band (~13 bits) would make a random
  frame a candidate of every ~8,000th asset;
* **single keys** (otherwise): one of the ``s + 1`` positions ``0 .. s`` matches, so it
  shares a (position, band) key.

Either way the search is exact: it finds every pair the rule accepts
(docs/decisions/037-pair-keys.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = [
    "FRAME_BYTES",
    "MIN_FRAME_BITS",
    "NearDupRule",
    "band_keys",
    "fingerprint_matrix",
    "frame_match_counts",
    "is_near_duplicate",
    "key_codes",
    "near_duplicate_pairs",
    "pack_fingerprint",
    "unpack_fingerprint",
]

#: Bytes per frame hash in a fingerprint.
FRAME_BYTES = 8
#: A frame hash with fewer than this many bits set (or more than ``64 -`` this) is
#: uninformative (a blank or constant frame) and never counts as a match.
MIN_FRAME_BITS = 8
#: Candidate pairs verified per vectorised chunk (bounds memory to ~100 MB).
_VERIFY_CHUNK = 1 << 20
#: Fingerprints decoded per vectorised chunk.
_DECODE_CHUNK = 1 << 16
#: Constants of the 64-bit mix that joins two bands into one pair key.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def pack_fingerprint(frame_hashes: Iterable[int]) -> bytes:
    """Frame hashes (unsigned 64-bit ints) to the stored fingerprint bytes."""
    return np.asarray(list(frame_hashes), dtype=np.uint64).astype(">u8").tobytes()


def unpack_fingerprint(fingerprint: bytes) -> NDArray[np.uint64]:
    """Stored fingerprint bytes to frame hashes."""
    if len(fingerprint) % FRAME_BYTES:
        raise ValueError(
            f"a fingerprint is a multiple of {FRAME_BYTES} bytes, got {len(fingerprint)}"
        )
    return np.frombuffer(fingerprint, dtype=">u8").astype(np.uint64)


def fingerprint_matrix(
    fingerprints: pa.Array | pa.ChunkedArray, window: int
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Decode a binary column of fingerprints into a padded frame matrix, vectorised.

    Args:
        fingerprints: Binary fingerprints (nulls allowed: zero frames).
        window: How many leading frames to keep.

    Returns:
        ``(frames, lengths)``: ``frames[i, k]`` is frame ``k`` of row ``i`` for
        ``k < lengths[i]`` (0 beyond), ``lengths[i] = min(frames in row i, window)``.
    """
    arr = (
        fingerprints.combine_chunks() if isinstance(fingerprints, pa.ChunkedArray) else fingerprints
    )
    arr = arr.cast(pa.large_binary())
    n = len(arr)
    frames = np.zeros((n, window), dtype=np.uint64)
    lengths = np.zeros(n, dtype=np.int64)
    if n == 0 or window == 0:
        return frames, lengths
    nbytes = np.asarray(
        pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    lengths = np.minimum(nbytes // FRAME_BYTES, window)
    data_buf = arr.buffers()[2]
    if data_buf is None or not lengths.any():
        return frames, np.zeros(n, dtype=np.int64)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n]
    data = np.frombuffer(data_buf, dtype=np.uint8)
    k = np.arange(window, dtype=np.int64)
    byte = np.arange(FRAME_BYTES, dtype=np.int64)
    for start in range(0, n, _DECODE_CHUNK):  # bounds the (rows, window, 8) index array
        stop = min(start + _DECODE_CHUNK, n)
        valid = k[None, :] < lengths[start:stop, None]
        first = np.where(valid, offsets[start:stop, None] + FRAME_BYTES * k[None, :], 0)
        raw = np.ascontiguousarray(data[first[:, :, None] + byte[None, None, :]])
        decoded = raw.view(">u8").reshape(stop - start, window).astype(np.uint64)
        frames[start:stop][valid] = decoded[valid]
    return frames, lengths


@dataclass(frozen=True)
class NearDupRule:
    """Parameters of the near-duplicate rule (module docstring).

    Attributes:
        max_distance: Hamming threshold per 64-bit frame hash (``0 .. 31``).
        min_frames: Matching aligned frames needed (``>= 1``).
        window: Leading frames compared (``>= min_frames``).
    """

    max_distance: int = 4
    min_frames: int = 6
    window: int = 8

    def __post_init__(self) -> None:
        if not 0 <= self.max_distance <= 31:
            raise ValueError("max_distance must be in 0..31")
        if not 1 <= self.min_frames <= self.window:
            raise ValueError("need 1 <= min_frames <= window")

    def bands(self) -> list[tuple[int, int]]:
        """The ``max_distance + 1`` disjoint bit ranges ``[lo, hi)`` of a frame hash."""
        edges = [b * 64 // (self.max_distance + 1) for b in range(self.max_distance + 2)]
        return list(itertools.pairwise(edges))

    def key_pairs(self) -> list[tuple[int, int]]:
        """The disjoint position pairs of the pair keys (module docstring), or ``[]``
        where the rule needs single keys: ``s + 1`` pairs for ``s = window -
        min_frames`` failed positions, when they fit the window and a band has at
        least 8 bits."""
        slack = self.window - self.min_frames
        if 2 * (slack + 1) > self.window or self.max_distance > 7:
            return []
        return [(2 * k, 2 * k + 1) for k in range(slack + 1)]

    def index_key(self) -> str:
        """What an index of :func:`band_keys` depends on (a change rebuilds it)."""
        kind = "pairs" if self.key_pairs() else "singles"
        return f"{self.max_distance}/{self.min_frames}/{self.window}/{kind}-v1"


def _informative(frames: NDArray[np.uint64]) -> NDArray[np.bool_]:
    bits = np.bitwise_count(frames)
    return (bits >= MIN_FRAME_BITS) & (bits <= 64 - MIN_FRAME_BITS)


def frame_match_counts(
    a: NDArray[np.uint64],
    a_len: NDArray[np.int64],
    b: NDArray[np.uint64],
    b_len: NDArray[np.int64],
    rule: NearDupRule,
) -> NDArray[np.int64]:
    """Matching aligned frames for each row pair ``(a[i], b[i])`` (matrices as from
    :func:`fingerprint_matrix` with ``rule.window`` columns)."""
    w = rule.window
    usable = np.arange(w)[None, :] < np.minimum(a_len, b_len)[:, None]
    close = np.bitwise_count(a[:, :w] ^ b[:, :w]) <= rule.max_distance
    ok = usable & close & _informative(a[:, :w]) & _informative(b[:, :w])
    counts: NDArray[np.int64] = np.count_nonzero(ok, axis=1).astype(np.int64)
    return counts


def is_near_duplicate(
    a: Sequence[int] | NDArray[np.uint64], b: Sequence[int] | NDArray[np.uint64], rule: NearDupRule
) -> bool:
    """The rule for one pair of frame-hash sequences (a reference for tests and docs)."""
    fa = np.zeros((1, rule.window), dtype=np.uint64)
    fb = np.zeros((1, rule.window), dtype=np.uint64)
    la, lb = min(len(a), rule.window), min(len(b), rule.window)
    fa[0, :la] = np.asarray(a, dtype=np.uint64)[:la]
    fb[0, :lb] = np.asarray(b, dtype=np.uint64)[:lb]
    counts = frame_match_counts(fa, np.array([la]), fb, np.array([lb]), rule)
    return bool(counts[0] >= rule.min_frames)


def near_duplicate_pairs(
    query: NDArray[np.uint64],
    query_len: NDArray[np.int64],
    ref: NDArray[np.uint64],
    ref_len: NDArray[np.int64],
    rule: NearDupRule,
    *,
    same: bool = False,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Every pair ``(i, j)`` with ``query[i]`` a near-duplicate of ``ref[j]``.

    Args:
        query, query_len: Frame matrix and lengths of the new fingerprints.
        ref, ref_len: Frame matrix and lengths of the fingerprints to search.
        rule: The matching rule.
        same: ``query`` and ``ref`` are the same rows: report each unordered pair once
            (``i < j``) and never a row with itself.

    Returns:
        ``(query_index, ref_index)``, sorted, without repeats.
    """
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if len(query) == 0 or len(ref) == 0:
        return empty
    n_ref = len(ref)
    q_row, q_code = _sorted_codes(*band_keys(query, query_len, rule))
    r_row, r_code = (q_row, q_code) if same else _sorted_codes(*band_keys(ref, ref_len, rule))
    # Sorted needles: the binary searches walk the reference keys in order.
    left = np.searchsorted(r_code, q_code, side="left")
    counts = np.searchsorted(r_code, q_code, side="right") - left
    total = int(counts.sum())
    if total == 0:
        return empty
    qi = np.repeat(q_row, counts)
    # Positions left[k] .. right[k]-1 for every query key k, flattened.
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    ri = r_row[np.repeat(left, counts) + within]
    cand = np.unique(qi * n_ref + ri)
    qi_all, ri_all = cand // n_ref, cand % n_ref
    if same:
        keep = qi_all < ri_all
        qi_all, ri_all = qi_all[keep], ri_all[keep]
    hits: list[NDArray[np.bool_]] = []
    for start in range(0, len(qi_all), _VERIFY_CHUNK):
        qi, ri = qi_all[start : start + _VERIFY_CHUNK], ri_all[start : start + _VERIFY_CHUNK]
        counts = frame_match_counts(query[qi], query_len[qi], ref[ri], ref_len[ri], rule)
        hits.append(counts >= rule.min_frames)
    hit = np.concatenate(hits) if hits else np.zeros(0, dtype=np.bool_)
    return qi_all[hit], ri_all[hit]


def key_codes(slot: NDArray[np.int64], value: NDArray[np.int64]) -> NDArray[np.uint64]:
    """One 64-bit code per :func:`band_keys` key (a hash of its slot and value: a
    collision only adds a candidate, which the rule then rejects)."""
    return _mix(slot.view(np.uint64), value.view(np.uint64))


def _sorted_codes(
    row: NDArray[np.int64], slot: NDArray[np.int64], value: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """The :func:`key_codes` of keys in code order, with the row of each."""
    code = key_codes(slot, value)
    order = np.argsort(code)
    return row[order], code[order]


def _mix(a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """A 64-bit hash of ``(a, b)`` (splitmix64's finaliser over ``a·φ ^ b``)."""
    with np.errstate(over="ignore"):
        x = (a * _GOLDEN) ^ b
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        out: NDArray[np.uint64] = x ^ (x >> np.uint64(31))
    return out


def band_keys(
    frames: NDArray[np.uint64], lengths: NDArray[np.int64], rule: NearDupRule
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """The search keys of each fingerprint (module docstring), for
    :func:`near_duplicate_pairs` and for an index kept outside memory
    (:mod:`catalog.key_index`).

    Every pair the rule accepts shares at least one key; a key is emitted only where
    its positions exist and their frames are informative.

    Returns:
        ``(row, slot, value)``: ``slot`` numbers the key's positions and bands; the
        value is the band's bits (single keys) or the two bands' bits side by side
        (pair keys; a 64-bit hash of them where they need more than 63 bits), as a
        signed 64-bit int (a 64-bit band wraps; equality holds).
    """
    w = rule.window
    inf = _informative(frames[:, :w]) if len(frames) else np.zeros((0, w), dtype=np.bool_)
    pairs = rule.key_pairs()
    if pairs:
        parts = _pair_keys(frames, lengths, inf, rule, pairs)
    else:
        parts = _single_keys(frames, lengths, inf, rule)
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    rows, slots, values = zip(*parts, strict=True)
    return (
        np.concatenate(rows).astype(np.int64),
        np.concatenate(slots).astype(np.int64),
        np.concatenate(values).view(np.int64),
    )


_KeyPart = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.uint64]]


def _band(frames: NDArray[np.uint64], lo: int, hi: int) -> NDArray[np.uint64]:
    mask = np.uint64((1 << (hi - lo)) - 1)
    out: NDArray[np.uint64] = (frames >> np.uint64(lo)) & mask
    return out


def _single_keys(
    frames: NDArray[np.uint64],
    lengths: NDArray[np.int64],
    inf: NDArray[np.bool_],
    rule: NearDupRule,
) -> list[_KeyPart]:
    """(position, band) keys at positions ``0 .. window - min_frames``."""
    bands, out = rule.bands(), []
    for pos in range(rule.window - rule.min_frames + 1):
        rows = np.flatnonzero((lengths > pos) & inf[:, pos])
        for b, (lo, hi) in enumerate(bands):
            slot = np.full(len(rows), pos * len(bands) + b, dtype=np.int64)
            out.append((rows, slot, _band(frames[rows, pos], lo, hi)))
    return out


def _pair_keys(
    frames: NDArray[np.uint64],
    lengths: NDArray[np.int64],
    inf: NDArray[np.bool_],
    rule: NearDupRule,
    pairs: list[tuple[int, int]],
) -> list[_KeyPart]:
    """(position pair, band at each) keys: one band of each frame, hashed together."""
    bands, out = rule.bands(), []
    nb = len(bands)
    for k, (p, q) in enumerate(pairs):
        rows = np.flatnonzero((lengths > q) & inf[:, p] & inf[:, q])
        for i, (lo_p, hi_p) in enumerate(bands):
            first = _band(frames[rows, p], lo_p, hi_p)
            for j, (lo_q, hi_q) in enumerate(bands):
                slot = np.full(len(rows), (k * nb + i) * nb + j, dtype=np.int64)
                second = _band(frames[rows, q], lo_q, hi_q)
                out.append((rows, slot, _join(first, hi_p - lo_p, second, hi_q - lo_q)))
    return out


def _join(
    first: NDArray[np.uint64], first_bits: int, second: NDArray[np.uint64], second_bits: int
) -> NDArray[np.uint64]:
    """Two bands as one value: their bits side by side where the bands' widths fit in
    63 bits (small integers: a compact index), else a 64-bit hash of both. The choice
    depends on the rule only, so both sides of a pair make the same value."""
    if first_bits + second_bits <= 63:
        out: NDArray[np.uint64] = (first << np.uint64(second_bits)) | second
        return out
    return _mix(first, second)
