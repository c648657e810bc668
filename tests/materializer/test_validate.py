"""Recipes checked against the catalog at their pin, and pins that cover embeddings.

Every test here failed before the check existed: a typo'd embedding model published a
cut with no decontamination or dedup, unknown versions selected nothing or published
silently, and a new embedding changed a cut whose snapshot.json showed the same pin.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidRecipe
from manifests.registry import Registry
from materializer.cut import build_artifacts, cut_snapshot
from materializer.recipe import Recipe, load_recipe
from materializer.validate import check_recipe
from service.demo.corpus import CorpusSummary, generate_corpus
from tests.fixtures.recipes import small_corpus_demo

REPO = Path(__file__).resolve().parents[2]
DEMO_RECIPE = REPO / "docs" / "recipes" / "demo.yaml"
MODEL = "clipemb-dec"
PARTIAL = "clipemb-partial"  # every clip but one eval clip (the planted bleed's)
DATA_ARTIFACTS = ("manifest.parquet", "plan.arrow", "index.arrow", "lineage.arrow")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[VidlakeCatalog, CorpusSummary]:
    root = tmp_path_factory.mktemp("validate")
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="03" * 16))
    summary = generate_corpus(catalog, assets=120, seed=4, embedding_model=MODEL)
    _copy_embeddings(catalog, MODEL, PARTIAL, leave_out={summary.eval_bleed_clip[1]})
    return catalog, summary


def _copy_embeddings(
    catalog: VidlakeCatalog, source: str, target: str, leave_out: set[str]
) -> None:
    src = catalog.embeddings(source)
    clips = catalog.scan("clips", columns=["clip_id", "asset_id", "split"], include_eval=True)
    ids = [c for c in clips["clip_id"].to_pylist() if c not in leave_out]
    found, vectors = src.vectors(ids)
    info = {r["clip_id"]: r for r in clips.to_pylist()}
    catalog.embeddings(target).add(
        found, [info[c]["asset_id"] for c in found], [info[c]["split"] for c in found], vectors
    )


def _demo(**changes: Any) -> dict[str, Any]:
    # The test corpora are far smaller than the demo's: opt in to repeats in a step.
    data: dict[str, Any] = json.loads(load_recipe(small_corpus_demo()).to_canonical_json())
    data["exclusions"]["eval_near_duplicates"]["embedding_model"] = MODEL
    data["semantic_dedup"]["embedding_model"] = MODEL
    for path, value in changes.items():
        _set(data, path, value)
    return data


def _set(data: Any, path: str, value: Any) -> None:
    *head, last = path.split(".")
    for part in head:
        data = data[int(part)] if isinstance(data, list) else data[part]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


def _refused(catalog: VidlakeCatalog, recipe: Recipe, tmp_path: Path) -> InvalidRecipe:
    """The cut refuses the recipe and registers nothing; so does check_recipe."""
    registry = Registry(catalog.objects)
    before = registry.versions()
    with pytest.raises(InvalidRecipe) as cut_exc:
        cut_snapshot(catalog, registry, recipe, workdir=tmp_path)
    assert registry.versions() == before
    with pytest.raises(InvalidRecipe) as check_exc:
        check_recipe(catalog, recipe)
    assert check_exc.value.path == cut_exc.value.path
    return cut_exc.value


def test_the_demo_recipe_passes_against_the_synthetic_corpus(
    lake: tuple[VidlakeCatalog, CorpusSummary],
) -> None:
    catalog, _ = lake
    check = check_recipe(catalog, load_recipe(_demo()))
    assert check.coverage is not None and check.coverage.coverage == 1.0
    assert check.streams is not None and all(n > 0 for n in check.streams)
    assert MODEL in check.known.embedding_models and PARTIAL in check.known.embedding_models
    # The demo itself, on the demo's own model (the corpus make demo builds).
    demo = VidlakeCatalog.open(
        CatalogConfig.embedded(Path(catalog.config.lance).parent / "demo", eval_salt="04" * 16)
    )
    generate_corpus(demo, assets=60, seed=1)
    assert check_recipe(demo, load_recipe(DEMO_RECIPE)).coverage is not None


@pytest.mark.parametrize(
    "field", ["exclusions.eval_near_duplicates.embedding_model", "semantic_dedup.embedding_model"]
)
def test_a_typod_embedding_model_is_refused_naming_the_known_ones(
    lake: tuple[VidlakeCatalog, CorpusSummary], tmp_path: Path, field: str
) -> None:
    catalog, _ = lake
    exc = _refused(catalog, load_recipe(_demo(**{field: "clipemb-dek"})), tmp_path)
    assert exc.path == field and exc.value == "clipemb-dek"
    assert MODEL in exc.known and "clipemb-dek" in exc.message and MODEL in exc.message


@pytest.mark.parametrize(
    ("changes", "path", "value", "known"),
    [
        ({"filters.1.name": "moton"}, "filters[1].name", "moton", "motion"),
        ({"filters.0.version": "9"}, "filters[0].version", "9", "2"),
        ({"captions.version": "4"}, "captions.version", "4", "3"),
        ({"captions.kinds": ["dense", "shrt"]}, "captions.kinds[1]", "shrt", "short"),
        ({"phases.1.rung": "512p"}, "phases[1].rung", "512p", "256p"),
        ({"tokenizer_version": "vae-v2"}, "tokenizer_version", "vae-v2", "vae-8x8x4-c16-v1"),
    ],
)
def test_each_unknown_value_is_refused_with_the_known_ones(
    lake: tuple[VidlakeCatalog, CorpusSummary],
    tmp_path: Path,
    changes: dict[str, Any],
    path: str,
    value: str,
    known: str,
) -> None:
    catalog, _ = lake
    exc = _refused(catalog, load_recipe(_demo(**changes)), tmp_path)
    assert (exc.path, exc.value) == (path, value)
    assert known in exc.known and repr(known) in exc.message
    assert exc.to_dict()["code"] == "invalid_recipe"


def test_a_stream_predicate_that_matches_nothing_is_refused(
    lake: tuple[VidlakeCatalog, CorpusSummary], tmp_path: Path
) -> None:
    catalog, _ = lake
    data = _demo()
    data["streams"][0]["where"] = "source_tier = 'licenced'"  # the tier is 'licensed'
    exc = _refused(catalog, load_recipe(data), tmp_path)
    assert exc.path == "streams[0].where" and "matches no train clip" in exc.message
    # A stream without weight in any phase is checked too.
    data = _demo()
    data["streams"].append({"name": "spare", "where": "territory = 'nowhere'"})
    assert _refused(catalog, load_recipe(data), tmp_path).path == "streams[4].where"


def test_eval_coverage_below_the_threshold_is_refused_and_recorded_above_it(
    lake: tuple[VidlakeCatalog, CorpusSummary], tmp_path: Path
) -> None:
    catalog, summary = lake
    field = "exclusions.eval_near_duplicates"
    exc = _refused(catalog, load_recipe(_demo(**{f"{field}.embedding_model": PARTIAL})), tmp_path)
    assert exc.path == f"{field}.min_eval_coverage" and exc.value < 1.0
    eval_clips = catalog.scan(
        "clips", columns=["clip_id", "split"], row_filter="split == 'eval'", include_eval=True
    ).num_rows
    recipe = load_recipe(
        _demo(**{f"{field}.embedding_model": PARTIAL, f"{field}.min_eval_coverage": 0.5})
    )
    _, snap = build_artifacts(catalog, recipe, _mkdir(tmp_path / "cut"))
    found = snap["decontamination"]
    assert found["model"] == PARTIAL and found["eval_clips"] == eval_clips
    assert found["eval_clips_with_vectors"] == eval_clips - 1
    assert found["coverage"] == pytest.approx((eval_clips - 1) / eval_clips)
    assert found["train_clips_checked"] == found["train_clips"] > 0
    # The full model catches the planted bleed; the partial one cannot.
    _, full = build_artifacts(catalog, load_recipe(_demo()), _mkdir(tmp_path / "full"))
    assert full["decontamination"]["coverage"] == 1.0
    assert full["drops"]["eval_near_duplicate"] > snap["drops"].get("eval_near_duplicate", 0)
    assert full["decontamination"]["train_clips_dropped"] >= 1
    assert summary.eval_bleed_clip[1] not in set(
        catalog.embeddings(PARTIAL).clip_ids("eval").to_pylist()
    )


def test_a_pinned_recut_after_a_new_embedding_is_byte_identical_and_latest_reports_it(
    tmp_path: Path,
) -> None:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake", eval_salt="05" * 16))
    summary = generate_corpus(catalog, assets=100, seed=6, embedding_model=MODEL)
    train, held = summary.eval_bleed_clip
    _copy_embeddings(catalog, MODEL, PARTIAL, leave_out={held})
    registry = Registry(catalog.objects)
    field = "exclusions.eval_near_duplicates"
    latest = _demo(**{f"{field}.embedding_model": PARTIAL, f"{field}.min_eval_coverage": 0.0})
    v1 = cut_snapshot(catalog, registry, load_recipe(latest), workdir=tmp_path)
    pin = v1.snapshot["catalog_snapshot_ids"]
    assert pin[f"embeddings/{PARTIAL}"] >= 1 and pin[f"embeddings/{MODEL}"] >= 1
    assert v1.snapshot["embedding_versions"] == {
        k.split("/", 1)[1]: v for k, v in pin.items() if k.startswith("embeddings/")
    }

    # One new eval embedding: the held-out clip the train clip bleeds into.
    _copy_embeddings(catalog, MODEL, "scratch", leave_out=set())
    vector = catalog.embeddings("scratch").vectors([held])[1]
    clips = catalog.scan("clips", columns=["clip_id", "asset_id"], include_eval=True)
    asset = clips.filter(pa.compute.equal(clips["clip_id"], held))["asset_id"][0].as_py()
    catalog.embeddings(PARTIAL).add([held], [asset], ["eval"], vector)

    pinned = load_recipe({**latest, "catalog_pin": pin})
    v2 = cut_snapshot(catalog, registry, pinned, workdir=tmp_path)
    assert v2.snapshot["catalog_snapshot_ids"] == pin
    for name in DATA_ARTIFACTS:
        assert v2.snapshot["artifacts"][name] == v1.snapshot["artifacts"][name], name
    assert not registry.diff(1, 2).catalog_changed

    v3 = cut_snapshot(catalog, registry, load_recipe(latest), workdir=tmp_path)
    diff = registry.diff(1, v3.version)
    assert diff.catalog_changed
    change = diff.catalog_changes[f"embeddings/{PARTIAL}"]
    assert change["b"] > change["a"] == pin[f"embeddings/{PARTIAL}"]
    assert set(diff.catalog_changes) == {f"embeddings/{PARTIAL}"}
    assert train in diff.clips_removed
    assert v3.snapshot["decontamination"]["coverage"] == 1.0


def test_an_explicit_pin_without_embeddings_still_cuts_and_records_what_it_read(
    lake: tuple[VidlakeCatalog, CorpusSummary], tmp_path: Path
) -> None:
    catalog, _ = lake
    old_style = catalog.pin().to_dict()  # Iceberg tables only, as recipes had them
    _, snap = build_artifacts(
        catalog, load_recipe({**_demo(), "catalog_pin": old_style}), _mkdir(tmp_path / "c")
    )
    current = catalog.embeddings(MODEL).version
    assert snap["catalog_snapshot_ids"] == {
        **old_style,
        f"embeddings/{MODEL}": current,
        f"centroids/{MODEL}": 1,  # the semantic dedup's centroids, fitted by the first cut
    }


def test_a_pinned_embedding_version_that_does_not_exist_is_refused(
    lake: tuple[VidlakeCatalog, CorpusSummary], tmp_path: Path
) -> None:
    catalog, _ = lake
    pin = {**catalog.pin().to_dict(), f"embeddings/{MODEL}": 10_000}
    exc = _refused(catalog, load_recipe({**_demo(), "catalog_pin": pin}), tmp_path)
    assert exc.path == f"catalog_pin.embeddings/{MODEL}" and exc.value == 10_000


def test_the_check_is_vectorised_over_distinct_values(
    lake: tuple[VidlakeCatalog, CorpusSummary],
) -> None:
    catalog, _ = lake
    check = check_recipe(catalog, load_recipe(_demo()), streams=False)
    scores = catalog.scan("scores", columns=["filter_name", "filter_version"], include_eval=True)
    pairs = set(zip(*(c.to_pylist() for c in scores.columns), strict=True))
    assert {(n, v) for n, vs in check.known.scores.items() for v in vs} == pairs
    assert check.streams is None


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_decontamination_uses_the_catalogs_eval_split_not_the_embedding_tables(
    lake: tuple[VidlakeCatalog, CorpusSummary], tmp_path: Path
) -> None:
    catalog, summary = lake
    # Same vectors, but the producer labelled every row 'train'.
    src = catalog.embeddings(MODEL)
    clips = catalog.scan("clips", columns=["clip_id", "asset_id"], include_eval=True)
    found, vectors = src.vectors(clips["clip_id"].to_pylist())
    asset = dict(zip(*(c.to_pylist() for c in clips.columns), strict=True))
    catalog.embeddings("clipemb-mislabelled").add(
        found, [asset[c] for c in found], ["train"] * len(found), vectors
    )
    field = "exclusions.eval_near_duplicates.embedding_model"
    _, snap = build_artifacts(
        catalog, load_recipe(_demo(**{field: "clipemb-mislabelled"})), _mkdir(tmp_path / "c")
    )
    _, reference = build_artifacts(catalog, load_recipe(_demo()), _mkdir(tmp_path / "r"))
    assert snap["decontamination"]["coverage"] == 1.0
    assert snap["drops"]["eval_near_duplicate"] == reference["drops"]["eval_near_duplicate"] > 0
    assert summary.eval_bleed_clip[0]


def test_batch_pairs_equal_the_group_by_of_single_mixed_and_null_batches() -> None:
    """A batch of one (key, value) pair skips the hash group-by; every batch's pairs,
    concatenated and grouped as ``_grouped`` does, equal the group-by's."""
    from materializer.validate import _batch_pairs

    batches = [
        pa.table({"k": ["aesthetic"] * 5, "v": ["1"] * 5}),
        pa.table({"k": ["aesthetic", "motion", "aesthetic"], "v": ["1", "1", "2"]}),
        pa.table({"k": ["ocr", None], "v": ["1", "1"]}),
        pa.table({"k": ["ocr", "ocr"], "v": [None, None]}),
        pa.table({"k": pa.array([], pa.string()), "v": pa.array([], pa.string())}),
    ]
    assert _batch_pairs(batches[0], "k", "v").to_pylist() == [{"k": "aesthetic", "v": "1"}]
    for batch in batches:
        got = _batch_pairs(batch, "k", "v")
        want = batch.group_by(["k", "v"]).aggregate([])
        assert got.schema == want.schema
        assert sorted(map(str, got.to_pylist())) == sorted(map(str, want.to_pylist()))


