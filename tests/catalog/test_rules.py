"""Property tests for the pure ingest rules (``catalog/rules/``)."""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from catalog import rules
from catalog.rules import NearDupRule

hex64 = st.binary(min_size=32, max_size=32).map(bytes.hex)
salts = st.binary(min_size=1, max_size=32).map(bytes.hex)


def _hash_with_bits(spec: tuple[int, int]) -> int:
    k, seed = spec
    return sum(1 << int(b) for b in np.random.default_rng(seed).choice(64, k, replace=False))


#: Frame hashes with enough bits set to count even after 8 flips (the rule ignores
#: blank frames).
informative = st.tuples(
    st.integers(rules.MIN_FRAME_BITS + 8, 64 - rules.MIN_FRAME_BITS - 8), st.integers(0, 2**32)
).map(_hash_with_bits)
near_dup_rules = st.builds(
    NearDupRule,
    max_distance=st.integers(0, 8),
    min_frames=st.integers(1, 6),
    window=st.integers(6, 10),
)


def random_ids(n: int, seed: int) -> list[str]:
    raw = np.random.default_rng(seed).integers(0, 256, size=(n, 32), dtype=np.uint8).tobytes()
    return [raw[i * 32 : (i + 1) * 32].hex() for i in range(n)]


# -- eval carve-out ---------------------------------------------------------------------
@given(ids=st.lists(hex64, max_size=40), salt=salts, fraction=st.floats(0, 1))
def test_eval_mask_is_the_documented_hash_rule(ids: list[str], salt: str, fraction: float) -> None:
    mask = rules.eval_mask(ids, salt, fraction)
    for a, got in zip(ids, mask, strict=True):
        h = int.from_bytes(hashlib.sha256(bytes.fromhex(salt) + bytes.fromhex(a)).digest(), "big")
        assert got == (Fraction(h, 2**256) < Fraction(fraction))


@given(
    ids=st.lists(hex64, min_size=1, max_size=30),
    salt=salts,
    fraction=st.floats(0, 1),
    seed=st.integers(0, 99),
)
def test_eval_mask_is_stable_per_asset(
    ids: list[str], salt: str, fraction: float, seed: int
) -> None:
    once = rules.eval_mask(ids, salt, fraction)
    assert np.array_equal(once, rules.eval_mask(ids, salt, fraction))
    # Each asset's split depends on that asset alone: any order, any company.
    order = np.random.default_rng(seed).permutation(len(ids))
    assert np.array_equal(rules.eval_mask([ids[i] for i in order], salt, fraction), once[order])
    assert np.array_equal(rules.eval_mask(pa.array(ids), salt, fraction), once)


@given(ids=st.lists(hex64, max_size=30), salt=salts, f1=st.floats(0, 1), f2=st.floats(0, 1))
def test_a_larger_fraction_only_adds_eval_assets(
    ids: list[str], salt: str, f1: float, f2: float
) -> None:
    lo, hi = sorted([f1, f2])
    assert not (rules.eval_mask(ids, salt, lo) & ~rules.eval_mask(ids, salt, hi)).any()


@settings(max_examples=6, deadline=None)
@given(salt=salts, fraction=st.floats(0.005, 0.5), seed=st.integers(0, 2**16))
def test_eval_fraction_within_tolerance_over_100k_ids(
    salt: str, fraction: float, seed: int
) -> None:
    n = 100_000
    share = rules.eval_mask(random_ids(n, seed), salt, fraction).mean()
    sigma = (fraction * (1 - fraction) / n) ** 0.5
    assert abs(share - fraction) <= 5 * sigma


def test_eval_mask_edges() -> None:
    ids = random_ids(50, 1)
    assert not rules.eval_mask(ids, "00", 0.0).any()
    assert rules.eval_mask(ids, "00", 1.0).all()
    assert rules.eval_mask([], "00", 0.5).shape == (0,)


# -- clip ids -------------------------------------------------------------------------
times = st.one_of(
    st.floats(0, 1e7, allow_nan=False),
    st.sampled_from([0.0, -0.0, 5e-7, 1.5e-6, 2.5e-6, 0.1234565, 1e-320, 4503599627.370497]),
    st.integers(0, 10**7).map(lambda k: k / 2e6),  # exact half microseconds
)


@given(
    rows=st.lists(
        st.tuples(hex64, times, times, st.text(min_size=1, max_size=8)),
        max_size=25,
    )
)
def test_vectorised_clip_ids_equal_the_reference(rows: list[tuple[str, float, float, str]]) -> None:
    a, s, e, v = (list(x) for x in zip(*rows, strict=True)) if rows else ([], [], [], [])
    got = rules.clip_ids(
        a, np.array(s, dtype=np.float64), np.array(e, dtype=np.float64), v
    ).to_pylist()
    assert got == [rules.clip_id(*r) for r in rows]
    assert all(len(c) == 32 and int(c, 16) >= 0 for c in got)


