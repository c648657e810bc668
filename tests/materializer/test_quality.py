"""The plan quality report: planted defects show up, a normal cut scores low, a recipe
threshold fails the cut with nothing published."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput, InvalidRecipe
from manifests.format import QUALITY_NAME
from manifests.registry import Registry
from materializer.cut import build_artifacts, cut_snapshot
from materializer.dry_run import plan_cut
from materializer.plan import PhaseSpec, Pool, write_plan
from materializer.quality import (
    PhaseTarget,
    PlanArrays,
    _repeats,
    autocorrelation,
    quality_report,
    read_plan,
)
from materializer.recipe import load_recipe
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo

BATCH = 32


def _plan(rows: np.ndarray, batch: int = BATCH) -> PlanArrays:
    steps = rows.size // batch
    return PlanArrays(
        phase=np.zeros(steps, np.int64),
        offsets=np.arange(steps + 1, dtype=np.int64) * batch,
        rows=rows[: steps * batch].astype(np.int64),
    )


def _report(
    plan: PlanArrays,
    stream: np.ndarray,
    keys: dict[str, np.ndarray],
    *,
    target: PhaseTarget | None = None,
    window_steps: int = 16,
) -> dict[str, Any]:
    n = stream.size
    return quality_report(
        plan,
        stream=stream.astype(np.int64),
        bucket=np.zeros(n, np.int64),
        tokens=np.ones(n, np.int64),
        keys=keys,
        phases=[target or PhaseTarget("p", {0: 1.0})],
        stream_names=["s0", "s1"],
        bucket_names=["b0"],
        global_batch=BATCH,
        window_steps=window_steps,
    )


# -- the estimator ----------------------------------------------------------------------
def test_autocorrelation_of_an_alternating_sequence_is_exact() -> None:
    codes = np.tile(np.array([0, 1], np.int64), 500)
    acf = autocorrelation(codes, np.array([1, 2, 3], np.int64))
    assert acf == pytest.approx([-1.0, 1.0, -1.0])
    # A key with one value carries no information: 0, never a division by zero.
    assert autocorrelation(np.zeros(100, np.int64), np.array([1, 5])) == pytest.approx([0, 0])


# -- planted defects ----------------------------------------------------------------------
def _corpus(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """3000 manifest rows: sources 0, 1, 2 (1000 rows each), 10 clips per asset."""
    rows = np.arange(3000)
    return rows // 1000, rows // 10


def test_a_source_whose_scatter_is_disabled_shows_high_autocorrelation() -> None:
    source, asset = _corpus()
    rng = np.random.default_rng(1)
    scattered = rng.permutation(3000)
    ok = _report(_plan(scattered), np.zeros(3000), {"source": source, "asset_id": asset})
    assert ok["max_autocorr_beyond_batch"] < 0.1
    # Source 0 unscattered: its rows arrive in crawl (manifest) order, one run.
    others = scattered[source[scattered] != 0]
    bad_rows = np.concatenate([others[:600], np.arange(1000), others[600:]])
    bad = _report(_plan(bad_rows), np.zeros(3000), {"source": source, "asset_id": asset})
    series = bad["autocorr"]["series"]
    lags = np.asarray(bad["autocorr"]["lags"])
    assert bad["batch_lag"] == BATCH and lags.max() == 4 * BATCH
    assert max(abs(v) for v, h in zip(series["source"], lags, strict=True) if h > BATCH) > 0.5
    assert bad["max_autocorr_beyond_batch"] > 0.5 > 5 * ok["max_autocorr_beyond_batch"]
    # An asset's ten clips in a row: high at short lags, flat far beyond them.
    assert series["asset_id"][0] > 0.2 and abs(series["asset_id"][-1]) < 0.05


def test_a_skewed_mixture_shows_its_deviation_exactly() -> None:
    # 32 steps: the first 16 all stream 0, the last 16 all stream 1, against 50/50.
    stream = np.repeat([0, 1], 16 * BATCH)
    rows = np.arange(stream.size)
    target = PhaseTarget("p", {0: 0.5, 1: 0.5})
    report = _report(_plan(rows), stream, {}, target=target, window_steps=16)
    phase = report["phases"][0]
    assert phase["max_abs_deviation"] == pytest.approx(0.5)  # window 0: all stream 0
    assert report["max_share_deviation"] == pytest.approx(0.5)
    realized = phase["windows"]["streams"]["s0"]["realized"]
    assert realized[0] == 1.0 and realized[8] == 0.5 and realized[-1] == 0.0
    assert phase["windows"]["start_step"] == list(range(17))
    assert report["repeated_in_step"] == 0


def _planned(tmp_path: Path, weights: dict[int, float]) -> tuple[PlanArrays, np.ndarray]:
    stream = np.repeat([0, 1], 2000)
    pool = Pool(
        row=np.arange(4000), stream=stream, bucket=np.zeros(4000, int), tokens=np.ones(4000, int)
    )
    spec = PhaseSpec(0, pool, {0: BATCH}, weights, num_steps=200)
    write_plan(tmp_path / "plan.arrow", [spec], seed=5, num_streams=2)
    return read_plan(tmp_path / "plan.arrow"), stream


def test_a_real_plan_against_a_skewed_target_shows_the_deviation(tmp_path: Path) -> None:
    plan, stream = _planned(tmp_path, {0: 0.5, 1: 0.5})
    keys = {"asset_id": np.arange(4000) // 4}
    honest = _report(plan, stream, keys, target=PhaseTarget("p", {0: 0.5, 1: 0.5}))
    assert honest["max_share_deviation"] < 0.02  # quotas keep windows on target
    skewed = _report(plan, stream, keys, target=PhaseTarget("p", {0: 0.7, 1: 0.3}))
    assert skewed["max_share_deviation"] == pytest.approx(0.2, abs=0.02)
    assert skewed["phases"][0]["p99_abs_deviation"] == pytest.approx(0.2, abs=0.02)
    assert honest["repeated_in_step"] == 0
    assert honest["max_autocorr_beyond_batch"] < 0.05
    epochs = {(e["stream"], e["bucket"]): e for e in honest["epochs"]}
    assert epochs["s0", "b0"]["samples"] == 2000
    assert epochs["s0", "b0"]["draws"] + epochs["s1", "b0"]["draws"] == plan.rows.size
    assert epochs["s0", "b0"]["epochs"] == pytest.approx(200 * BATCH / 2 / 2000)


def test_repeats_are_counted_in_steps_of_every_size() -> None:
    """Steps of mixed sizes (1 to 9 rows, as buckets with different batches give),
    rows drawn from few values so that many repeat: the count equals a direct one."""
    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 10, 300)
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    rows = rng.integers(0, 12, int(offsets[-1])).astype(np.int64)
    plan = PlanArrays(phase=np.zeros(sizes.size, np.int64), offsets=offsets, rows=rows)
    direct = sum(
        int(b - a) - len(set(rows[a:b].tolist())) for a, b in itertools.pairwise(offsets.tolist())
    )
    assert direct > 0
    assert _repeats(plan, plan.sample_steps()) == direct


def test_repeats_within_a_step_are_counted() -> None:
    rows = np.arange(4 * BATCH)
    rows[5] = rows[3]  # step 0 holds row 3 twice
    rows[BATCH + 1] = rows[0]  # row 0 in steps 0 and 1: not a repeat within a step
    report = _report(_plan(rows), np.zeros(rows.size), {})
    assert report["repeated_in_step"] == 1


# -- cuts -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> VidlakeCatalog:
    root = tmp_path_factory.mktemp("lake")
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16))
    generate_corpus(catalog, assets=150, seed=3)
    return catalog


def _demo_like() -> dict[str, object]:
    """The demo recipe's broad phase with batches this small corpus holds (no repeats
    in a step); its 256p phase is too sparse here."""
    data = small_corpus_demo()
    phases = []
    for p in data["phases"][:1]:
        # 480 steps: enough samples that the acf's noise floor (~1/sqrt(samples)) is low.
        p = {**p, "allow_repeats_in_step": False, "rank_multiple": 1, "steps": 480}
        p["global_batch"] = {"default": 4, "overrides": {k: 1 for k in _sparse_buckets()}}
        phases.append(p)
    data["phases"] = phases
    return data


def _sparse_buckets() -> list[str]:
    return ["8x16:9", "8x9:16", "8x1:1", "8x4:3"]


def test_a_demo_like_cut_reports_low_values_and_no_repeats(
    catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    recipe = load_recipe(_demo_like())
    artifacts, snap = build_artifacts(catalog, recipe, tmp_path)
    report = json.loads(Path(artifacts[QUALITY_NAME]).read_text())
    assert report["repeated_in_step"] == 0 == snap["repeats_in_step"]
    assert report["max_share_deviation"] < 0.15
    assert report["max_autocorr_beyond_batch"] < 0.06
    assert set(report["autocorr"]["series"]) == {"source", "asset_id"}  # no cluster column
    assert snap["quality"] == {
        k: report[k]
        for k in ("repeated_in_step", "max_share_deviation", "max_autocorr_beyond_batch", "passed")
    }
    assert [p["name"] for p in report["phases"]] == [p.name for p in recipe.phases]
    assert sum(p["steps"] for p in report["phases"]) == snap["num_steps"]
    # A pure function of the plan: the same cut writes the same bytes.
    (tmp_path / "again").mkdir()
    again, _ = build_artifacts(catalog, recipe, tmp_path / "again")
    assert Path(again[QUALITY_NAME]).read_bytes() == Path(artifacts[QUALITY_NAME]).read_bytes()


def test_repeats_in_the_report_match_the_plan_summary(
    catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    recipe = load_recipe(small_corpus_demo())  # allows repeats: pools below their quota
    artifacts, snap = build_artifacts(catalog, recipe, tmp_path)
    report = json.loads(Path(artifacts[QUALITY_NAME]).read_text())
    assert report["repeated_in_step"] == snap["repeats_in_step"] > 0


@pytest.mark.parametrize(
    ("name", "limit"), [("max_autocorr_beyond_batch", 1e-6), ("max_share_deviation", 1e-6)]
)
def test_a_threshold_fails_the_cut_and_publishes_nothing(
    catalog: VidlakeCatalog, tmp_path: Path, name: str, limit: float
) -> None:
    data = {**_demo_like(), "quality": {"window_steps": 8, name: limit}}
    registry = Registry(catalog.objects)
    before = registry.versions()
    with pytest.raises(InvalidInput) as info:
        cut_snapshot(catalog, registry, load_recipe(data), workdir=tmp_path)
    assert info.value.details["field"] == f"quality.{name}"
    assert info.value.details["threshold"] == limit
    assert info.value.details["value"] > limit
    assert name in str(info.value) and f"{limit:g}" in str(info.value)
    assert registry.versions() == before


def test_a_dry_run_reports_quality_and_the_threshold_it_would_fail_on(
    catalog: VidlakeCatalog,
) -> None:
    open_gate = plan_cut(catalog, load_recipe(_demo_like()))
    assert open_gate["publishable"] and open_gate["quality"]["repeated_in_step"] == 0
    tight = {**_demo_like(), "quality": {"max_share_deviation": 1e-6}}
    found = plan_cut(catalog, load_recipe(tight))
    assert not found["publishable"]
    assert found["quality"]["max_share_deviation"] == open_gate["quality"]["max_share_deviation"]
    [problem] = found["problems"]
    assert problem["path"] == "quality.max_share_deviation"
    assert "max_share_deviation" in problem["message"]


def test_a_token_phase_compares_token_shares() -> None:
    # Every step: 16 samples of stream 0 (1 token each), 16 of stream 1 (3 tokens each).
    stream = np.tile(np.repeat([0, 1], BATCH // 2), 8)
    tokens = np.where(stream == 0, 1, 3)
    plan = _plan(np.arange(stream.size))
    target = PhaseTarget("t", {0: 0.5, 1: 0.5}, unit="tokens")
    report = quality_report(
        plan,
        stream=stream,
        bucket=np.zeros(stream.size, np.int64),
        tokens=tokens,
        keys={},
        phases=[target],
        stream_names=["s0", "s1"],
        bucket_names=["b0"],
        global_batch=BATCH,
    )
    # Half the samples but a quarter of the tokens: 0.25 off its token target.
    assert report["max_share_deviation"] == pytest.approx(0.25)
    assert report["phases"][0]["unit"] == "tokens"


def test_a_phase_without_steps_and_a_plan_shorter_than_the_lags() -> None:
    plan = _plan(np.arange(3 * BATCH))
    report = quality_report(
        plan,
        stream=np.zeros(3 * BATCH, np.int64),
        bucket=np.zeros(3 * BATCH, np.int64),
        tokens=np.ones(3 * BATCH, np.int64),
        keys={"source": np.arange(3 * BATCH) % 3},
        phases=[PhaseTarget("a", {0: 1.0}), PhaseTarget("empty", {0: 1.0})],
        stream_names=["s0"],
        bucket_names=["b0"],
        global_batch=BATCH,
    )
    assert report["phases"][1]["steps"] == 0 and report["phases"][1]["max_abs_deviation"] == 0
    assert max(report["autocorr"]["lags"]) == 3 * BATCH - 1  # below the stream's length
    json.dumps(report, allow_nan=False)  # no NaN anywhere


def test_the_quality_block_is_checked_and_leaves_old_recipes_their_sha() -> None:
    plain = load_recipe(_demo_like())
    assert "quality" not in json.loads(plain.to_canonical_json())
    gated = load_recipe({**_demo_like(), "quality": {"max_share_deviation": 0.05}})
    assert gated.quality is not None and gated.quality.window_steps == 16
    assert gated.sha256() != plain.sha256()
    for bad in ({"window_steps": 0}, {"max_share_deviation": 1.5}, {"nope": 1}):
        with pytest.raises(InvalidRecipe) as info:
            load_recipe({**_demo_like(), "quality": bad})
        assert info.value.details["path"].startswith("quality")


# -- only the drawn rows (decision 059) ---------------------------------------------------
def test_the_report_reads_the_manifest_file_as_it_reads_the_table(
    catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    """A partitioned driver holds no per-row copy for the report: it reads the written
    manifest, one row group at a time, and gets the report the table gives."""
    import pyarrow.parquet as pq

    from materializer.quality import plan_quality

    recipe = load_recipe(_demo_like())
    artifacts, _ = build_artifacts(catalog, recipe, tmp_path)
    manifest = Path(artifacts["manifest.parquet"])
    table = pq.read_table(manifest)
    plan = Path(artifacts["plan.arrow"])
    expected = plan_quality(plan, table, recipe)
    assert plan_quality(plan, manifest, recipe) == expected
    # Many row groups (a slice each) and rows the plan never draws change nothing.
    small = tmp_path / "small.parquet"
    pq.write_table(table, small, row_group_size=7)
    assert pq.ParquetFile(small).num_row_groups > 3
    assert plan_quality(plan, small, recipe) == expected
    assert json.loads(Path(artifacts[QUALITY_NAME]).read_text()) == json.loads(json.dumps(expected))


def test_the_report_does_not_depend_on_how_keys_are_numbered() -> None:
    """The report compares codes only for equality and weighs the keys' frequencies
    exactly, so renumbering the keys (or keys no step draws) gives the same floats."""
    rng = np.random.default_rng(5)
    n = 4000
    keys = rng.integers(0, 900, n)
    plan = _plan(rng.choice(n // 2, 64 * BATCH))  # rows >= n / 2 are never drawn
    relabel = rng.permutation(5000)[:900] * 7 + 3
    first = _report(plan, rng.integers(0, 2, n), {"asset_id": keys})
    stream = np.zeros(n, np.int64)
    a = _report(plan, stream, {"asset_id": keys, "source": keys % 5})
    b = _report(plan, stream, {"asset_id": relabel[keys], "source": (keys % 5) * 11})
    assert a == b
    assert first["autocorr"]["series"]["asset_id"] == a["autocorr"]["series"]["asset_id"]


def test_the_plan_may_not_draw_a_row_the_manifest_lacks() -> None:
    import pyarrow as pa

    from materializer.quality_rows import drawn_rows

    table = pa.table({"stream": [0, 0], "bucket": [0, 0], "tokens": [1, 1]})
    with pytest.raises(InvalidInput, match="manifest row 2"):
        drawn_rows(np.array([0, 2], np.int64), [table])
    from materializer.quality_rows import whole_table

    with pytest.raises(InvalidInput, match="manifest row 2"):
        whole_table(np.array([0, 2], np.int64), table)


def test_a_table_held_whole_is_measured_without_sorting_the_plan_rows(
    catalog: VidlakeCatalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-process cut holds its manifest table anyway: the report keeps every
    row's values (no sort of the plan's rows for the drawn ones, no search to renumber
    them: ~3 s of the 1M-clip cut) and equals the report read from the file."""
    import pyarrow.parquet as pq

    from materializer import quality

    recipe = load_recipe(_demo_like())
    artifacts, _ = build_artifacts(catalog, recipe, tmp_path)
    manifest = Path(artifacts["manifest.parquet"])
    plan = Path(artifacts["plan.arrow"])
    from_file = quality.plan_quality(plan, manifest, recipe)
    table = pq.read_table(manifest)

    def no_sort(*args: object, **kwargs: object) -> None:
        raise AssertionError("the plan's rows were sorted or searched")

    monkeypatch.setattr(quality, "drawn_rows", no_sort)
    monkeypatch.setattr(quality.np, "searchsorted", no_sort)
    assert quality.plan_quality(plan, table, recipe) == from_file


def test_the_asset_count_comes_from_the_quality_codes(
    catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    """A table's string keys are counted off the codes the report makes anyway (the
    snapshot's asset count, no second hash of every id): equal to a hash count, with
    and without null ids; the snapshot's count equals the manifest's."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from materializer.quality import plan_quality

    recipe = load_recipe(_demo_like())
    artifacts, snapshot = build_artifacts(catalog, recipe, tmp_path)
    manifest = pq.read_table(artifacts["manifest.parquet"])
    assets = int(pc.count_distinct(manifest["asset_id"]).as_py())
    assert snapshot["counts"]["assets"] == assets > 1
    ids = manifest["asset_id"].to_pylist()
    nulled = pa.array([None if i % 3 == 0 else v for i, v in enumerate(ids)], pa.string())
    at = manifest.schema.get_field_index("asset_id")
    for table in (manifest, manifest.set_column(at, "asset_id", nulled)):
        distinct: dict[str, int] = {}
        plan_quality(artifacts["plan.arrow"], table, recipe, distinct=distinct)
        assert distinct["asset_id"] == int(pc.count_distinct(table["asset_id"]).as_py())