def test_known_values_read_only_the_files_their_bounds_do_not_prove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data file whose manifest bounds prove its one (key, value) pair is not read;
    a file of two pairs, or of one value longer than Iceberg's 16-character bounds,
    is; the known values equal a group-by over every row."""
    import datetime as dt

    import catalog.scan_plan as scan_plan
    from materializer.validate import known_values

    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_salt="03" * 16))
    generate_corpus(catalog, assets=10, seed=4)
    clips = catalog.scan("clips", columns=["clip_id"], include_eval=True)["clip_id"]
    ids = clips.to_pylist()[:4]
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def scores(names: list[str]) -> pa.Table:
        return pa.table(
            {
                "clip_id": ids,
                "filter_name": names,
                "filter_version": ["9"] * len(ids),
                "score": [0.5] * len(ids),
                "computed_at": [now] * len(ids),
            }
        )

    catalog.add_scores(scores(["aesthetic", "motion", "aesthetic", "motion"]))  # two pairs
    catalog.add_scores(scores(["a_filter_name_of_24_chars"] * 4))  # bounds truncated
    pin = catalog.pin()
    read: dict[str, int] = {}
    real = scan_plan.read_plan

    def counted(plan: scan_plan.ScanPlan) -> pa.Table:
        read[plan.table] = read.get(plan.table, 0) + plan.files
        return real(plan)

    monkeypatch.setattr(scan_plan, "read_plan", counted)
    known = known_values(catalog, pin, embeddings=False)
    files = {
        t: scan_plan.plan_scan(catalog, t, pin, ["clip_id"]).files
        for t in ("scores", "captions", "latents")
    }
    # Of the scores, only the two unproven files (the corpus's own, one pair each, not);
    # the corpus writes some caption files of two kinds: those are read too.
    assert read["scores"] == 2 and sum(read.values()) < sum(files.values())
    for table, (key, value), got in (
        ("scores", ("filter_name", "filter_version"), known.scores),
        ("captions", ("caption_version", "kind"), known.captions),
        ("latents", ("tokenizer_version", "rung"), known.latents),
    ):
        rows = catalog.scan(table, pin=pin, columns=[key, value], include_eval=True)
        want: dict[str, set[str]] = {}
        for k, v in zip(rows[key].to_pylist(), rows[value].to_pylist(), strict=True):
            if k is not None and v is not None:
                want.setdefault(k, set()).add(v)
        assert got == {k: tuple(sorted(want[k])) for k in sorted(want)}
    assert known.scores["a_filter_name_of_24_chars"] == ("9",) and "9" in known.scores["motion"]


def test_a_batch_of_one_pair_keeps_a_copy_of_its_row_not_the_batch() -> None:
    """The pin stage's known values hold one row per batch, not every batch scanned."""
    import pyarrow as pa

    from materializer.validate import _batch_pairs

    n = 100_000
    batch = pa.table({"k": ["aesthetic"] * n, "v": ["1"] * n, "other": list(range(n))})
    pair = _batch_pairs(batch, "k", "v")
    assert pair.to_pylist() == [{"k": "aesthetic", "v": "1"}]
    assert pair.get_total_buffer_size() < 1024
    mixed = pa.table({"k": ["a", "b", "a"], "v": ["1", "1", "1"]})
    assert sorted(_batch_pairs(mixed, "k", "v").to_pylist(), key=str) == [
        {"k": "a", "v": "1"},
        {"k": "b", "v": "1"},
    ]
