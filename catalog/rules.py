"""Pure ingest rules: the eval carve-out, clip ids, and near-duplicate matching.

Every function here is a pure function of its arguments (arrays in, arrays out, no
catalog state), so that property tests can check them and the catalog can apply them
to a 100k-row batch without a Python loop per row (hashing aside).

**Eval carve-out.** An asset is ``eval`` iff ``H / 2**256 < eval_fraction`` where
``H = int.from_bytes(sha256(bytes.fromhex(salt) + bytes.fromhex(asset_id)), "big")``:
the 32 raw bytes of the salt followed by the 32 raw bytes of the asset id (not their
hex text). The comparison is exact (rational arithmetic on the tie case).

**Clip ids.** ``clip_id = sha256(f"{asset_id}:{t_start_s:.6f}:{t_end_s:.6f}:{split_version}"
.encode("utf-8")).hexdigest()[:32]``: 128 bits, lowercase hex, ``-0.0`` taken as ``0.0``.

**Near-duplicates.** A fingerprint is a sequence of 64-bit perceptual frame hashes,
each stored big-endian (8 bytes per frame). Two assets A and B are near-duplicates iff,
over the first ``L = min(len(A), len(B), window)`` aligned frames, at least
``min_frames`` positions ``i`` have ``popcount(A[i] ^ B[i]) <= max_distance`` and both
``A[i]`` and ``B[i]`` are *informative* (between :data:`MIN_FRAME_BITS` and
``64 - MIN_FRAME_BITS`` bits set: blank and constant frames hash to nearly all-0 or
all-1 and must not make every video with a black intro a duplicate of every other).
Frames are compared at the same index only (re-encodes of one video, not trims).

Candidates are found without comparing every pair. By pigeonhole, a matching pair has
a matching frame among positions ``0 .. window - min_frames``, and two hashes within
``max_distance`` bits agree exactly on at least one of ``max_distance + 1`` disjoint bit
bands. So the reference side is indexed by (position, band, band value) in sorted
arrays, each query frame looks up its band values with ``searchsorted``, and only the
pairs that share a key are verified, vectorised. The search is exact: it finds every
pair the rule accepts. Linked assets form groups (connected components of every link
ever recorded); a group's canonical copy has the highest bitrate, ties to the smallest
asset id (:func:`plan_links`, :func:`asset_status`).

**Append-only facts.** :func:`latest_rows` picks one row per key by a total order, so
that "the latest score" does not depend on file order. An asset's status is its latest
event of :data:`STATUS_EVENTS`; at one instant the event listed first wins
("quarantined": the safe side). The catalog (:func:`asset_status`) and the cut's SQL
(``materializer/select.py``) both rank by that one tuple.

**Membership.** :func:`hex_prefix64` digests hex ids to 64 bits; a sorted digest index
(:func:`sorted_index`, :func:`index_merge`, :func:`digest_matches`) finds candidate
rows in ``O(log n)`` per key, and callers compare the full keys, so a digest collision
can never fake a match.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = [
    "FRAME_BYTES",
    "MIN_FRAME_BITS",
    "STATUS_EVENTS",
    "Links",
    "NearDupRule",
    "asset_status",
    "canonical_indices",
    "clip_id",
    "clip_ids",
    "connected_components",
    "digest_matches",
    "eval_mask",
    "fingerprint_matrix",
    "frame_match_counts",
    "hex_prefix64",
    "index_merge",
    "is_near_duplicate",
    "latest_rows",
    "latest_status_events",
    "link_edges",
    "near_duplicate_pairs",
    "new_eval_salt",
    "pack_fingerprint",
    "plan_links",
    "sorted_index",
    "unpack_fingerprint",
]

#: Bytes per frame hash in a fingerprint.
FRAME_BYTES = 8
#: A frame hash with fewer than this many bits set (or more than ``64 -`` this) is
#: uninformative (a blank or constant frame) and never counts as a match.
MIN_FRAME_BITS = 8
#: The events that set an asset's status, in the order they win a tie at the same
#: ``at``: the latest event decides, and at one instant "quarantined" wins (the safe
#: side). Every reader of the status ranks by this tuple (``list_position`` in SQL).
STATUS_EVENTS = ("quarantined", "released")
#: Candidate pairs verified per vectorised chunk (bounds memory to ~100 MB).
_VERIFY_CHUNK = 1 << 20
#: Fingerprints decoded per vectorised chunk.
_DECODE_CHUNK = 1 << 16


# -- eval carve-out ---------------------------------------------------------------------
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
    """
    texts = pc.binary_join_element_wise(
        _as_strings(asset_ids),
        _fixed6(t_start_s),
        _fixed6(t_end_s),
        _as_strings(split_versions),
        _large(":"),
    )
    texts = (texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts).cast(
        pa.large_string()
    )
    n = len(texts)
    if n == 0:
        return pa.array([], pa.large_string())
    data = texts.buffers()[2]
    raw = data.to_pybytes() if data is not None else b""
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int64)[
        texts.offset : texts.offset + n + 1
    ].tolist()
    # The one per-row Python step: raw digests joined into one buffer, then hex in
    # numpy (no per-row str objects, no list-to-Arrow conversion).
    sha = hashlib.sha256
    digests = b"".join([sha(raw[a:b]).digest() for a, b in itertools.pairwise(offsets)])
    return _hex_prefix_strings(np.frombuffer(digests, dtype=np.uint8).reshape(n, 32)[:, :16])


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
    whole = pc.cast(pa.array(micros // 1_000_000), pa.large_string())
    frac = pc.utf8_lpad(pc.cast(pa.array(micros % 1_000_000), pa.large_string()), 6, "0")
    text = pc.binary_join_element_wise(whole, frac, _large("."))
    if risky.any():
        fixed = text.to_pylist()
        for i in np.flatnonzero(risky):
            fixed[i] = f"{x[i]:.6f}"
        text = pa.array(fixed, pa.large_string())
    return text


# -- fingerprints -----------------------------------------------------------------------
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


# -- near-duplicates --------------------------------------------------------------------
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
    w, n_ref = rule.window, len(ref)
    q_inf, r_inf = _informative(query[:, :w]), _informative(ref[:, :w])
    codes: list[NDArray[np.int64]] = []
    for pos in range(w - rule.min_frames + 1):
        r_rows = np.flatnonzero((ref_len > pos) & r_inf[:, pos])
        q_rows = np.flatnonzero((query_len > pos) & q_inf[:, pos])
        if len(r_rows) == 0 or len(q_rows) == 0:
            continue
        for lo, hi in rule.bands():
            mask = np.uint64((1 << (hi - lo)) - 1)
            r_val = (ref[r_rows, pos] >> np.uint64(lo)) & mask
            q_val = (query[q_rows, pos] >> np.uint64(lo)) & mask
            order = np.argsort(r_val, kind="stable")
            r_sorted = r_val[order]
            left = np.searchsorted(r_sorted, q_val, side="left")
            right = np.searchsorted(r_sorted, q_val, side="right")
            counts = right - left
            total = int(counts.sum())
            if total == 0:
                continue
            qi = np.repeat(q_rows, counts)
            # Positions left[k] .. right[k]-1 for every query k, flattened.
            within = np.arange(total, dtype=np.int64) - np.repeat(
                np.cumsum(counts) - counts, counts
            )
            ri = r_rows[order[np.repeat(left, counts) + within]]
            codes.append(qi.astype(np.int64) * n_ref + ri.astype(np.int64))
    if not codes:
        return empty
    cand = np.unique(np.concatenate(codes))
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


def connected_components(n: int, u: NDArray[np.int64], v: NDArray[np.int64]) -> NDArray[np.int64]:
    """Label each of ``n`` nodes with the smallest node index of its component.

    Edges are ``(u[k], v[k])``. Vectorised hook-and-compress: every round hooks each
    edge's larger root under the smaller one, then pointer-jumps to full compression;
    labels only decrease, so it terminates, in a few rounds for real graphs.
    """
    parent = np.arange(n, dtype=np.int64)
    if len(u) == 0:
        return parent
    while True:
        pu, pv = parent[u], parent[v]
        if np.array_equal(pu, pv):
            return parent
        low = np.minimum(pu, pv)
        np.minimum.at(parent, pu, low)
        np.minimum.at(parent, pv, low)
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped


def canonical_indices(
    labels: NDArray[np.int64], bitrate: NDArray[np.float64], asset_ids: NDArray[np.str_]
) -> NDArray[np.int64]:
    """For each node, the index of its component's canonical copy.

    The canonical copy is the member with the highest bitrate (NaN counts as lowest);
    ties go to the smallest asset id. The choice depends only on the members, never on
    their order.
    """
    n = len(labels)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rate = np.where(np.isnan(bitrate), -np.inf, bitrate)
    order = np.lexsort((asset_ids, -rate, labels))
    sorted_labels = labels[order]
    first = np.ones(n, dtype=np.bool_)
    first[1:] = sorted_labels[1:] != sorted_labels[:-1]
    best = order[first]  # canonical of each label, labels ascending
    return best[np.searchsorted(sorted_labels[first], labels)]


@dataclass(frozen=True)
class Links:
    """Near-duplicate links for a batch of new assets (see :func:`plan_links`).

    Node indices: existing assets ``0 .. n_old-1``, then the batch's ``n_old ..``.

    Attributes:
        duplicate_of: Per new asset, the node of its group's canonical copy (-1: it is
            canonical, or unlinked).
        match_owner, match_other: Direct matches, sorted: new asset ``match_owner[k]``
            (0-based in the batch) matched node ``match_other[k]``.
        event_asset, event_canonical: One ``near_duplicate`` event per link made now:
            each new linked asset, and each existing group root a better new copy (or
            a merge of groups) displaced.
    """

    duplicate_of: NDArray[np.int64]
    match_owner: NDArray[np.int64]
    match_other: NDArray[np.int64]
    event_asset: NDArray[np.int64]
    event_canonical: NDArray[np.int64]


def plan_links(
    n_old: int,
    m: int,
    old_edges: tuple[NDArray[np.int64], NDArray[np.int64]],
    with_old: tuple[NDArray[np.int64], NDArray[np.int64]],
    in_batch: tuple[NDArray[np.int64], NDArray[np.int64]],
    rate_of: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    ids_of: Callable[[NDArray[np.int64]], NDArray[np.str_]],
) -> Links:
    """Link ``m`` new assets into the near-duplicate graph.

    Args:
        n_old: Existing assets.
        m: New assets.
        old_edges: Recorded links among existing assets (node pairs).
        with_old: Matches ``(new i, existing j)`` of this batch.
        in_batch: Matches ``(new i, new j)``, ``i < j``.
        rate_of: Bitrate of nodes (NaN: unknown, ranks lowest).
        ids_of: Asset ids of nodes (ties go to the smallest).

    The groups are the connected components of all links; each group's canonical copy
    is :func:`canonical_indices` of its members, so the outcome depends on the set of
    links, never on batch order.
    """
    qi, ri = with_old
    bi, bj = in_batch
    old_u, old_v = old_edges
    new_u = np.concatenate([qi + n_old, bi + n_old])
    new_v = np.concatenate([ri, bj + n_old])
    nodes = np.unique(np.concatenate([old_u, old_v, new_u, new_v]))  # only linked nodes
    rate, ids = rate_of(nodes), ids_of(nodes)

    def canonical(u: NDArray[np.int64], v: NDArray[np.int64]) -> NDArray[np.int64]:
        labels = connected_components(
            len(nodes), np.searchsorted(nodes, u), np.searchsorted(nodes, v)
        )
        return canonical_indices(labels, rate, ids)

    canon_new = canonical(np.concatenate([old_u, new_u]), np.concatenate([old_v, new_v]))
    canon_old = canonical(old_u, old_v)
    here = np.arange(len(nodes))
    is_new = nodes >= n_old
    linked = np.flatnonzero(is_new & (canon_new != here))
    duplicate_of = np.full(m, -1, dtype=np.int64)
    duplicate_of[nodes[linked] - n_old] = nodes[canon_new[linked]]
    relinked = np.flatnonzero(~is_new & (canon_old == here) & (canon_new != here))
    src = np.concatenate([linked, relinked])
    owner = np.concatenate([qi, bi, bj]).astype(np.int64)
    other = np.concatenate([ri, bj + n_old, bi + n_old]).astype(np.int64)
    order = np.lexsort((other, owner))
    return Links(duplicate_of, owner[order], other[order], nodes[src], nodes[canon_new[src]])


# -- resolution of append-only facts ------------------------------------------------------
def latest_rows(rows: pa.Table, keys: Sequence[str], order: Sequence[tuple[str, str]]) -> pa.Table:
    """The first row of each ``keys`` group after sorting by ``order`` within groups.

    Args:
        rows: Any table holding ``keys`` and the ``order`` columns.
        keys: Group columns; the result is sorted by them.
        order: ``(column, "ascending" | "descending")`` pairs ranking rows in a group;
            the first wins. Rank by every column that can differ so that the result does
            not depend on file order.
    """
    n = rows.num_rows
    if n == 0:
        return rows
    sort_keys = [(k, "ascending", "at_end") for k in keys]
    sort_keys += [(c, d, "at_end") for c, d in order if c in rows.column_names]
    ordered = rows.take(pc.sort_indices(rows, sort_keys=sort_keys))
    first = np.zeros(n, dtype=np.bool_)
    first[0] = True
    for k in keys:
        col = ordered[k]
        first[1:] |= np.asarray(
            pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        )
    return ordered.filter(pa.array(first))


def link_edges(
    asset_ids: pa.Array,
    near_duplicates: pa.ChunkedArray | pa.Array,
    duplicate_of: pa.ChunkedArray | pa.Array,
    event_assets: pa.ChunkedArray | pa.Array,
    event_related: pa.ChunkedArray | pa.Array,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Recorded near-duplicate links as edges between rows of ``asset_ids``.

    A link is recorded by an asset's ``near_duplicates`` list, its ``duplicate_of``,
    or a ``near_duplicate`` event (``event_assets[k]`` → ``event_related[k]``). Links to
    unknown assets are dropped.
    """
    flat = pc.list_flatten(near_duplicates)
    parents = np.asarray(
        pc.list_parent_indices(near_duplicates).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    has_dup = np.flatnonzero(np.asarray(pc.is_valid(duplicate_of).to_numpy(zero_copy_only=False)))
    parts = [
        flat,
        pc.take(duplicate_of, pa.array(has_dup, pa.int64())),
        event_assets,
        event_related,
    ]
    names = pa.chunked_array(
        [
            c.cast(pa.large_string())
            for p in parts
            for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])
        ],
        type=pa.large_string(),
    )
    idx = pc.fill_null(pc.index_in(names, value_set=asset_ids.cast(pa.large_string())), -1)
    found = np.asarray(idx.to_numpy(zero_copy_only=False), dtype=np.int64)
    k1, k2, k3 = len(flat), len(has_dup), len(event_assets)
    u = np.concatenate([parents, has_dup, found[k1 + k2 : k1 + k2 + k3]])
    v = np.concatenate([found[:k1], found[k1 : k1 + k2], found[k1 + k2 + k3 :]])
    ok = (u >= 0) & (v >= 0) & (u != v)
    return u[ok], v[ok]


def latest_status_events(events: pa.Table) -> pa.Table:
    """Each asset's status event (``asset_id``, ``event``, ``at``): its latest event of
    :data:`STATUS_EVENTS`, ties at one ``at`` to the event listed first."""
    kinds = pa.array(STATUS_EVENTS, events.schema.field("event").type)
    status = events.filter(pc.is_in(events["event"], value_set=kinds))
    ranked = status.append_column("_rank", pc.index_in(status["event"], value_set=kinds))
    latest = latest_rows(ranked, ["asset_id"], [("at", "descending"), ("_rank", "ascending")])
    return latest.drop_columns(["_rank"])


def asset_status(assets: pa.Table, tombstones: pa.Table, events: pa.Table) -> pa.Table:
    """Per-asset governance state from the append-only facts (see
    ``VidlakeCatalog.asset_status`` for the columns)."""
    ids = assets["asset_id"].combine_chunks()
    n = len(ids)
    tomb = np.zeros(n, dtype=np.bool_)
    hard = np.zeros(n, dtype=np.bool_)
    at = np.asarray(
        pc.fill_null(pc.index_in(tombstones["asset_id"], value_set=ids), -1).to_numpy(),
        dtype=np.int64,
    )
    is_hard = np.asarray(
        pc.equal(tombstones["kind"], "hard").to_numpy(zero_copy_only=False), dtype=np.bool_
    )
    tomb[at[at >= 0]] = True
    hard[at[(at >= 0) & is_hard]] = True

    latest = latest_status_events(events)
    latest = latest.filter(pc.equal(latest["event"], "quarantined"))
    quarantined = np.zeros(n, dtype=np.bool_)
    q_at = np.asarray(
        pc.fill_null(pc.index_in(latest["asset_id"], value_set=ids), -1).to_numpy(), dtype=np.int64
    )
    quarantined[q_at[q_at >= 0]] = True

    links = events.filter(pc.equal(events["event"], "near_duplicate"))
    u, v = link_edges(
        ids,
        assets["near_duplicates"],
        assets["duplicate_of"],
        links["asset_id"],
        links["related_asset_id"],
    )
    duplicate_of = np.full(n, None, dtype=object)
    of_eval = np.zeros(n, dtype=np.bool_)
    is_eval = np.asarray(
        pc.equal(assets["split"], "eval").to_numpy(zero_copy_only=False), dtype=np.bool_
    )
    if len(u):
        nodes = np.unique(np.concatenate([u, v]))
        labels = connected_components(
            len(nodes), np.searchsorted(nodes, u), np.searchsorted(nodes, v)
        )
        rate = bitrates(assets)
        node_ids = np.asarray(ids.take(pa.array(nodes)).to_pylist(), dtype="U64")
        canon = canonical_indices(labels, rate[nodes], node_ids)
        linked = canon != np.arange(len(nodes))
        duplicate_of[nodes[linked]] = node_ids[canon[linked]]
        eval_labels = np.unique(labels[is_eval[nodes]])
        of_eval[nodes] = np.isin(labels, eval_labels) & ~is_eval[nodes]
    tomb_kind = np.full(n, None, dtype=object)
    tomb_kind[tomb] = "soft"
    tomb_kind[hard] = "hard"
    return pa.table(
        {
            "asset_id": ids,
            "split": assets["split"],
            "tombstoned": pa.array(tomb),
            "tombstone_kind": pa.array(tomb_kind.tolist(), pa.large_string()),
            "quarantined": pa.array(quarantined),
            "duplicate_of": pa.array(duplicate_of.tolist(), pa.large_string()),
            "near_dup_of_eval": pa.array(of_eval),
        }
    )


# -- exact membership against a growing key set --------------------------------------------
_HEX_NIBBLE = np.full(256, 255, dtype=np.uint8)
_HEX_NIBBLE[np.frombuffer(b"0123456789", dtype=np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX_NIBBLE[np.frombuffer(b"abcdef", dtype=np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def hex_prefix64(ids: pa.Array | pa.ChunkedArray) -> NDArray[np.uint64]:
    """The first 16 hex digits of each id as an unsigned 64-bit int, vectorised.

    Ids must be lowercase hex of at least 16 characters (validated by the caller);
    used as a digest for :func:`digest_matches`, never as an identity.
    """
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    arr = arr.cast(pa.large_string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)
    width = int(offsets[1] - offsets[0])
    if width >= 16 and (np.diff(offsets) == width).all():
        # Equal widths (the usual batch of ids): a 2-D view, 16 digits packed into 8
        # bytes read as one big-endian integer: ~6x faster than digit by digit.
        grid = data[offsets[0] : offsets[-1]].reshape(n, width)[:, :16]
        nibbles = _HEX_NIBBLE[grid]
        packed = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
        return packed.view(">u8").reshape(n).astype(np.uint64)
    offsets = offsets[:n]
    out = np.zeros(n, dtype=np.uint64)
    for k in range(16):  # one hex digit at a time keeps every temporary one column wide
        out = (out << np.uint64(4)) | _HEX_NIBBLE[data[offsets + k]].astype(np.uint64)
    return out


def sorted_index(digests: NDArray[np.uint64]) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """``(sorted digests, row of each)``: a searchable index of ``digests``."""
    # Not a stable sort: rows sharing a digest are all candidates anyway, and the
    # default sort is ~6x faster on 64-bit keys.
    order = np.argsort(digests).astype(np.int64)
    return digests[order], order


def index_merge(
    index: tuple[NDArray[np.uint64], NDArray[np.int64]],
    more: tuple[NDArray[np.uint64], NDArray[np.int64]],
    row_offset: int,
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Merge the index of rows appended after ``index``'s (their rows shift by
    ``row_offset``): one linear merge, never a re-sort of the whole set."""
    keys, rows = index
    at = np.searchsorted(keys, more[0], side="right")
    return np.insert(keys, at, more[0]), np.insert(rows, at, more[1] + row_offset)


def digest_matches(
    index: tuple[NDArray[np.uint64], NDArray[np.int64]], query: NDArray[np.uint64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Every ``(query position, indexed row)`` pair with equal digests."""
    keys, rows = index
    if len(keys) == 0 or len(query) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # Sorted queries walk the index in order (cache-friendly); most find nothing, so
    # the right edge is only searched for the hits.
    order = np.argsort(query)
    q = query[order]
    left = np.searchsorted(keys, q, side="left")
    hit = np.flatnonzero(keys[np.minimum(left, len(keys) - 1)] == q)
    right = np.searchsorted(keys, q[hit], side="right")
    counts = (right - left[hit]).astype(np.int64)
    total = int(counts.sum())
    qi = np.repeat(order[hit].astype(np.int64), counts)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return qi, rows[np.repeat(left[hit], counts) + within]


def bitrates(rows: pa.Table) -> NDArray[np.float64]:
    """``probe_bitrate`` as float64 (NaN where null or absent). The cast is unchecked: a
    bitrate above 2**53 loses its last bits, which no near-duplicate rule can notice,
    where a checked cast would refuse every later ingest once such a row is stored."""
    if "probe_bitrate" not in rows.column_names:
        return np.full(rows.num_rows, np.nan)
    column = pc.cast(rows["probe_bitrate"], pa.float64(), safe=False)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
