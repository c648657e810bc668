"""The near-duplicate search keys (``catalog/rules/neardup.py``): exact (every pair the
rule accepts shares a key, checked against a brute-force all-pairs pass over a few
hundred fingerprints built at the rule's edge) and selective (unrelated fingerprints
almost never share one, so the candidates of a batch do not grow with the catalog)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from catalog import rules
from catalog.rules import NearDupRule

RULE = NearDupRule()


def random_frames(rng: np.random.Generator, n: int, window: int) -> NDArray[np.uint64]:
    """``n`` fingerprints of informative uniform frame hashes (24..40 bits set)."""
    out = rng.integers(0, 2**64, size=(n, window), dtype=np.uint64)
    bits = np.bitwise_count(out)
    bad = (bits < 24) | (bits > 40)
    while bad.any():
        out[bad] = rng.integers(0, 2**64, size=int(bad.sum()), dtype=np.uint64)
        bits = np.bitwise_count(out)
        bad = (bits < 24) | (bits > 40)
    return out


def edge_copy(
    src: NDArray[np.uint64], rule: NearDupRule, rng: np.random.Generator
) -> NDArray[np.uint64]:
    """A copy of one fingerprint at the rule's edge: ``0 .. window - min_frames + 1``
    positions pushed past the threshold (so some copies just miss), every other frame
    with ``max_distance`` bits flipped, one in each band but one (so exactly one band
    agrees: the pigeonhole's worst case)."""
    bands = rule.bands()
    out = src.copy()
    slack = rule.window - rule.min_frames
    far = set(rng.permutation(rule.window)[: int(rng.integers(0, slack + 2))].tolist())
    for pos in range(len(src)):
        if pos in far:
            flips = rng.choice(
                64, min(64, rule.max_distance + 1 + int(rng.integers(0, 4))), replace=False
            )
        else:
            keep = int(rng.integers(0, len(bands)))
            picks = [b for b in range(len(bands)) if b != keep][: rule.max_distance]
            flips = np.array([rng.integers(*bands[b]) for b in picks], dtype=np.int64)
        for bit in flips.tolist():
            out[pos] ^= np.uint64(1) << np.uint64(bit)
    return out


def corpus(
    rule: NearDupRule, seed: int, n: int, copies: int
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """``n`` random fingerprints (random lengths around the window) and ``copies``
    edge copies of random earlier ones (copies of copies too)."""
    rng = np.random.default_rng(seed)
    frames = random_frames(rng, n + copies, rule.window)
    lengths = rng.integers(max(0, rule.min_frames - 1), rule.window + 1, size=n + copies)
    for k in range(n, n + copies):
        src = int(rng.integers(0, k))
        frames[k] = edge_copy(frames[src], rule, rng)
        lengths[k] = (
            lengths[src] if rng.random() < 0.7 else rng.integers(rule.min_frames, rule.window + 1)
        )
    return frames, lengths.astype(np.int64)


def brute_force(
    frames: NDArray[np.uint64], lengths: NDArray[np.int64], rule: NearDupRule
) -> set[tuple[int, int]]:
    """Every pair ``i < j`` the rule accepts, by comparing all pairs."""
    n = len(frames)
    i, j = np.triu_indices(n, k=1)
    counts = rules.frame_match_counts(frames[i], lengths[i], frames[j], lengths[j], rule)
    hit = counts >= rule.min_frames
    return set(zip(i[hit].tolist(), j[hit].tolist(), strict=True))


def key_sharing(
    a: NDArray[np.uint64], a_len: NDArray[np.int64], b: NDArray[np.uint64], b_len: NDArray[np.int64]
) -> set[tuple[int, int]]:
    """Every (row of ``a``, row of ``b``) pair sharing a :func:`rules.band_keys` key."""
    ra, sa, va = rules.band_keys(a, a_len, RULE)
    rb, sb, vb = rules.band_keys(b, b_len, RULE)
    index: dict[tuple[int, int], list[int]] = {}
    for r, s, v in zip(rb.tolist(), sb.tolist(), vb.tolist(), strict=True):
        index.setdefault((s, v), []).append(r)
    return {
        (r, other)
        for r, s, v in zip(ra.tolist(), sa.tolist(), va.tolist(), strict=True)
        for other in index.get((s, v), ())
    }


edge_rules = st.one_of(
    st.just(RULE),
    st.builds(
        NearDupRule,
        max_distance=st.integers(0, 9),
        min_frames=st.integers(1, 8),
        window=st.integers(8, 10),
    ),
)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=30)
@given(rule=edge_rules, seed=st.integers(0, 2**16), n=st.integers(20, 200))
def test_the_search_finds_exactly_the_brute_force_pairs(
    rule: NearDupRule, seed: int, n: int
) -> None:
    frames, lengths = corpus(rule, seed, n, copies=n)
    want = brute_force(frames, lengths, rule)
    si, sj = rules.near_duplicate_pairs(frames, lengths, frames, lengths, rule, same=True)
    assert set(zip(si.tolist(), sj.tolist(), strict=True)) == want
    half = len(frames) // 2  # new rows against older ones, as ingest asks the index
    qi, ri = rules.near_duplicate_pairs(
        frames[half:], lengths[half:], frames[:half], lengths[:half], rule
    )
    got = {(int(r), int(q) + half) for q, r in zip(qi.tolist(), ri.tolist(), strict=True)}
    assert got == {(i, j) for i, j in want if i < half <= j}


def test_the_default_rule_uses_pair_keys() -> None:
    assert RULE.key_pairs() == [(0, 1), (2, 3), (4, 5)]
    frames, lengths = corpus(RULE, 3, 300, copies=300)
    want = brute_force(frames, lengths, RULE)
    assert len(want) > 100  # many copies are within the rule, at its edge
    shared = key_sharing(frames, lengths, frames, lengths)
    assert want <= shared


def test_unrelated_fingerprints_almost_never_share_a_key() -> None:
    """1,000 random fingerprints against 4,000: each would share a single-position band
    key with ~9 of them (15 keys of 12-13 bits); the pair keys make that ~0.01."""
    rng = np.random.default_rng(5)
    ref = random_frames(rng, 4000, RULE.window)
    query = random_frames(rng, 1000, RULE.window)
    full = np.full(4000, RULE.window, dtype=np.int64)
    shared = key_sharing(query, full[:1000], ref, full)
    assert len(shared) < 100


def test_keys_skip_missing_and_blank_frames() -> None:
    rng = np.random.default_rng(9)
    frames = random_frames(rng, 3, RULE.window)
    frames[1, 3] = 0  # blank: pair (2, 3) has no key
    lengths = np.array([RULE.window, RULE.window, 4], dtype=np.int64)  # row 2: pairs 0-1, 2-3
    row, slot, _ = rules.band_keys(frames, lengths, RULE)
    per_pair = len(RULE.bands()) ** 2
    assert sorted(set((slot[row == 0] // per_pair).tolist())) == [0, 1, 2]
    assert sorted(set((slot[row == 1] // per_pair).tolist())) == [0, 2]
    assert sorted(set((slot[row == 2] // per_pair).tolist())) == [0, 1]
    assert np.count_nonzero(row == 0) == 3 * per_pair


def test_rules_without_room_for_pairs_fall_back_to_single_keys() -> None:
    assert NearDupRule(max_distance=4, min_frames=4, window=8).key_pairs() == []
    assert NearDupRule(max_distance=8, min_frames=6, window=8).key_pairs() == []
    assert NearDupRule(max_distance=4, min_frames=1, window=1).key_pairs() == []
    assert NearDupRule(max_distance=0, min_frames=2, window=2).key_pairs() == [(0, 1)]
    assert NearDupRule().index_key() != NearDupRule(max_distance=4, min_frames=4).index_key()