@given(
    rows=st.lists(
        st.tuples(
            st.one_of(hex64, st.text(max_size=70)),  # any text: unicode, ':', empty
            times,
            times,
            st.text(max_size=12),  # an empty split version too
        ),
        max_size=40,
    )
)
def test_vectorised_clip_ids_equal_the_reference_on_any_text(
    rows: list[tuple[str, float, float, str]],
) -> None:
    a, s, e, v = (list(x) for x in zip(*rows, strict=True)) if rows else ([], [], [], [])
    arrays = pa.array(a, pa.string()), pa.array(v, pa.large_string())
    got = rules.clip_ids(arrays[0], np.array(s), np.array(e), arrays[1]).to_pylist()
    assert got == [rules.clip_id(*r) for r in rows]


def test_vectorised_clip_ids_of_sliced_and_chunked_columns() -> None:
    a = ["ab" * 32, "é" * 3, "", "x:y"] * 5
    s, e = np.arange(20) * 0.5, np.arange(20) * 0.5 + 2.000_000_5
    v = pa.chunked_array([["v1"] * 7, ["", "ü"] * 6 + ["v2"]])
    want = [rules.clip_id(x, y, z, w) for x, y, z, w in zip(a, s, e, v.to_pylist(), strict=True)]
    assert rules.clip_ids(a, s, e, v).to_pylist() == want
    sliced = pa.array(["pad", *a])[1:]  # a non-zero Arrow offset
    assert rules.clip_ids(sliced, s, e, v).to_pylist() == want


def test_vectorised_clip_ids_at_digit_and_rounding_boundaries() -> None:
    # Where the whole part gains a digit, the fraction carries, or a value sits just
    # under the exactness limit of the vectorised text (2**52 microseconds).
    edges = [0.0, 1e-6, 4.9e-7, 5.1e-7, 0.9999994, 0.9999996, 9.999999, 9.9999996, 10.0]
    edges += [10.0**k - 1e-6 for k in range(1, 10)] + [10.0**k for k in range(1, 10)]
    edges += [4503599627.370495, 4503599627.370496, 4503599627.370497, 1e-300, 5e-324]
    x = np.array(edges, dtype=np.float64)
    a = ["ab" * 32] * len(x)
    got = rules.clip_ids(a, x, x[::-1].copy(), ["v"] * len(x)).to_pylist()
    assert got == [rules.clip_id("ab" * 32, s, e, "v") for s, e in zip(x, x[::-1], strict=True)]


def test_vectorised_clip_ids_refuse_a_null_input() -> None:
    with pytest.raises(ValueError, match="row 1 has a null input"):
        rules.clip_ids(["a", None], np.zeros(2), np.ones(2), ["v", "v"])


def test_clip_id_is_the_documented_hash() -> None:
    a = "ab" * 32
    text = f"{a}:1.500000:3.000000:scenes-v1"
    assert rules.clip_id(a, 1.5, 3.0, "scenes-v1") == hashlib.sha256(text.encode()).hexdigest()[:32]
    assert rules.clip_id(a, -0.0, 1.0, "v") == rules.clip_id(a, 0.0, 1.0, "v")
    assert rules.clip_id(a, 0.0, 1.0, "v") != rules.clip_id(a, 0.0, 1.0, "w")


# -- fingerprints -----------------------------------------------------------------------
@given(
    fps=st.lists(
        st.one_of(st.none(), st.lists(st.integers(0, 2**64 - 1), max_size=12)), max_size=12
    ),
    window=st.integers(1, 10),
)
def test_fingerprint_matrix_decodes_the_stored_bytes(
    fps: list[list[int] | None], window: int
) -> None:
    arr = pa.array([None if f is None else rules.pack_fingerprint(f) for f in fps], pa.binary())
    for view in (arr, arr.slice(1) if len(arr) else arr):
        rows = fps[1:] if view is not arr else fps
        frames, lengths = rules.fingerprint_matrix(view, window)
        for i, f in enumerate(rows):
            f = f or []
            assert lengths[i] == min(len(f), window)
            assert frames[i, : lengths[i]].tolist() == f[:window]
            assert not frames[i, lengths[i] :].any()
        for f in rows:
            if f:
                assert rules.unpack_fingerprint(rules.pack_fingerprint(f)).tolist() == f


