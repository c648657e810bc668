"""EmbeddingIndex against a real LanceDB directory, checked against brute force."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import embeddings as emb
from catalog.embeddings import EmbeddingIndex, table_name_for
from catalog.errors import InvalidBatch, InvalidInput
from catalog.vectors import pairs_within_vectors

DIM = 16


def _unit(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _brute_pairs(ids, vecs, d, other_ids=None, other_vecs=None, margin=1e-5):
    """Pairs within d in float64, plus the set of pairs too close to d to call."""
    q = _unit(vecs)
    self_join = other_ids is None
    o = q if self_join else _unit(other_vecs)
    oid = ids if self_join else other_ids
    dist = 1.0 - q @ o.T
    sure, unsure = set(), set()
    for i in range(len(ids)):
        for j in range(len(oid)):
            if (self_join and j <= i) or (not self_join and ids[i] == oid[j]):
                continue
            if abs(dist[i, j] - d) < margin:
                unsure.add((ids[i], oid[j]))
            elif dist[i, j] <= d:
                sure.add((ids[i], oid[j]))
    return sure, unsure


def _corpus(n: int, seed: int = 0, eval_every: int = 10):
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, DIM)).astype(np.float32)
    # Plant near-duplicates so that small thresholds have something to find.
    vecs[1::7] = vecs[0::7][: len(vecs[1::7])] + 0.02 * rng.standard_normal((len(vecs[1::7]), DIM))
    ids = [f"clip{i:05d}" for i in range(n)]
    assets = [f"asset{i // 3:05d}" for i in range(n)]
    splits = ["eval" if i % eval_every == 0 else "train" for i in range(n)]
    return ids, assets, splits, vecs


@pytest.fixture
def index(tmp_path: Path) -> EmbeddingIndex:
    return EmbeddingIndex(tmp_path / "lance", "siglip/so400m-v1")


def test_add_is_idempotent_on_clip_id(index: EmbeddingIndex) -> None:
    ids, assets, splits, vecs = _corpus(50)
    assert index.count() == 0 and index.dim is None
    assert index.add(ids, assets, splits, vecs) == emb.AddResult(inserted=50, duplicates=0)
    # Re-adding existing ids (even with other vectors) and repeating an id inside one
    # batch are duplicates, never second rows.
    again = index.add([*ids[:10], "fresh", "fresh"], ["a"] * 12, ["train"] * 12, vecs[:12] * 3)
    assert again == emb.AddResult(inserted=1, duplicates=11)
    assert index.count() == 51
    assert index.count("eval") == 5
    assert index.count("train") == 46
    assert index.dim == DIM
    # The original vector survives a re-add.
    _, stored = index.vectors(["clip00003"])
    np.testing.assert_allclose(stored[0], _unit(vecs[3:4])[0], atol=1e-6)


def test_vectors_are_normalised_and_returned_in_order(index: EmbeddingIndex) -> None:
    ids, assets, splits, vecs = _corpus(30)
    index.add(ids, assets, splits, vecs * 7.5)
    found, mat = index.vectors(["clip00029", "missing", "clip00002", "clip00029"])
    assert found == ["clip00029", "clip00002"]
    assert mat.dtype == np.float32 and mat.shape == (2, DIM)
    np.testing.assert_allclose(np.linalg.norm(mat, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(mat, _unit(vecs[[29, 2]]), atol=1e-6)


def test_vectors_large_id_sets_use_a_scan(index: EmbeddingIndex, monkeypatch) -> None:
    ids, assets, splits, vecs = _corpus(40)
    index.add(ids, assets, splits, vecs)
    monkeypatch.setattr(emb, "_IN_FILTER_MAX", 4)
    wanted = [*ids[::-1][:25], "nope"]
    found, mat = index.vectors(wanted)
    assert found == ids[::-1][:25]
    np.testing.assert_allclose(mat, _unit(vecs[::-1][:25]), atol=1e-6)


def test_quotes_in_ids_are_data_not_sql(index: EmbeddingIndex) -> None:
    hostile = ["it's", "x') OR ('1'='1", "plain"]
    vecs = np.eye(3, DIM, dtype=np.float32)
    index.add(hostile, ["a", "b", "c"], ["train"] * 3, vecs)
    found, _ = index.vectors(["x') OR ('1'='1"])
    assert found == ["x') OR ('1'='1"]
    found, _ = index.vectors(["it's", "plain"])
    assert found == ["it's", "plain"]


def test_dimension_is_fixed_per_table(index: EmbeddingIndex) -> None:
    ids, assets, splits, vecs = _corpus(10)
    index.add(ids, assets, splits, vecs)
    with pytest.raises(InvalidBatch) as err:
        index.add(["other"], ["a"], ["train"], np.ones((1, DIM + 1), np.float32))
    assert err.value.field == "vector"
    assert index.count() == 10
    with pytest.raises(InvalidInput):
        index.nearest(np.ones(DIM + 1), 3)


@pytest.mark.parametrize(
    ("mutate", "field", "row"),
    [
        (lambda b: b.__setitem__(2, ["train", "train", "holdout"]), "split", 2),
        (lambda b: b[3].__setitem__(1, np.zeros(DIM)), "vector", 1),
        (lambda b: b[3].__setitem__((2, 0), np.nan), "vector", 2),
        (lambda b: b.__setitem__(0, ["a", "", "c"]), "clip_id", 1),
        (lambda b: b.__setitem__(1, ["a", "b", None]), "asset_id", 2),
        (lambda b: b.__setitem__(3, b[3][:2]), "vector", 0),
        (lambda b: b.__setitem__(3, np.ones((3, DIM), np.int64)), "vector", 0),
    ],
)
def test_bad_batches_are_rejected_whole(index: EmbeddingIndex, mutate, field, row) -> None:
    batch = [["a", "b", "c"], ["x", "y", "z"], ["train"] * 3, np.ones((3, DIM), np.float32)]
    batch[3] = batch[3].copy()
    mutate(batch)
    with pytest.raises(InvalidBatch) as err:
        index.add(*batch)
    assert (err.value.field, err.value.row) == (field, row)
    assert index.count() == 0


def test_nearest_matches_brute_force(index: EmbeddingIndex) -> None:
    ids, assets, splits, vecs = _corpus(120, seed=3)
    index.add(ids, assets, splits, vecs)
    unit = _unit(vecs)
    query = np.random.default_rng(9).standard_normal(DIM)
    dist = 1.0 - unit @ (query / np.linalg.norm(query))
    got = index.nearest(query, 5)
    assert got.column_names == ["clip_id", "asset_id", "split", "distance"]
    expect = [ids[i] for i in np.argsort(dist, kind="stable")[:5]]
    assert got["clip_id"].to_pylist() == expect
    np.testing.assert_allclose(got["distance"].to_numpy(), np.sort(dist)[:5], atol=1e-5)
    evals = index.nearest(query, 4, split="eval")
    eval_idx = [i for i in range(120) if splits[i] == "eval"]
    expect_eval = [ids[i] for i in sorted(eval_idx, key=lambda i: dist[i])[:4]]
    assert evals["clip_id"].to_pylist() == expect_eval
    assert set(evals["split"].to_pylist()) == {"eval"}
    # A stored vector is its own nearest neighbour at distance ~0 (never negative).
    self_hit = index.nearest(vecs[17], 1)
    assert self_hit["clip_id"].to_pylist() == [ids[17]]
    assert 0.0 <= self_hit["distance"][0].as_py() < 1e-5


def test_pairs_within_among_ids_is_exact(index: EmbeddingIndex) -> None:
    ids, assets, splits, vecs = _corpus(150, seed=1)
    index.add(ids, assets, splits, vecs)
    subset = ids[:100]
    d = 0.05
    got = index.pairs_within([*subset, "not-there"], d)
    pairs = set(zip(got["clip_id"].to_pylist(), got["other_id"].to_pylist(), strict=True))
    sure, unsure = _brute_pairs(subset, vecs[:100], d)
    assert sure, "the corpus plants near-duplicates"
    assert sure <= pairs <= sure | unsure
    assert all(0.0 <= x <= d for x in got["distance"].to_pylist())
    # Each unordered pair once, never a clip with itself.
    assert len(pairs) == got.num_rows
    assert not any((b, a) in pairs for a, b in pairs)
    assert not any(a == b for a, b in pairs)


def test_pairs_within_against_eval_decontaminates(index: EmbeddingIndex) -> None:
    ids, assets, splits, vecs = _corpus(140, seed=2, eval_every=7)
    index.add(ids, assets, splits, vecs)
    train = [c for c, s in zip(ids, splits, strict=True) if s == "train"]
    evals = [c for c, s in zip(ids, splits, strict=True) if s == "eval"]
    pos = {c: i for i, c in enumerate(ids)}
    d = 0.3
    got = index.pairs_within(train, d, against_split="eval")
    pairs = set(zip(got["clip_id"].to_pylist(), got["other_id"].to_pylist(), strict=True))
    sure, unsure = _brute_pairs(
        train, vecs[[pos[c] for c in train]], d, evals, vecs[[pos[c] for c in evals]]
    )
    assert sure and sure <= pairs <= sure | unsure
    assert {b for _, b in pairs} <= set(evals)
    # An eval id in the query set never pairs with itself.
    mixed = index.pairs_within(evals[:3], 2.0, against_split="eval")
    assert mixed.num_rows == 3 * (len(evals) - 1)
    assert not any(
        a == b
        for a, b in zip(mixed["clip_id"].to_pylist(), mixed["other_id"].to_pylist(), strict=True)
    )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 40),
    m=st.integers(0, 30),
    block=st.integers(1, 17),
    d=st.floats(0.0, 2.0),
    seed=st.integers(0, 2**16),
    self_join=st.booleans(),
)
def test_blocked_product_equals_brute_force(n, m, block, d, seed, self_join) -> None:
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, 4))
    vecs[n // 2 :] = vecs[: n - n // 2] + 0.05 * rng.standard_normal((n - n // 2, 4))
    ids = [f"q{i}" for i in range(n)]
    if self_join:
        got = pairs_within_vectors(ids, vecs, d, block=block)
        sure, unsure = _brute_pairs(ids, vecs, d)
    else:
        other = rng.standard_normal((m, 4))
        oids = [f"q{i}" if i % 5 == 0 else f"o{i}" for i in range(m)]  # some shared ids
        got = pairs_within_vectors(ids, vecs, d, other_ids=oids, other_vectors=other, block=block)
        sure, unsure = _brute_pairs(ids, vecs, d, oids, other)
    pairs = list(zip(got["clip_id"].to_pylist(), got["other_id"].to_pylist(), strict=True))
    assert len(pairs) == len(set(pairs))
    assert sure <= set(pairs) <= sure | unsure
    # Deterministic order: by query position, then by other position.
    key = {c: i for i, c in enumerate(ids)}
    assert [key[a] for a, _ in pairs] == sorted(key[a] for a, _ in pairs)


def test_pairs_within_rejects_bad_input() -> None:
    with pytest.raises(InvalidInput):
        pairs_within_vectors(["a"], np.ones((1, 3)), 2.5)
    with pytest.raises(InvalidInput):
        pairs_within_vectors(["a", "b"], np.ones((3, 3)), 0.1)
    with pytest.raises(InvalidInput):
        pairs_within_vectors(
            ["a"], np.ones((1, 3)), 0.1, other_ids=["b"], other_vectors=np.ones((1, 4))
        )
    assert pairs_within_vectors([], np.zeros((0, 3)), 0.1).num_rows == 0


def test_index_is_lazy_and_picklable(tmp_path: Path) -> None:
    root = tmp_path / "lance"
    index = EmbeddingIndex(root, "m1")
    assert not root.exists()  # nothing touched until first use
    ids, assets, splits, vecs = _corpus(20)
    index.add(ids, assets, splits, vecs)
    clone = pickle.loads(pickle.dumps(index))
    assert clone._db is None and clone._table is None
    assert clone.count() == 20
    assert clone.vectors(["clip00004"])[0] == ["clip00004"]
    # A second handle sees the first one's later writes (no stale snapshot).
    index.add(["late"], ["a"], ["train"], vecs[:1])
    assert clone.count() == 21


def test_one_table_per_model_version(tmp_path: Path) -> None:
    assert table_name_for("a/b") != table_name_for("a_b")
    assert table_name_for("m1") == table_name_for("m1")
    with pytest.raises(InvalidInput):
        table_name_for("  ")
    a = EmbeddingIndex(tmp_path, "model-a v1")
    b = EmbeddingIndex(tmp_path, "model-b v1")
    a.add(["c1"], ["a1"], ["train"], np.ones((1, 8), np.float32))
    b.add(["c1", "c2"], ["a1", "a2"], ["train", "eval"], np.ones((2, 3), np.float32))
    assert (a.count(), a.dim, b.count(), b.dim) == (1, 8, 2, 3)
    with pytest.raises(InvalidInput):
        a.count("holdout")


# -- versions: what a pin records and a cut reads ----------------------------------------
def test_a_pinned_index_reads_exactly_its_version(tmp_path: Path) -> None:
    from catalog.embeddings import current_versions, list_models
    from catalog.errors import NotFound

    rng = np.random.default_rng(3)
    index = EmbeddingIndex(tmp_path, "clipemb-dec")
    assert index.version is None and current_versions(tmp_path, ["clipemb-dec"]) == {
        "clipemb-dec": None
    }
    index.add(["a", "b"], ["A", "B"], ["train", "eval"], rng.standard_normal((2, DIM)))
    v1 = index.version
    assert v1 is not None and current_versions(tmp_path, ["clipemb-dec"]) == {"clipemb-dec": v1}
    index.add(["c"], ["C"], ["eval"], rng.standard_normal((1, DIM)))
    assert index.version is not None and index.version > v1

    pinned = index.at(v1)
    assert pinned.version == v1 and pinned.count() == 2 and index.count() == 3
    assert pinned.clip_ids("eval").to_pylist() == ["b"]
    assert sorted(index.clip_ids().to_pylist()) == ["a", "b", "c"]
    assert pinned.vectors(["a", "b", "c"])[0] == ["a", "b"]
    assert set(pinned.pairs_within(["a"], 2.0, against_split="eval")["other_id"].to_pylist()) == {
        "b"
    }
    again = pickle.loads(pickle.dumps(pinned))
    assert again.pinned_version == v1 and again.count() == 2
    with pytest.raises(InvalidInput, match="pinned"):
        pinned.add(["d"], ["D"], ["train"], rng.standard_normal((1, DIM)))
    with pytest.raises(NotFound, match="no LanceDB version 999"):
        index.at(999).count()
    with pytest.raises(NotFound, match="no LanceDB table"):
        EmbeddingIndex(tmp_path, "clipemb-dek", version=1).count()
    with pytest.raises(InvalidInput):
        EmbeddingIndex(tmp_path, "clipemb-dec", version=0)
    assert list_models(tmp_path) == ["clipemb-dec"]
    EmbeddingIndex(tmp_path, "a/b model").add(["z"], ["Z"], ["train"], np.ones((1, DIM)))
    assert list_models(tmp_path) == ["a/b model", "clipemb-dec"]
