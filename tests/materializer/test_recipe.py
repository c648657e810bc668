"""The recipe model: examples load, every validator names its path, the canonical
SHA-256 is stable, predicates cannot smuggle SQL, and random recipes behave."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pydantic
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.errors import InvalidRecipe
from materializer.predicates import (
    ALLOWED_FUNCTIONS,
    CLIP_VIEW_COLUMNS,
    clip_view_columns,
    validate_predicate,
)
from materializer.recipe import PIN_TABLES, Buckets, Recipe, load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "docs" / "recipes"
WARMUP = RECIPES / "warmup_256p.yaml"
CURRICULUM = RECIPES / "curriculum.yaml"


def _raw(path: Path = CURRICULUM) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _error(data: Any) -> InvalidRecipe:
    with pytest.raises(InvalidRecipe) as err:
        load_recipe(data)
    return err.value


# -- the shipped examples -------------------------------------------------------------


def test_warmup_example_loads() -> None:
    r = load_recipe(WARMUP)
    assert r.split == "train" and r.catalog_pin == "latest"
    assert [(p.name, p.rung, p.steps) for p in r.phases] == [("warmup", "256p", 2000)]
    assert dict(r.phases[0].weights) == {"clean": 1.0}
    assert r.phases[0].global_batch.for_bucket("8x16:9") == 256
    assert r.exclusions.tombstoned and r.exclusions.eval_near_duplicates is not None


def test_curriculum_example_loads() -> None:
    r = load_recipe(str(CURRICULUM))
    assert [p.rung for p in r.phases] == ["256p", "512p"]
    assert r.phases[1].token_budget == 200_000_000_000 and r.phases[1].steps is None
    assert r.phases[1].tiers == ("gold", "silver")
    assert r.tiers.names() == ("gold", "silver", "bronze")
    assert len(r.streams) >= 3 and len(r.filters) == 3 and r.semantic_dedup is not None
    for phase in r.phases:
        assert abs(sum(phase.weights.values()) - 1.0) < 1e-12
        for key in r.buckets.bucket_keys():
            assert phase.global_batch.for_bucket(key) % phase.rank_multiple == 0
    assert r.score_versions() == {"aesthetic": "2", "clip_text_sim": "1", "motion": "1", "ocr": "1"}
    assert "score_clip_text_sim" in r.view_columns() and "tier" not in r.view_columns(
        include_tier=False
    )


def test_recipe_is_frozen() -> None:
    r = load_recipe(CURRICULUM)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        r.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.phases[0].weights["web"] = 0.9  # type: ignore[index]
    with pytest.raises(TypeError):
        r.phases[0].global_batch.overrides["16x1:1"] = 8  # type: ignore[index]


def test_json_schema_generates_for_the_api() -> None:
    for mode in ("validation", "serialization"):
        schema = Recipe.model_json_schema(mode=mode)
        assert {"seed", "phases", "streams", "catalog_pin"} <= set(schema["properties"])


# -- every validation path ------------------------------------------------------------


def _set(path: str, value: Any):
    """A mutation that sets ``value`` at a dotted path (``phases.1.weights.web``)."""

    def mutate(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = d
        for part in head:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _drop(path: str):
    def mutate(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = d
        for part in head:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[last]

    return mutate


def _append(path: str, value: Any):
    def mutate(d: dict[str, Any]) -> None:
        node: Any = d
        for part in path.split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
        node.append(value)

    return mutate


ERRORS = [
    (_set("phases.1.weights.web", -0.5), "phases[1].weights.web", "greater than 0"),
    (_set("phases.1.weights.webb", 0.2), "phases[1].weights.webb", "unknown stream 'webb'"),
    (_set("phases.1.weights.Web", 0.2), "phases[1].weights.Web", "pattern"),
    (_set("phases.1.weights", {}), "phases[1].weights", "at least one"),
    (
        _set("phases.0.weights", {"web": 1, "licensed": 1e-12}),
        "phases[0].weights.licensed",
        "below",
    ),
    (
        _set("phases.1.rank_multiple", 3),
        "phases[1].global_batch.default",
        "multiple of rank_multiple",
    ),
    (
        _set("phases.1.global_batch.overrides.16x16:9", 96),
        "phases[1].global_batch.overrides.16x16:9",
        "not a multiple",
    ),
    (
        _set("phases.1.global_batch.overrides.32x16:9", 64),
        "phases[1].global_batch.overrides.32x16:9",
        "unknown bucket",
    ),
    (_set("phases.0.global_batch", 0), "phases[0].global_batch.default", "greater than 0"),
    (
        _set("phases.0.global_batch.overrides.16x32:18", 64),
        "phases[0].global_batch.overrides.16x32:18",
        "named twice",
    ),
    (_set("phases.0.global_batch", "big"), "phases[0].global_batch", "dictionary"),
    (_set("phases.1.steps", 10), "phases[1].steps", "exactly one of steps and token_budget"),
    (_drop("phases.1.token_budget"), "phases[1].steps", "exactly one"),
    (_set("phases.1.token_budget", 1.5), "phases[1].token_budget", "integer"),
    (_set("phases.1.tiers", ["gold", "platinum"]), "phases[1].tiers[1]", "unknown tier"),
    (_set("phases.1.tiers", []), "phases[1].tiers", "admits nothing"),
    (_set("phases.1.tiers", ["gold", "gold"]), "phases[1].tiers[1]", "duplicate"),
    (_set("phases.1.stpes", 3), "phases[1].stpes", "unknown field"),
    (_set("phases.0.rung", "256"), "phases[0].rung", "pattern"),
    (_set("phases.1.name", "broad-256p"), "phases[1].name", "duplicate"),
    (_set("phases", []), "phases", "at least 1"),
    (_set("split", "eval"), "split", "may only select split 'train'"),
    (_set("split", "test"), "split", "may only select"),
    (_set("streams.2.where", "domian = 'x'"), "streams[2].where", "unknown column 'domian'"),
    (_set("streams.2.where", "sourc = 'x'"), "streams[2].where", "did you mean 'source'"),
    (_set("streams.2.where", "1=1; DROP TABLE x"), "streams[2].where", "one expression"),
    (_set("streams.1.where", "(SELECT 1)"), "streams[1].where", "subqueries"),
    (_set("streams.1.where", "duration_s * 2"), "streams[1].where", "boolean"),
    (_set("streams.1.name", "licensed"), "streams[1].name", "duplicate"),
    (_set("streams", []), "streams", "at least 1"),
    (_set("tiers.rules.1.where", "tier = 'gold'"), "tiers.rules[1].where", "unknown column 'tier'"),
    (_set("tiers.rules.1.name", "gold"), "tiers.rules[1].name", "duplicate"),
    (_set("tiers.default", "gold"), "tiers.default", "also a rule"),
    (_drop("filters.0.min"), "filters[0].min", "min, max or both"),
    (_set("filters.1.max", 0.0), "filters[1].max", "below min"),
    (_set("filters.1.min", float("nan")), "filters[1].min", "finite"),
    (_set("filters.1.version", 1.1), "filters[1].version", "quote versions"),
    (_append("filters", {"name": "ocr", "version": "1", "max": 1}), "filters[3].name", "duplicate"),
    (_append("scores", {"name": "aesthetic", "version": "9"}), "scores[1].version", "filtered at"),
    (_set("semantic_dedup.rank_by", "beauty"), "semantic_dedup.rank_by", "unknown score"),
    (_set("semantic_dedup.num_clusters", 8), "semantic_dedup.num_clusters", "exactly one"),
    (_set("semantic_dedup.eps", 0), "semantic_dedup.eps", "greater than 0"),
    (_set("semantic_dedup.keep_per_cluster", 0), "semantic_dedup.keep_per_cluster", "greater"),
    (_set("exclusions.tombstoned", False), "exclusions.tombstoned", "never enter"),
    (_set("exclusions.quarantined", "yes"), "exclusions.quarantined", "boolean"),
    (
        _set("exclusions.eval_near_duplicates.max_distance", 1.5),
        "exclusions.eval_near_duplicates.max_distance",
        "less than 1",
    ),
    (_set("buckets.aspect_ratios", [969, "1:1"]), "buckets.aspect_ratios[0]", "quote aspect"),
    (_set("buckets.aspect_ratios", ["16:9", "32:18"]), "buckets.aspect_ratios[1]", "duplicate"),
    (_set("buckets.aspect_ratios", ["0:1"]), "buckets.aspect_ratios[0]", "zero side"),
    (_set("buckets.latent_frames", [4, 4]), "buckets.latent_frames[1]", "duplicate"),
    (_set("buckets.latent_frames", [0, 4]), "buckets.latent_frames[0]", "greater than 0"),
    (_set("captions.kinds", []), "captions.kinds", "at least 1"),
    (_set("captions.kinds", ["dense", "dense"]), "captions.kinds[1]", "duplicate"),
    (_drop("captions"), "captions", "required field is missing"),
    (_set("catalog_pin", "earliest"), "catalog_pin", "'latest' or a mapping"),
    (_set("catalog_pin", {"clips": 1}), "catalog_pin.assets", "every table"),
    (
        _set("catalog_pin", dict.fromkeys([*PIN_TABLES, "clipz"], 1)),
        "catalog_pin.clipz",
        "unknown table",
    ),
    (_set("catalog_pin", dict.fromkeys(PIN_TABLES, "1")), "catalog_pin.assets", "64-bit integer"),
    (
        _set("catalog_pin", {**dict.fromkeys(PIN_TABLES, 1), "embeddings/siglip-so400m-v1": 0}),
        "catalog_pin.embeddings/siglip-so400m-v1",
        "integer >= 1",
    ),
    (
        _set("catalog_pin", {**dict.fromkeys(PIN_TABLES, 1), "embeddings/": 3}),
        "catalog_pin.embeddings/",
        "names no embedding model",
    ),
    (
        _set(
            "catalog_pin",
            {
                **dict.fromkeys(PIN_TABLES, 1),
                "embeddings/siglip-so400m-v1": 3,
                "embeddings/siglip-so400m-v2": 3,
            },
        ),
        "catalog_pin.embeddings/siglip-so400m-v2",
        "reads no embeddings of 'siglip-so400m-v2'",
    ),
    (
        _set("exclusions.eval_near_duplicates.min_eval_coverage", 1.5),
        "exclusions.eval_near_duplicates.min_eval_coverage",
        "less than or equal to 1",
    ),
    (_set("seed", True), "seed", "integer"),
    (_set("seed", -1), "seed", "greater than or equal to 0"),
    (_set("seed", 2**64), "seed", "less than"),
    (_set("name", "has space"), "name", "pattern"),
    (_set("tokenizer_version", ""), "tokenizer_version", "at least 1"),
    (_set("nmae", "x"), "nmae", "unknown field"),
]


@pytest.mark.parametrize(("mutate", "path", "fragment"), ERRORS, ids=[e[1] for e in ERRORS])
def test_validation_errors_name_their_path(mutate, path: str, fragment: str) -> None:
    data = _raw()
    mutate(data)
    err = _error(data)
    assert err.path == path, str(err)
    assert str(err).startswith(f"{path}: ")
    assert fragment in str(err)
    assert err.errors[0]["path"] == path


def test_all_pydantic_errors_are_listed() -> None:
    data = _raw()
    data["seed"] = "x"
    data["phases"][0]["rank_multiple"] = 0
    err = _error(data)
    assert {e["path"] for e in err.errors} == {"seed", "phases[0].rank_multiple"}
    assert "(and 1 more)" in str(err)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a: [", "does not parse"),
        ("- 1\n- 2", "mapping"),
        ("", "mapping"),
        ("name: a\nname: b", "duplicate key"),
        ("a: &x [1]\nb: *x", "aliases"),
        ("a: !!python/object:os.system {}", "does not parse"),
        ('{"seed": NaN}', "NaN"),
        ('{"seed": 1, "seed": 2}', "duplicate key"),
        ("missing.yaml", "no such recipe file"),
    ],
)
def test_unparseable_documents(text: str, fragment: str) -> None:
    err = _error(text)
    assert err.path == ""
    assert fragment in str(err)


# -- canonical form -------------------------------------------------------------------


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def test_sha_ignores_key_order_format_and_spelling() -> None:
    base = load_recipe(CURRICULUM)
    raw = _raw()
    rng = random.Random(5)
    for _ in range(5):
        assert load_recipe(_shuffled(raw, rng)).sha256() == base.sha256()
    assert load_recipe(json.dumps(raw, indent=3)).sha256() == base.sha256()
    assert load_recipe(yaml.safe_dump(raw, default_flow_style=True)).sha256() == base.sha256()
    # Spellings that mean the same thing hash the same.
    same = copy.deepcopy(raw)
    same["phases"][0]["weights"] = {"licensed": 3, "synthetic": 1, "web": 5, "web_bronze": 1}
    same["filters"] = list(reversed(same["filters"]))
    same["buckets"]["aspect_ratios"] = ["32:18", "1:1", "8:6", "9:16"]
    same["streams"][0]["where"] = "SOURCE_TIER   =   'licensed'"
    same["exclusions"].pop("quarantined")  # the default is spelled out in the hash
    assert load_recipe(same).sha256() == base.sha256()
    # ...and a real change does not.
    other = copy.deepcopy(raw)
    other["seed"] += 1
    assert load_recipe(other).sha256() != base.sha256()


def test_global_batch_shorthand_equals_mapping() -> None:
    raw = _raw(WARMUP)
    long = copy.deepcopy(raw)
    long["phases"][0]["global_batch"] = {"default": 256}
    assert load_recipe(raw).sha256() == load_recipe(long).sha256()


def test_canonical_json_is_compact_sorted_and_reloads() -> None:
    r = load_recipe(CURRICULUM)
    text = r.to_canonical_json()
    assert (
        json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        == text
    )
    assert load_recipe(text) == r
    assert load_recipe(json.loads(text)).sha256() == r.sha256()


def test_sha_is_stable_across_processes() -> None:
    code = (
        "import sys; from materializer.recipe import load_recipe; "
        "print(load_recipe(sys.argv[1]).sha256())"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(CURRICULUM)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == load_recipe(CURRICULUM).sha256()


# -- buckets --------------------------------------------------------------------------


def test_bucket_assignment_rule() -> None:
    b = Buckets.model_validate(
        {"latent_frames": [16, 4, 8], "aspect_ratios": ["1:1", "16:9", "9:16"]}
    )
    assert b.latent_frames == (4, 8, 16) and b.aspect_ratios == ("9:16", "1:1", "16:9")
    assert b.bucket_keys()[0] == "4x9:16" and b.bucket_keys()[-1] == "16x16:9"
    frames = np.array([3, 4, 7, 8, 15, 16, 100, 8, 8])
    aspect = np.array([1.0, 1.0, 1.0, 1.7, 0.5, 1.0, 1.0, 4 / 3, 1 / 1.5])
    got = b.assign(frames, aspect)
    keys = b.bucket_keys()
    assert got[0] == -1  # shorter than every frame count
    assert [keys[i] for i in got[1:]] == [
        "4x1:1",
        "4x1:1",
        "8x16:9",
        "8x9:16",
        "16x1:1",
        "16x1:1",
        "8x1:1",  # 4/3 is nearer 1 than 16/9 in log space
        "8x9:16",  # 2/3 is nearer 9/16 than 1
    ]
    # A tie in log space goes to the narrower ratio.
    tie = float(np.sqrt(16 / 9))
    assert keys[b.assign(np.array([4]), np.array([tie]))[0]] == "4x1:1"


# -- predicates -----------------------------------------------------------------------

VIEW = clip_view_columns(["aesthetic", "motion"])

HOSTILE = [
    "1=1; DROP TABLE x",
    "source = 'a'; SELECT 1",
    "(SELECT 1)",
    "source IN (SELECT source FROM clips)",
    "EXISTS (SELECT 1)",
    "read_csv('/etc/passwd') IS NOT NULL",
    "getvariable('x') = 1",
    "source = 'a' -- ' OR 1=1",
    "source = 'a' /* */ OR TRUE",
    "source = 'unbalanced",
    'source = "unbalanced',
    "source = 'a')) OR ((1=1",
    "count(*) > 1",
    "sum(tokens) > 0",
    "row_number() OVER () = 1",
    "clips.source = 'a'",
    "? = 1",
    "$1 = source",
    "source = $$x$$",
    "pragma_version() IS NULL",
    "DROP TABLE clips",
    "SELECT * FROM clips",
    "ATTACH 'x.db'",
    "CAST(source AS STRUCT(a INT)) IS NULL",
    "*",
    "",
    "   ",
    "0=0=0",  # sqlglot reads a chained comparison; DuckDB's parser does not
    "width > 1 = TRUE < FALSE",
]


@pytest.mark.parametrize("sql", HOSTILE)
def test_hostile_predicates_are_rejected(sql: str) -> None:
    with pytest.raises(InvalidRecipe) as err:
        validate_predicate(sql, VIEW, "streams[0].where")
    assert err.value.path == "streams[0].where"
    assert str(err.value).startswith("streams[0].where: ")


def _duckdb_view() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"enable_external_access": False})
    cols = ", ".join(f"{name} {typ}" for name, typ in VIEW.items())
    con.execute(f"CREATE TABLE v ({cols})")
    con.execute(
        "INSERT INTO v (clip_id, source, source_tier, width, height, aspect, score_aesthetic, "
        "duration_s, tier, codec) VALUES ('c1', 'it''s', 'licensed', 640, 360, 1.78, 5.5, 3.0, "
        "'gold', 'h264'), ('c2', 'web', 'crawl', 360, 640, 0.56, NULL, 9.0, 'bronze', 'av1')"
    )
    return con


ACCEPTED = [
    ("source_tier = 'licensed' AND score_aesthetic >= 5", 1),
    ("Source_Tier IN ('licensed', 'crawl')", 2),
    ("source = 'it''s'", 1),
    ("source = 'x'';DROP TABLE v;--'", 0),
    ("source = '\\'' OR 1=1 --'", 0),
    ("coalesce(score_aesthetic, 0) < 1", 1),
    ("score_aesthetic IS NULL OR NOT duration_s BETWEEN 1 AND 5", 1),
    ("starts_with(codec, 'h26') OR regexp_matches(codec, '^av[0-9]$')", 2),
    ("CASE WHEN width > height THEN tier = 'gold' ELSE FALSE END", 1),
    ("CAST(width AS DOUBLE) / height > 1.5 AND lower(source) LIKE 'it%'", 1),
    ("greatest(width, height) >= 640 AND abs(round(aspect, 1) - 1.8) < 0.05", 1),
    ("length(clip_id) = 2 AND contains(source, 'w') AND ends_with(source, 'b')", 1),
    ("source ILIKE 'WEB' AND floor(duration_s) = ceil(duration_s)", 1),
    ("\"tier\" <> 'bronze'", 1),
]


@pytest.mark.parametrize(("sql", "matches"), ACCEPTED)
def test_accepted_predicates_run_in_duckdb_as_one_expression(sql: str, matches: int) -> None:
    out = validate_predicate(sql, VIEW, "streams[0].where")
    assert validate_predicate(out, VIEW, "x") == out  # a fixed point
    con = _duckdb_view()
    query = f"SELECT count(*) FROM v WHERE ({out})"
    assert len(con.extract_statements(query)) == 1
    assert con.execute(query).fetchone() == (matches,)
    assert con.execute("SELECT count(*) FROM v").fetchone() == (2,)


def test_tier_is_not_a_column_of_tier_rules() -> None:
    cols = clip_view_columns(["aesthetic"], include_tier=False)
    with pytest.raises(InvalidRecipe, match="tier is assigned by the tier rules"):
        validate_predicate("tier = 'gold'", cols, "tiers.rules[0].where")


def test_an_unknown_column_with_no_close_match_lists_the_columns() -> None:
    cols = {"stream": "INTEGER", "bucket": "INTEGER", "clip_id": "VARCHAR"}
    listed = r"unknown column 'zzz' \(columns: bucket, clip_id, stream\)"
    with pytest.raises(InvalidRecipe, match=listed):
        validate_predicate("zzz = 1", cols, "where")
    many = {f"c{i:02d}": "INTEGER" for i in range(50)}
    with pytest.raises(InvalidRecipe, match=r"c39, … 10 more\)"):
        validate_predicate("zzz = 1", many, "where")


def test_documented_view_and_allowlist() -> None:
    needed = {
        "clip_id", "asset_id", "t_start_s", "t_end_s", "duration_s", "fps", "num_frames",
        "width", "height", "aspect", "source", "source_tier", "license_id", "territory",
        "pii_class", "codec", "bitrate", "rung", "latent_frames", "tokens", "caption_count",
        "tier",
    }  # fmt: skip
    assert needed <= set(CLIP_VIEW_COLUMNS)
    docs = (ROOT / "docs" / "recipes.md").read_text()
    for name in CLIP_VIEW_COLUMNS:
        assert f"`{name}`" in docs, name
    for fn in ALLOWED_FUNCTIONS:
        assert f"`{fn}`" in docs, fn


_COLUMN = st.sampled_from(sorted(VIEW))
_ATOM = st.one_of(
    st.builds(lambda c, v: f"{c} > {v}", _COLUMN, st.integers(-5, 5)),
    st.builds(
        lambda c, s: f"{c} = '{s.replace(chr(39), chr(39) * 2)}'", _COLUMN, st.text(max_size=6)
    ),
    st.builds(lambda c: f"{c} IS NULL", _COLUMN),
    st.builds(lambda c, lo: f"{c} BETWEEN {lo} AND {lo + 3}", _COLUMN, st.integers(-3, 3)),
    st.builds(lambda c: f"lower({c}) LIKE 'a%'", _COLUMN),
)
_PREDICATE = st.recursive(
    _ATOM,
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a}) AND ({b})", inner, inner),
        st.builds(lambda a, b: f"{a} OR {b}", inner, inner),
        st.builds(lambda a: f"NOT ({a})", inner),
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(_PREDICATE)
def test_generated_predicates_normalise_to_a_fixed_point(sql: str) -> None:
    out = validate_predicate(sql, VIEW, "p")
    assert validate_predicate(out, VIEW, "p") == out
    assert len(duckdb.connect().extract_statements(f"SELECT 1 FROM v WHERE ({out})")) == 1


_TOKENS = [*"abcdeist_ ;'\"()-*/=<>,.$?%0123456789", "source", " OR ", "SELECT", "--", "/*"]
_SQLISH = st.lists(st.sampled_from(_TOKENS), max_size=25).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.one_of(_SQLISH, st.text(max_size=40)))
def test_random_text_is_rejected_or_safe(sql: str) -> None:
    try:
        out = validate_predicate(sql, VIEW, "p")
    except InvalidRecipe as err:
        assert err.path == "p"
        return
    # Whatever got through is one expression DuckDB reads the same way.
    con = duckdb.connect(config={"enable_external_access": False})
    assert len(con.extract_statements(f"SELECT 1 WHERE ({out})")) == 1
    assert validate_predicate(out, VIEW, "p") == out


# -- generated recipes ----------------------------------------------------------------

_NAMES = st.lists(
    st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=4, unique=True
)
_RATIOS = ["16:9", "4:3", "1:1", "3:4", "9:16", "21:9", "2:1"]


@st.composite
def recipes(draw: st.DrawFn) -> dict[str, Any]:
    streams = draw(_NAMES)
    score_names = draw(
        st.lists(st.sampled_from(["aesthetic", "motion", "ocr", "sim"]), unique=True)
    )
    n_filters = draw(st.integers(0, len(score_names)))
    filters = []
    for name in score_names[:n_filters]:
        lo = draw(st.one_of(st.none(), st.floats(-10, 10)))
        hi = draw(st.one_of(st.none(), st.floats(-10, 10)))
        if lo is None and hi is None:
            lo = 0.0
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        f: dict[str, Any] = {"name": name, "version": draw(st.sampled_from(["1", "2", "v3"]))}
        if lo is not None:
            f["min"] = lo
        if hi is not None:
            f["max"] = hi
        filters.append(f)
    scores = [{"name": n, "version": "1"} for n in score_names[n_filters:]]
    tier_rules = draw(
        st.lists(st.sampled_from(["gold", "silver", "iron"]), unique=True, max_size=3)
    )
    col = st.sampled_from(["duration_s > 1", "source_tier = 'crawl'", "width >= height", "TRUE"])
    scol = st.sampled_from([f"score_{n} > 0.5" for n in score_names] or ["fps > 24"])
    frames = draw(st.lists(st.integers(1, 64), min_size=1, max_size=4, unique=True))
    aspects = draw(st.lists(st.sampled_from(_RATIOS), min_size=1, max_size=4, unique=True))
    keys = [f"{f}x{a}" for f in frames for a in aspects]
    phases = []
    for i in range(draw(st.integers(1, 3))):
        multiple = draw(st.sampled_from([1, 2, 8, 64]))
        chosen = draw(st.lists(st.sampled_from(streams), min_size=1, unique=True))
        phase: dict[str, Any] = {
            "name": f"phase-{i}",
            "rung": draw(st.sampled_from(["256p", "512p", "720p"])),
            "weights": {s: draw(st.floats(0.01, 100)) for s in chosen},
            "global_batch": {
                "default": multiple * draw(st.integers(1, 16)),
                "overrides": {
                    k: multiple * draw(st.integers(1, 8))
                    for k in draw(st.lists(st.sampled_from(keys), unique=True, max_size=3))
                },
            },
            "rank_multiple": multiple,
        }
        if draw(st.booleans()):
            phase["steps"] = draw(st.integers(1, 10**7))
        else:
            phase["token_budget"] = draw(st.integers(1, 10**13))
        if tier_rules and draw(st.booleans()):
            phase["tiers"] = draw(
                st.lists(st.sampled_from([*tier_rules, "rest"]), min_size=1, unique=True)
            )
        phases.append(phase)
    recipe: dict[str, Any] = {
        "name": draw(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,10}", fullmatch=True)),
        "seed": draw(st.integers(0, 2**63 - 1)),
        "tokenizer_version": draw(st.sampled_from(["vae-1", "v2", "x"])),
        "filters": filters,
        "scores": scores,
        "tiers": {
            "rules": [{"name": t, "where": draw(scol)} for t in tier_rules],
            "default": "rest",
        },
        "streams": [{"name": s, "where": f"{draw(col)} AND tier <> 'x'"} for s in streams],
        "captions": {
            "version": "1",
            "kinds": draw(st.lists(st.sampled_from(["dense", "short"]), min_size=1, unique=True)),
        },
        "buckets": {"latent_frames": frames, "aspect_ratios": aspects},
        "phases": phases,
    }
    if draw(st.booleans()):
        recipe["catalog_pin"] = {
            t: draw(st.one_of(st.none(), st.integers(0, 2**63 - 1))) for t in PIN_TABLES
        }
    if score_names and draw(st.booleans()):
        recipe["semantic_dedup"] = {
            "embedding_model": "siglip",
            "eps": draw(st.floats(0.001, 0.5)),
            "rank_by": draw(st.sampled_from(score_names)),
            draw(st.sampled_from(["num_clusters", "cluster_size"])): draw(st.integers(1, 10**6)),
        }
    if draw(st.booleans()):
        recipe["exclusions"] = {
            "quarantined": draw(st.booleans()),
            "eval_near_duplicates": {
                "embedding_model": "siglip",
                "max_distance": draw(st.floats(0.001, 0.9)),
            },
        }
    return recipe


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes(), st.randoms(use_true_random=False))
def test_generated_recipes_validate_and_round_trip(raw: dict[str, Any], rng: random.Random) -> None:
    r = load_recipe(raw)
    assert isinstance(r, Recipe)
    sha = r.sha256()
    assert load_recipe(r.to_canonical_json()).sha256() == sha
    assert load_recipe(yaml.safe_dump(json.loads(r.to_canonical_json()))).sha256() == sha
    assert load_recipe(_shuffled(raw, rng)).sha256() == sha
    assert load_recipe(r.to_canonical_json()) == r
    for phase in r.phases:
        assert abs(sum(phase.weights.values()) - 1.0) < 1e-9
        assert set(phase.weights) <= {s.name for s in r.streams}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from(["latest", "train", "eval", "16:9", "256p", "1=1; DROP TABLE x", "-1", "0"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes(), st.data())
def test_corrupted_recipes_raise_invalid_recipe_only(
    raw: dict[str, Any], data: st.DataObject
) -> None:
    bad = copy.deepcopy(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(bad)
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if not path:
            bad = data.draw(_JUNK) if action == "replace" else bad
            if not isinstance(bad, dict):
                break
            continue
        parent: Any = bad
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        if action == "replace":
            parent[last] = data.draw(_JUNK)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=6))] = data.draw(_JUNK)
        else:
            parent.append(data.draw(_JUNK))
    try:
        r = load_recipe(bad)
    except InvalidRecipe as err:
        assert isinstance(err.path, str)
        assert err.message
        return
    assert load_recipe(r.to_canonical_json()).sha256() == r.sha256()


def test_an_explicit_pin_may_name_embedding_versions() -> None:
    pin = {**dict.fromkeys(PIN_TABLES, 11), "embeddings/siglip-so400m-v1": 4}
    r = load_recipe({**_raw(), "catalog_pin": pin})
    assert r.embedding_models() == ("siglip-so400m-v1",)
    assert dict(r.catalog_pin) == pin
    assert load_recipe(json.loads(r.to_canonical_json())).sha256() == r.sha256()
    # A pin from before pins covered embeddings still loads (the cut reads the latest).
    assert load_recipe({**_raw(), "catalog_pin": dict.fromkeys(PIN_TABLES, 11)}).catalog_pin
    # The eval coverage threshold defaults to every eval clip, and may be lowered.
    excl = load_recipe(_raw()).exclusions.eval_near_duplicates
    assert excl is not None and excl.min_eval_coverage == 1.0
    data = _raw()
    data["exclusions"]["eval_near_duplicates"]["min_eval_coverage"] = 0.99
    lowered = load_recipe(data).exclusions.eval_near_duplicates
    assert lowered is not None and lowered.min_eval_coverage == 0.99


def test_weights_not_summing_to_one_are_normalised_with_a_note() -> None:
    from materializer.recipe import recipe_notes

    doc = yaml.safe_load(WARMUP.read_text())
    doc["phases"][0]["weights"] = {k: 3 * v for k, v in doc["phases"][0]["weights"].items()}
    scaled = load_recipe(doc)
    (note,) = recipe_notes(scaled)
    assert note.startswith("phases[0]") and "sum to 3, not 1" in note
    plain = load_recipe(WARMUP)
    assert recipe_notes(plain) == [] and scaled == plain and scaled.sha256() == plain.sha256()
    assert recipe_notes(load_recipe(scaled.to_canonical_json())) == []  # already normalised


def test_buckets_are_assigned_in_blocks_of_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut's driver assigns every kept sample's bucket: in blocks, so the distance
    matrix and its temporaries are not ~100 B for every row at once; the same ids."""
    import tracemalloc

    from materializer.recipe import schedule

    buckets = Buckets.model_validate(
        {"latent_frames": [8, 16, 32], "aspect_ratios": ["16:9", "9:16", "1:1", "4:3"]}
    )
    rng = np.random.default_rng(2)
    n = 1 << 20
    frames = rng.integers(1, 40, n).astype(np.int32)
    aspect = rng.uniform(0.4, 2.2, n)
    tracemalloc.start()
    got = buckets.assign(frames, aspect)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 24 * n  # the whole-table version peaked near 100 B a row
    ratios = [int(w) / int(h) for w, h in (r.split(":") for r in buckets.aspect_ratios)]
    logs = np.log(ratios)
    fi = np.searchsorted([8, 16, 32], frames, side="right") - 1
    ai = np.argmin(np.abs(np.log(aspect)[:, None] - logs[None, :]), axis=1)
    assert np.array_equal(got, np.where(fi >= 0, fi * 4 + ai, -1))
    monkeypatch.setattr(schedule, "_ASSIGN_BLOCK", 1000)  # many ragged blocks
    assert np.array_equal(buckets.assign(frames, aspect), got)