def _flip_each(frames: list[int], bits: list[int], seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [
        h ^ sum(1 << int(b) for b in rng.choice(64, k, replace=False))
        for h, k in zip(frames, bits, strict=True)
    ]


@given(rule=near_dup_rules, frames=st.lists(informative, min_size=1, max_size=12), data=st.data())
def test_flipping_up_to_the_threshold_links(
    rule: NearDupRule, frames: list[int], data: st.DataObject
) -> None:
    bits = data.draw(
        st.lists(st.integers(0, rule.max_distance), min_size=len(frames), max_size=len(frames))
    )
    copy = _flip_each(frames, bits, data.draw(st.integers(0, 2**16)))
    linked = rules.is_near_duplicate(frames, copy, rule)
    assert linked == (min(len(frames), rule.window) >= rule.min_frames)


@given(rule=near_dup_rules, frames=st.lists(informative, min_size=1, max_size=12), data=st.data())
def test_too_many_distant_frames_do_not_link(
    rule: NearDupRule, frames: list[int], data: st.DataObject
) -> None:
    compared = min(len(frames), rule.window)
    # Push more than (compared - min_frames) of the compared frames past the threshold.
    far = data.draw(st.integers(max(0, compared - rule.min_frames + 1), compared))
    which = set(data.draw(st.permutations(range(compared)))[:far])
    bits = [
        data.draw(st.integers(rule.max_distance + 1, 64)) if i in which else 0
        for i in range(len(frames))
    ]
    copy = _flip_each(frames, bits, data.draw(st.integers(0, 2**16)))
    assert not rules.is_near_duplicate(frames, copy, rule)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=60)
@given(
    rule=near_dup_rules,
    seed=st.integers(0, 2**16),
    n=st.integers(1, 30),
    planted=st.integers(0, 10),
)
def test_indexed_search_finds_exactly_the_brute_force_pairs(
    rule: NearDupRule, seed: int, n: int, planted: int
) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, rule.window + 3, size=n)
    fps = [[int(x) for x in rng.integers(0, 2**64, size=k, dtype=np.uint64)] for k in lengths]
    for _ in range(planted):  # near copies, some within the threshold, some beyond it
        src = fps[int(rng.integers(0, n))]
        bits = rng.integers(0, rule.max_distance + 3, size=len(src)).tolist()
        fps.append(_flip_each(src, bits, int(rng.integers(0, 2**16))))
    arr = pa.array([rules.pack_fingerprint(f) for f in fps], pa.binary())
    frames, lens = rules.fingerprint_matrix(arr, rule.window)
    split = len(fps) // 2
    q, r = slice(split, None), slice(None, split)
    qi, ri = rules.near_duplicate_pairs(frames[q], lens[q], frames[r], lens[r], rule)
    got = set(zip((qi + split).tolist(), ri.tolist(), strict=True))
    want = {
        (i, j)
        for i in range(split, len(fps))
        for j in range(split)
        if rules.is_near_duplicate(fps[i], fps[j], rule)
    }
    assert got == want
    si, sj = rules.near_duplicate_pairs(frames, lens, frames, lens, rule, same=True)
    got_same = set(zip(si.tolist(), sj.tolist(), strict=True))
    want_same = {
        (i, j)
        for i in range(len(fps))
        for j in range(i + 1, len(fps))
        if rules.is_near_duplicate(fps[i], fps[j], rule)
    }
    assert got_same == want_same


def _reference_components(n: int, edges: list[tuple[int, int]]) -> list[int]:
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for u, v in edges:
        a, b = root(u), root(v)
        parent[max(a, b)] = min(a, b)
    return [min(i for i in range(n) if root(i) == root(x)) for x in range(n)]


@given(n=st.integers(1, 40), data=st.data())
def test_connected_components_match_union_find(n: int, data: st.DataObject) -> None:
    edges = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=60)
    )
    u = np.array([e[0] for e in edges], dtype=np.int64)
    v = np.array([e[1] for e in edges], dtype=np.int64)
    assert rules.connected_components(n, u, v).tolist() == _reference_components(n, edges)


@given(
    members=st.lists(
        st.tuples(hex64, st.one_of(st.none(), st.integers(0, 5))),
        min_size=1,
        max_size=12,
        unique_by=lambda m: m[0],
    ),
    seed=st.integers(0, 2**16),
)
def test_canonical_copy_is_order_independent(
    members: list[tuple[str, int | None]], seed: int
) -> None:
    def canonical(order: list[int]) -> str:
        ids = np.array([members[i][0] for i in order], dtype="U64")
        rate = np.array(
            [np.nan if members[i][1] is None else members[i][1] for i in order], dtype=np.float64
        )
        labels = np.zeros(len(order), dtype=np.int64)
        picks = rules.canonical_indices(labels, rate, ids)
        assert len(set(picks.tolist())) == 1
        return str(ids[picks[0]])

    n = len(members)
    best = canonical(list(range(n)))
    assert best == canonical(np.random.default_rng(seed).permutation(n).tolist())
    top = max(-1 if b is None else b for _, b in members)
    assert best == min(a for a, b in members if (-1 if b is None else b) == top)


