"""Stable semantic dedup: centroids fitted once per (model, dedup config), versioned,
pinned; a clip's cluster depends only on its vector.

The reported bug (a clip kept in v3 and dropped in v6 with no change to it or its
neighbour) is :func:`test_unrelated_clips_elsewhere_do_not_change_an_untouched_decision`:
before the centroids were fitted once, each cut re-ran k-means over its own candidates,
so adding clips anywhere moved clusters and flipped decisions of untouched clips.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.embeddings import EmbeddingIndex
from catalog.errors import Conflict, IntegrityError, InvalidRecipe, NotFound
from catalog.objects.local import LocalObjectStore
from catalog.pins import Pin
from materializer.centroids import (
    CentroidConfig,
    CentroidStore,
    assign_clusters,
    fit_centroids,
)
from materializer.cut import build_artifacts
from materializer.dedup import semdedup_vectors
from materializer.recipe import Recipe, load_recipe
from materializer.select import select
from materializer.validate import check_recipe, resolve_pin
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo

MODEL = "siglip-demo-v1"
PAIRS = "pairs-v1"


# -- pure functions ----------------------------------------------------------------------
def test_a_rows_cluster_does_not_depend_on_the_other_rows() -> None:
    rng = np.random.default_rng(1)
    centroids = fit_centroids(rng.standard_normal((400, 16)), 12, seed=0)
    vectors = rng.standard_normal((3000, 16)).astype(np.float32)
    # Rows between two centroids (a tie up to rounding): decided again in float64,
    # the same way wherever the row is.
    vectors[:5] = centroids[3] + centroids[7]
    full = assign_clusters(vectors, centroids)
    assert len(set(full[:5].tolist())) == 1 and full[0] in (3, 7)
    for _ in range(3):
        perm = rng.permutation(len(vectors))
        parts = np.array_split(perm, rng.integers(2, 40))
        again = np.empty_like(full)
        for part in parts:
            again[part] = assign_clusters(vectors[part], centroids)
        assert np.array_equal(again, full)
    single = np.array([assign_clusters(vectors[i : i + 1], centroids)[0] for i in range(50)])
    assert np.array_equal(single, full[:50])


def test_clusters_that_gain_no_member_keep_every_decision() -> None:
    rng = np.random.default_rng(2)
    anchors = rng.standard_normal((20, 8))
    base = np.repeat(anchors, 4, axis=0) + 0.01 * rng.standard_normal((80, 8))
    centroids = fit_centroids(base, 6, seed=0)
    ids = [f"c{i:03d}" for i in range(80)]
    scores = rng.random(80)
    before = semdedup_vectors(ids, base, scores, eps=0.03, centroids=centroids)
    assert 0 < before.sum() < 80
    # New clips in one cluster only (around its centroid, none a duplicate of another).
    extra = centroids[0] + 0.15 * rng.standard_normal((300, 8))
    both = np.vstack([base, extra])
    after = semdedup_vectors(
        [*ids, *(f"n{i:03d}" for i in range(300))],
        both,
        np.concatenate([scores, rng.random(300)]),
        eps=0.03,
        centroids=centroids,
    )
    labels = assign_clusters(both, centroids)
    assert set(labels[80:].tolist()) == {0}
    untouched = ~np.isin(labels[:80], labels[80:])
    assert untouched.sum() >= 40
    assert np.array_equal(after[:80][untouched], before[untouched])


# -- the centroid store ------------------------------------------------------------------
@pytest.fixture
def index(tmp_path: Path) -> EmbeddingIndex:
    rng = np.random.default_rng(3)
    idx = EmbeddingIndex(tmp_path / "lance", "m")
    n = 120
    idx.add(
        [f"c{i:03d}" for i in range(n)],
        ["a"] * n,
        ["train"] * (n - 4) + ["eval"] * 4,
        rng.standard_normal((n, 8)),
    )
    return idx


def test_centroids_are_fitted_once_reused_and_refitted_only_on_request(
    tmp_path: Path, index: EmbeddingIndex
) -> None:
    store = CentroidStore(LocalObjectStore(tmp_path / "objects"))
    config = CentroidConfig(MODEL, cluster_size=30)
    assert store.latest(config) is None
    first = store.ensure(config, index)
    assert first.version == 1 and first.centroids.shape == (4, 8)  # ceil(116 / 30)
    assert first.record["fitted_on"]["train_vectors"] == 116  # eval vectors left out
    rng = np.random.default_rng(4)
    index.add(["z1", "z2"], ["b", "b"], ["train", "train"], rng.standard_normal((2, 8)))
    assert store.ensure(config, index).sha256 == first.sha256  # reused, not refitted
    again = store.fit(config, index.at(first.record["fitted_on"]["lance_version"]))
    assert again.version == 2 and again.sha256 == first.sha256  # same inputs, same bytes
    assert store.versions(config) == [1, 2] and store.latest(config).version == 2  # type: ignore[union-attr]
    other = CentroidConfig(MODEL, num_clusters=3)
    assert store.versions(other) == [] and other.prefix != config.prefix
    with pytest.raises(Conflict, match="fitted first"):
        store.fit(config, index, expect_version=1)
    with pytest.raises(NotFound, match=r"fitted: \[1, 2\]"):
        store.get(config, 9)


def test_a_tampered_centroid_matrix_is_refused(tmp_path: Path, index: EmbeddingIndex) -> None:
    objects = tmp_path / "objects"
    store = CentroidStore(LocalObjectStore(objects))
    config = CentroidConfig(MODEL, num_clusters=2)
    fitted = store.ensure(config, index)
    path = objects / fitted.record["centroids_key"]
    buf = io.BytesIO()
    np.save(buf, fitted.centroids * 0.5)
    path.chmod(0o644)
    path.write_bytes(buf.getvalue())
    with pytest.raises(IntegrityError):
        store.get(config, 1)


def test_pins_carry_centroid_versions() -> None:
    pin = Pin({}, {MODEL: 3}, {MODEL: 2})
    assert pin.to_dict()[f"centroids/{MODEL}"] == 2
    assert Pin.from_dict(pin.to_dict()) == pin and pin != Pin({}, {MODEL: 3})
    assert pin.with_centroids({MODEL: 5}).centroids == {MODEL: 5}


# -- through selection and the cut -------------------------------------------------------
@pytest.fixture
def lake(tmp_path: Path) -> VidlakeCatalog:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake", eval_salt="07" * 16))
    generate_corpus(catalog, assets=60, seed=5, embedding_model=MODEL)
    return catalog


def _recipe(**dedup: Any) -> Recipe:
    data = small_corpus_demo()
    data["semantic_dedup"] = {**data["semantic_dedup"], "cluster_size": 20, **dedup}
    return load_recipe(data)


def _paired_vectors(catalog: VidlakeCatalog, seed: int, known: set[str]) -> set[str]:
    """Vectors of model PAIRS for the clips not in ``known``: consecutive clips (by id)
    form pairs 0.02 apart (cosine distance, inside the recipe's eps 0.03), pairs lie far
    apart. With many small clusters, k-means boundaries cut through some pairs."""
    clips = catalog.scan("clips", columns=["clip_id", "asset_id", "split"], include_eval=True)
    rows = [r for r in clips.to_pylist() if r["clip_id"] not in known]
    rows.sort(key=lambda r: r["clip_id"])
    rng = np.random.default_rng(seed)
    anchors = rng.standard_normal(((len(rows) + 1) // 2, 16))
    anchors /= np.linalg.norm(anchors, axis=1, keepdims=True)
    side = rng.standard_normal(anchors.shape)
    side -= (side * anchors).sum(1, keepdims=True) * anchors
    side /= np.linalg.norm(side, axis=1, keepdims=True)
    theta = np.arccos(1 - 0.02)
    partner = np.cos(theta) * anchors + np.sin(theta) * side
    vectors = np.stack([anchors, partner], axis=1).reshape(-1, 16)[: len(rows)]
    catalog.embeddings(PAIRS).add(
        [r["clip_id"] for r in rows],
        [r["asset_id"] for r in rows],
        [r["split"] for r in rows],
        vectors,
    )
    return {r["clip_id"] for r in rows}


@pytest.mark.slow  # two corpora, two selections and a cut: ~10 s here
def test_unrelated_clips_elsewhere_do_not_change_an_untouched_decision(
    lake: VidlakeCatalog, tmp_path: Path
) -> None:
    catalog = lake
    old = _paired_vectors(catalog, 1, set())
    recipe = _recipe(embedding_model=PAIRS, cluster_size=2)
    pin1 = resolve_pin(catalog, recipe)
    assert pin1.centroids == {PAIRS: 1}
    first = select(catalog, recipe, pin1)
    assert first.drops.get("semantic_dedup", 0) > 10
    kept1 = set(first.samples["clip_id"].to_pylist())

    generate_corpus(catalog, assets=60, seed=6, embedding_model=MODEL)  # clips elsewhere
    _paired_vectors(catalog, 2, old)
    pin2 = resolve_pin(catalog, recipe)
    assert pin2.embeddings[PAIRS] != pin1.embeddings[PAIRS]
    assert pin2.centroids == pin1.centroids  # no silent refit
    second = select(catalog, recipe, pin2)
    kept2 = set(second.samples["clip_id"].to_pylist())
    assert len(kept2) > len(kept1)
    # Refitting per cut flipped both ways here: kept then dropped, dropped then kept.
    assert kept1 - kept2 == set() and (kept2 & old) - kept1 == set()

    # The cut records the centroids: in the pin and as the record in snapshot.json.
    (tmp_path / "cut").mkdir()
    _, snapshot = build_artifacts(catalog, recipe, tmp_path / "cut", pin=pin2)
    assert snapshot["catalog_snapshot_ids"][f"centroids/{PAIRS}"] == 1
    facts = snapshot["semantic_dedup"]
    assert first.centroids is not None
    assert facts["centroids_version"] == 1 and facts["centroids_sha256"] == first.centroids.sha256
    assert facts["fitted_on"]["lance_version"] == pin1.embeddings[PAIRS]


def test_an_explicit_pin_names_an_existing_centroid_version(lake: VidlakeCatalog) -> None:
    recipe = _recipe(cluster_size=25)
    pin = resolve_pin(lake, recipe, fit=False)
    assert MODEL not in pin.centroids  # a check never fits
    fitted = resolve_pin(lake, recipe).to_dict()
    data = small_corpus_demo()
    data["semantic_dedup"] = {**data["semantic_dedup"], "cluster_size": 25}
    data["catalog_pin"] = {**fitted, f"centroids/{MODEL}": 7}
    with pytest.raises(InvalidRecipe) as err:
        check_recipe(lake, load_recipe(data), streams=False)
    assert err.value.details["path"] == f"catalog_pin.centroids/{MODEL}"
    data["catalog_pin"] = {**fitted, "centroids/other-model": 1}
    with pytest.raises(InvalidRecipe, match="does not use"):
        load_recipe(data)
    # An explicit refit is a new version, which later cuts at latest read.
    config = CentroidConfig(MODEL, cluster_size=25)
    CentroidStore(lake.objects).fit(config, lake.embeddings(MODEL))
    assert resolve_pin(lake, recipe).centroids == {MODEL: 2}
    assert fitted[f"centroids/{MODEL}"] == 1
