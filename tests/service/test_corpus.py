"""The synthetic corpus generator: consistent counts, determinism, designed structure,
latents that decode to the documented shapes, packed members, and the demo recipe."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from safetensors.torch import load as st_load

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.embeddings import EmbeddingIndex
from catalog.errors import Conflict, InvalidInput
from catalog.hashing import sha256_bytes
from materializer.recipe import load_recipe
from service.demo.corpus import STAGES, CorpusSummary, generate_corpus, tombstone_asset
from service.demo.latents import latent_shape, latent_tokens

ASSETS = 60
SEED = 3
EMBEDDING_MODEL = "siglip-demo-v1"
TOKENIZER = "vae-8x8x4-c16-v1"
DEMO_RECIPE = Path(__file__).parents[2] / "docs" / "recipes" / "demo.yaml"


def _open(root: Path, salt: str) -> VidlakeCatalog:
    return VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt=salt))


@pytest.fixture(scope="module")
def corpus(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[VidlakeCatalog, CorpusSummary, list[tuple[str, int, int]]]:
    catalog = _open(tmp_path_factory.mktemp("corpus"), "11" * 32)
    events: list[tuple[str, int, int]] = []
    summary = generate_corpus(
        catalog, assets=ASSETS, seed=SEED, progress=lambda *e: events.append(e)
    )
    return catalog, summary, events


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[VidlakeCatalog, CorpusSummary]:
    catalog = _open(tmp_path_factory.mktemp("packed"), "22" * 32)
    summary = generate_corpus(
        catalog, assets=30, seed=SEED, latents="packed", pack_bytes=1 << 20, text_embeddings=0.0
    )
    return catalog, summary


def _scan(catalog: VidlakeCatalog, table: str, columns: list[str] | None = None) -> pa.Table:
    return catalog.scan(table, columns=columns, include_eval=True)


def _index(catalog: VidlakeCatalog) -> EmbeddingIndex:
    return catalog.embeddings(EMBEDDING_MODEL)


def _mapping(catalog: VidlakeCatalog, table: str, key: str, value: str) -> dict[Any, Any]:
    t = _scan(catalog, table, [key, value])
    return dict(zip(t[key].to_pylist(), t[value].to_pylist(), strict=True))


def _distance(index: EmbeddingIndex, a: str, b: str) -> float:
    _, vectors = index.vectors([a, b])
    return float(1.0 - vectors[0] @ vectors[1])


# -- counts and shapes of the tables ---------------------------------------------------
def test_counts_are_consistent(corpus: Any) -> None:
    catalog, s, _ = corpus
    assets = _scan(catalog, "assets")
    clips = _scan(catalog, "clips")
    latents = _scan(catalog, "latents")
    assert assets.num_rows == s.assets == ASSETS == sum(s.tiers.values())
    assert all(s.tiers[t] > 0 for t in ("licensed", "crawl", "synthetic"))
    assert clips.num_rows == s.clips == s.embeddings == _index(catalog).count()
    assert latents.num_rows == s.latents and _scan(catalog, "scores").num_rows == s.scores
    assert _scan(catalog, "captions").num_rows == s.captions == 4 * s.clips
    assert s.held_out_assets <= s.eval_assets
    assert s.eval_assets == pc.sum(pc.equal(assets["split"], "eval")).as_py()

    per_asset = Counter(clips["asset_id"].to_pylist())
    assert set(per_asset) == set(assets["asset_id"].to_pylist())
    assert set(per_asset.values()) <= {1, 2, 3, 4} and per_asset[s.many_clips_asset_id] == 4

    # Clips: 4k+1 frames in 17..65, the asset's resolution, inside the asset, no overlap.
    probe = {r["asset_id"]: r for r in assets.to_pylist()}
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for c in clips.to_pylist():
        a = probe[c["asset_id"]]
        assert 17 <= c["num_frames"] <= 65 and (c["num_frames"] - 1) % 4 == 0
        assert (c["width"], c["height"], c["fps"]) == (
            a["probe_width"],
            a["probe_height"],
            a["probe_fps"],
        )
        assert c["t_end_s"] - c["t_start_s"] == pytest.approx(c["num_frames"] / c["fps"])
        assert c["t_start_s"] >= 0 and c["t_end_s"] <= a["probe_duration_s"] + 1e-9
        assert set(json.loads(c["metadata"])) >= {"scene", "subject", "camera"}
        spans[c["asset_id"]].append((c["t_start_s"], c["t_end_s"]))
    for cuts in spans.values():
        cuts.sort()
        assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(cuts))
    for a in assets.to_pylist():
        doc = json.loads(a["provenance"])
        assert {"origin_url", "fetched_at", "license"} <= set(doc)
        assert doc["license"]["id"] == a["license_id"]
        assert a["probe_width"] / a["probe_height"] in (16 / 9, 4 / 3, 1.0, 9 / 16)
        assert a["probe_fps"] in (24.0, 30.0) and a["probe_bitrate"] > 0


def test_latents_rungs_and_scores(corpus: Any) -> None:
    catalog, s, _ = corpus
    assert s.rungs == ("128p", "256p")
    latents = _scan(catalog, "latents")
    clip_ids = set(_scan(catalog, "clips", ["clip_id"])["clip_id"].to_pylist())
    by_rung = defaultdict(set)
    for row in latents.select(["clip_id", "rung", "tokenizer_version"]).to_pylist():
        assert row["tokenizer_version"] == TOKENIZER
        by_rung[row["rung"]].add(row["clip_id"])
    assert by_rung["128p"] == clip_ids  # the lowest rung for every clip
    # Version resolution: without versions, "latest" is v2 (v1 was computed long ago).
    latest = catalog.latest_scores(include_eval=True)
    aesthetic = latest.filter(pc.equal(latest["filter_name"], "aesthetic"))
    assert set(aesthetic["filter_version"].to_pylist()) == {"2"}
    assert len(aesthetic) == len(clip_ids)
    high = {r["clip_id"] for r in aesthetic.to_pylist() if r["score"] >= 6.5}
    assert by_rung["256p"] == high and 0 < len(high) < len(clip_ids)
    old = catalog.latest_scores(versions={"aesthetic": "1"}, include_eval=True)
    old = old.filter(pc.equal(old["filter_name"], "aesthetic"))
    assert set(old["filter_version"].to_pylist()) == {"1"} and 0 < len(old) < len(clip_ids)
    assert (
        old["score"].to_pylist()
        != aesthetic.filter(pc.is_in(aesthetic["clip_id"], old["clip_id"]))["score"].to_pylist()
    )
    for name, low, top in (("motion", 0, 1), ("ocr", 0, 1), ("aesthetic", 0, 10)):
        scores = latest.filter(pc.equal(latest["filter_name"], name))["score"].to_numpy()
        assert len(scores) == len(clip_ids) and scores.min() >= low and scores.max() <= top
    # Licensed footage scores better than crawl, on average.
    tier = _mapping(catalog, "assets", "asset_id", "source_tier")
    owner = _mapping(catalog, "clips", "clip_id", "asset_id")
    mean = defaultdict(list)
    for r in aesthetic.to_pylist():
        mean[tier[owner[r["clip_id"]]]].append(r["score"])
    assert np.mean(mean["licensed"]) > np.mean(mean["crawl"])


def test_captions_jobs_and_text_embeddings(corpus: Any) -> None:
    catalog, s, _ = corpus
    captions = _scan(catalog, "captions")
    versions, kinds = captions["caption_version"].to_pylist(), captions["kind"].to_pylist()
    keys = Counter(zip(versions, kinds, strict=True))
    assert set(keys) == {("2", "dense"), ("2", "short"), ("3", "dense"), ("3", "short")}
    assert set(keys.values()) == {s.clips}
    latest = catalog.latest_captions(include_eval=True)
    assert set(latest["caption_version"].to_pylist()) == {"3"}
    embs = [e for e in captions["text_embedding_sha256"].to_pylist() if e is not None]
    assert len(embs) == s.text_embeddings > 0
    blob = catalog.objects.get(embs[0])
    assert tuple(st_load(blob)["text_embedding"].shape) == (16, 64)

    jobs = _scan(catalog, "jobs")
    latest_status = {r["stage"]: r["status"] for r in jobs.sort_by("ingested_at").to_pylist()}
    assert latest_status == dict.fromkeys(s.jobs, "succeeded")
    assert set(s.jobs) == {"decode", "split", "filter", "caption", "encode"}
    for table, stage in (("clips", "split"), ("latents", "encode"), ("scores", "filter")):
        assert set(_scan(catalog, table, ["job_id"])["job_id"].to_pylist()) == {s.jobs[stage]}
    assert set(captions["job_id"].to_pylist()) == {s.jobs["caption"]}


def test_progress_reaches_every_total(corpus: Any) -> None:
    _, s, events = corpus
    by_stage = defaultdict(list)
    for stage, done, total in events:
        by_stage[stage].append((done, total))
    assert set(by_stage) == set(STAGES)
    expect = {
        "assets": s.assets,
        "clips": s.clips,
        "latents": s.latents,
        "scores": s.scores,
        "captions": s.captions,
        "embeddings": s.embeddings,
    }
    for stage, seen in by_stage.items():
        dones = [d for d, _ in seen]
        assert seen[0] == (0, expect[stage]) and seen[-1] == (expect[stage], expect[stage])
        assert dones == sorted(dones) and {t for _, t in seen} == {expect[stage]}


# -- designed structure ---------------------------------------------------------------------
def test_near_duplicate_pair_is_linked(corpus: Any) -> None:
    catalog, s, _ = corpus
    copy, original = s.near_duplicate_pair
    assert s.linked_near_duplicates == s.near_duplicate_pairs >= 2
    assets = {r["asset_id"]: r for r in _scan(catalog, "assets").to_pylist()}
    assert assets[copy]["duplicate_of"] == original and assets[original]["duplicate_of"] is None
    assert assets[copy]["probe_bitrate"] < assets[original]["probe_bitrate"]
    status = catalog.asset_status(include_eval=True)
    linked = status.filter(pc.is_valid(status["duplicate_of"]))
    assert linked.num_rows == s.near_duplicate_pairs
    assert pc.any(status["near_dup_of_eval"]).as_py()  # one re-upload copies a held-out asset
    # Same cuts, and clip embeddings right next to the original's.
    clips = _scan(catalog, "clips", ["clip_id", "asset_id", "t_start_s", "t_end_s"]).to_pylist()
    cuts = {a: sorted((c["t_start_s"], c["clip_id"]) for c in clips if c["asset_id"] == a)
            for a in (copy, original)}  # fmt: skip
    assert [t for t, _ in cuts[copy]] == [t for t, _ in cuts[original]]
    index = _index(catalog)
    for (_, a), (_, b) in zip(cuts[copy], cuts[original], strict=True):
        assert _distance(index, a, b) == pytest.approx(0.004, abs=1e-3)


def test_embeddings_plant_eval_bleed_and_clusters(corpus: Any) -> None:
    catalog, s, _ = corpus
    index = _index(catalog)
    assert index.dim == 64
    train, held = s.eval_bleed_clip
    assert _distance(index, train, held) == pytest.approx(0.01, abs=1e-3)
    hits = index.pairs_within([train], 0.05, against_split="eval")
    assert held in hits["other_id"].to_pylist()
    assets = {r["asset_id"]: r["split"] for r in _scan(catalog, "assets").to_pylist()}
    assert assets[s.eval_asset_id] == "eval"
    anchor, *members = s.semantic_cluster
    assert members and all(0.002 < _distance(index, anchor, m) < 0.013 for m in members)
    # Nothing else is that close: ordinary clips of one asset sit ~0.4 apart.
    clips = _scan(catalog, "clips", ["clip_id", "asset_id"])
    ids = clips["clip_id"].to_pylist()
    close = index.pairs_within(ids, 0.05)
    planted = 3 * s.near_duplicate_pairs + 1 + 3 * (ASSETS // 100 + 1)
    assert len(close) <= planted + 4
    owner = dict(zip(ids, clips["asset_id"].to_pylist(), strict=True))
    planted_ids = {*s.semantic_cluster, *s.eval_bleed_clip}
    same_asset = [
        (a, b)
        for a, b in itertools.pairwise(ids)
        if owner[a] == owner[b] and not {a, b} & planted_ids
    ]
    assert same_asset
    assert all(0.2 < _distance(index, a, b) < 0.6 for a, b in same_asset)


# -- latents -------------------------------------------------------------------------------------
def test_latents_decode_to_documented_shapes(corpus: Any) -> None:
    catalog, s, _ = corpus
    store = catalog.objects
    clips = {r["clip_id"]: r for r in _scan(catalog, "clips").to_pylist()}
    rows = _scan(catalog, "latents").to_pylist()
    assert len({r["object_sha256"] for r in rows}) == s.latent_objects == len(rows)
    total = 0
    for r in rows:
        clip = clips[r["clip_id"]]
        want = latent_shape(r["rung"], clip["width"], clip["height"], clip["num_frames"])
        data = store.get(r["object_sha256"])  # verified against its address
        assert r["offset"] == 0 and r["length"] == len(data) == r["object_size"]
        assert r["member_sha256"] == r["object_sha256"]
        tensor = st_load(data)["latent"]
        assert tuple(tensor.shape) == want and str(tensor.dtype) == "torch.bfloat16"
        assert r["shapes"] == [list(want)] and r["tensor_keys"] == ["latent"]
        assert r["dtypes"] == ["bfloat16"] and r["latent_frames"] == want[1]
        assert r["tokens"] == latent_tokens(want) and r["format"] == "safetensors"
        total += len(data)
    assert total == s.latent_bytes


def test_latent_arithmetic() -> None:
    assert latent_shape("128p", 1920, 1080, 65) == (16, 17, 16, 28)
    assert latent_shape("256p", 1080, 1920, 17) == (16, 5, 32, 18)
    assert latent_shape("128p", 640, 480, 33) == (16, 9, 16, 21)
    assert latent_shape("256p", 720, 720, 20) == (16, 5, 32, 32)
    assert latent_shape("256p", 1920, 1080, 21) == (16, 6, 32, 57)  # 56.9 rounds up
    assert latent_shape("256p", 1440, 1080, 17) == (16, 5, 32, 43)
    assert latent_tokens((16, 17, 16, 28)) == 17 * 8 * 14
    assert latent_tokens((16, 9, 16, 21)) == 9 * 8 * 11  # a ragged edge is padded
    for bad in ("100p", "256", "p", "0p"):
        with pytest.raises(InvalidInput):
            latent_shape(bad, 16, 9, 17)


def test_packed_members_verify_by_range(packed: Any) -> None:
    catalog, s = packed
    store = catalog.objects
    rows = _scan(catalog, "latents").to_pylist()
    objects = {r["object_sha256"] for r in rows}
    assert 1 < len(objects) == s.latent_objects < len(rows) == s.latents
    owner = _mapping(catalog, "clips", "clip_id", "asset_id")
    homes: dict[tuple[str, str], set[str]] = defaultdict(set)
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        data = store.get_range(r["object_sha256"], r["offset"], r["length"])
        assert sha256_bytes(data) == r["member_sha256"] != r["object_sha256"]
        assert r["offset"] % 8 == 0
        assert tuple(st_load(data)["latent"].shape) == tuple(r["shapes"][0])
        assert r["object_size"] == store.head(r["object_sha256"]).size
        homes[(owner[r["clip_id"]], r["rung"])].add(r["object_sha256"])
        ranges[r["object_sha256"]].append((r["offset"], r["offset"] + r["length"]))
    assert all(len(h) == 1 for h in homes.values())  # an asset's members share one object
    for sha, spans in ranges.items():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        assert store.verify(sha).size >= spans[-1][1]


# -- determinism, bad input, re-runs -----------------------------------------------------
def _facts(catalog: VidlakeCatalog) -> dict[str, Any]:
    def rows(table: str, cols: list[str]) -> list[tuple[Any, ...]]:
        t = _scan(catalog, table, cols)
        return sorted(zip(*(t[c].to_pylist() for c in cols), strict=True))

    clip_ids = sorted(_scan(catalog, "clips", ["clip_id"])["clip_id"].to_pylist())
    found, vectors = _index(catalog).vectors(clip_ids)
    return {
        "assets": rows("assets", ["asset_id", "source", "license_id", "fingerprint", "provenance"]),
        "clips": rows("clips", ["clip_id", "asset_id", "t_start_s", "t_end_s", "num_frames"]),
        "latents": rows("latents", ["clip_id", "rung", "object_sha256", "member_sha256"]),
        "scores": rows("scores", ["clip_id", "filter_name", "filter_version", "score"]),
        "captions": rows("captions", ["clip_id", "caption_version", "kind", "text",
                                      "text_embedding_sha256"]),
        "vectors": (found, vectors.tobytes()),
    }  # fmt: skip


def test_same_seed_same_corpus_on_a_fresh_catalog(corpus: Any, tmp_path: Path) -> None:
    catalog, s, _ = corpus
    other = _open(tmp_path / "b", "33" * 32)  # another salt: only eval counts may differ
    again = generate_corpus(other, assets=ASSETS, seed=SEED)
    assert {**asdict(again), "eval_assets": 0} == {**asdict(s), "eval_assets": 0}
    assert _facts(other) == _facts(catalog)
    with pytest.raises(Conflict):  # the same corpus twice would double append-only facts
        generate_corpus(other, assets=ASSETS, seed=SEED)
    different = generate_corpus(other, assets=ASSETS, seed=SEED + 1)
    assert different.near_duplicate_pair != s.near_duplicate_pair
    assert other.scan("assets", columns=["asset_id"], include_eval=True).num_rows == 2 * ASSETS


@pytest.mark.parametrize(
    "bad",
    [
        {"assets": 5},
        {"assets": True},
        {"seed": -1},
        {"rungs": ()},
        {"rungs": "128p"},
        {"rungs": ("128p", "128p")},
        {"rungs": ("130p",)},
        {"latents": "zip"},
        {"embedding_dim": 2},
        {"pack_bytes": 0},
        {"text_embeddings": 1.5},
        {"tokenizer_version": " "},
        {"high_rung_min_aesthetic": float("nan")},
    ],
)
def test_bad_arguments_change_nothing(corpus: Any, bad: dict[str, Any]) -> None:
    catalog = corpus[0]
    before = catalog.pin()
    with pytest.raises(InvalidInput) as err:
        generate_corpus(catalog, **{"assets": ASSETS, "seed": 99, **bad})
    assert err.value.details["field"] in {*bad, "rungs"}
    assert catalog.pin() == before


def test_tombstone_helper(packed: Any) -> None:
    catalog, s = packed
    result = tombstone_asset(catalog, s.many_clips_asset_id, "rights holder request")
    assert result.inserted == 1
    status = catalog.asset_status()
    row = status.filter(pc.equal(status["asset_id"], s.many_clips_asset_id)).to_pylist()[0]
    assert row["tombstoned"] and row["tombstone_kind"] == "soft"


# -- the demo recipe -------------------------------------------------------------------------
def test_demo_recipe_fits_the_corpus(corpus: Any) -> None:
    catalog, s, _ = corpus
    recipe = load_recipe(DEMO_RECIPE)
    assert recipe.tokenizer_version == TOKENIZER
    assert [p.rung for p in recipe.phases] == list(s.rungs)
    scores = _scan(catalog, "scores", ["filter_name", "filter_version"])
    names, versions = scores["filter_name"].to_pylist(), scores["filter_version"].to_pylist()
    have = set(zip(names, versions, strict=True))
    assert set(recipe.score_versions().items()) <= have
    captions = _scan(catalog, "captions", ["caption_version", "kind"])
    kinds = {k for v, k in zip(*(c.to_pylist() for c in captions.columns), strict=True)
             if v == recipe.captions.version}  # fmt: skip
    assert set(recipe.captions.kinds) <= kinds
    models = {recipe.semantic_dedup.embedding_model if recipe.semantic_dedup else None}
    excl = recipe.exclusions.eval_near_duplicates
    models.add(excl.embedding_model if excl else None)
    assert models == {EMBEDDING_MODEL}
    assert excl is not None and excl.max_distance > 0.011  # catches the planted bleed
    assert recipe.semantic_dedup is not None and recipe.semantic_dedup.eps > 0.012
    aspects = set(_scan(catalog, "clips", ["aspect_bucket"])["aspect_bucket"].to_pylist())
    assert aspects <= set(recipe.buckets.aspect_ratios)
    frames = _scan(catalog, "latents", ["latent_frames"])["latent_frames"].to_numpy()
    assert frames.min() >= min(recipe.buckets.latent_frames)  # every latent fits a bucket