# -- the digest index -------------------------------------------------------------------
@given(
    stored=st.lists(hex64, max_size=40, unique=True),
    queries=st.lists(hex64, max_size=20),
    prefix=st.text("0123456789abcdef", min_size=16, max_size=16),
    collide=st.integers(0, 10),
)
def test_digest_lookup_is_exact_even_when_digests_collide(
    stored: list[str], queries: list[str], prefix: str, collide: int
) -> None:
    # Force shared 64-bit digests: ids that differ only after the first 16 hex digits.
    clash = [prefix + h[16:] for h in stored[:collide]]
    stored = list(dict.fromkeys(stored + clash))
    queries = queries + clash[:2] + [prefix + "f" * 48] + stored[:3]
    half = len(stored) // 2
    index = rules.sorted_index(rules.hex_prefix64(pa.array(stored[:half])))
    index = rules.index_merge(
        index, rules.sorted_index(rules.hex_prefix64(pa.array(stored[half:]))), half
    )
    qi, rows = rules.digest_matches(index, rules.hex_prefix64(pa.array(queries)))
    exact = {
        (i, j) for i, j in zip(qi.tolist(), rows.tolist(), strict=True) if queries[i] == stored[j]
    }
    assert exact == {(i, stored.index(q)) for i, q in enumerate(queries) if q in stored}
    # Every candidate shares the digest; no true match is missed.
    assert all(
        queries[i][:16] == stored[j][:16] for i, j in zip(qi.tolist(), rows.tolist(), strict=True)
    )


def test_hex_prefix64_reads_the_leading_digits() -> None:
    ids = pa.array(["0123456789abcdef" + "0" * 48, "f" * 64, None])
    out = rules.hex_prefix64(ids.slice(0, 2))
    assert out.tolist() == [0x0123456789ABCDEF, 2**64 - 1]


# -- latest rows ------------------------------------------------------------------------
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.sampled_from("xy"),
            st.integers(0, 3),
            st.sampled_from(["v1", "v2"]),
        ),
        max_size=30,
    ),
    seed=st.integers(0, 2**16),
)
def test_latest_rows_do_not_depend_on_row_order(
    rows: list[tuple[str, str, int, str]], seed: int
) -> None:
    assume(rows)
    table = pa.table(
        {
            k: list(col)
            for k, col in zip(
                ["clip", "filter", "t", "version"], zip(*rows, strict=True), strict=True
            )
        }
    )
    order = [("t", "descending"), ("version", "descending")]
    want = rules.latest_rows(table, ["clip", "filter"], order)
    shuffled = table.take(pa.array(np.random.default_rng(seed).permutation(len(rows))))
    assert rules.latest_rows(shuffled, ["clip", "filter"], order).equals(want)
    assert want.num_rows == len({(r[0], r[1]) for r in rows})
    for r in want.to_pylist():
        best = max((t, v) for c, f, t, v in rows if (c, f) == (r["clip"], r["filter"]))
        assert (r["t"], r["version"]) == best


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["quarantined", "released", "near_duplicate"]),
            st.integers(0, 3),
        ),
        max_size=20,
    ),
    seed=st.integers(0, 2**16),
)
def test_status_is_the_latest_event_and_a_tie_quarantines(
    events: list[tuple[str, str, int]], seed: int
) -> None:
    """At the latest instant of an asset's status events, a quarantine wins over a
    release, whatever order the rows were written in."""
    table = pa.table(
        {
            "asset_id": pa.array([a for a, _, _ in events], pa.string()),
            "event": pa.array([e for _, e, _ in events], pa.string()),
            "at": pa.array([t for _, _, t in events], pa.int64()),
        }
    )
    shuffled = table.take(pa.array(np.random.default_rng(seed).permutation(len(events))))
    got = {r["asset_id"]: r["event"] for r in rules.latest_status_events(shuffled).to_pylist()}
    want = {}
    for asset in {a for a, e, _ in events if e in rules.STATUS_EVENTS}:
        mine = [(t, e) for a, e, t in events if a == asset and e in rules.STATUS_EVENTS]
        last = max(t for t, _ in mine)
        want[asset] = min((e for t, e in mine if t == last), key=rules.STATUS_EVENTS.index)
    assert got == want
    assert rules.STATUS_EVENTS[0] == "quarantined"  # the safe side wins a tie


def test_rule_parameters_are_checked() -> None:
    with pytest.raises(ValueError):
        NearDupRule(max_distance=40)
    with pytest.raises(ValueError):
        NearDupRule(min_frames=9, window=8)
    assert len(NearDupRule(max_distance=4).bands()) == 5
