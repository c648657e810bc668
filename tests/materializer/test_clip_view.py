"""The clip view query (materializer/clip_view.py): its caption and latest-latent
sides against the plain SQL they replace, and the shape of its plan.

The one-pass caption pivot and the duplicate-only latent window must give exactly
what an ordered ``list`` per clip and a window over every latent row gave, on inputs
with missing kinds, several rows per key, null embeddings, other versions and kinds,
and ties on ``ingested_at``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from materializer.clip_view import _LATEST_LATENT_SQL, _captions_sql, candidate_sql
from materializer.partition import SCAN_COLUMNS, _kept_sorted
from materializer.recipe import load_recipe
from tests.fixtures.recipes import small_corpus_demo

#: What the caption side was: a (clip, kind) grouping, then an ordered list per clip.
REFERENCE_CAPTIONS = """
WITH cap1 AS (
  SELECT clip_id, kind, arg_max(text, ingested_at) AS text,
         arg_max(text_embedding_sha256, ingested_at) AS emb,
         list_position($kinds::VARCHAR[], kind) AS pos
  FROM raw_captions WHERE caption_version = $caption_version
    AND list_position($kinds::VARCHAR[], kind) > 0
  GROUP BY clip_id, kind
)
SELECT clip_id, list(text ORDER BY pos) AS captions,
       list(emb ORDER BY pos) AS text_embedding_sha256, count(*)::INTEGER AS caption_count
FROM cap1 GROUP BY clip_id ORDER BY clip_id
"""

#: What the latent side was: every row ranked in its (clip, rung).
REFERENCE_LATENTS = """
SELECT * FROM raw_latents WHERE tokenizer_version = $tokenizer
QUALIFY row_number() OVER (
  PARTITION BY clip_id, rung ORDER BY ingested_at DESC, object_sha256, member_sha256
) = 1
ORDER BY clip_id, rung
"""

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _captions(rng: np.random.Generator, clips: int) -> pa.Table:
    """Caption rows: each clip has 0-3 rows of each of 4 kinds in 2 versions, distinct
    times (``arg_max`` over a tie picks any row, in both forms), embeddings often null."""
    rows: list[dict[str, Any]] = []
    for c in range(clips):
        for kind in ("dense", "short", "tags", "other"):
            for version in ("1", "2"):
                for _ in range(int(rng.integers(0, 4))):
                    emb = None if rng.random() < 0.4 else f"{int(rng.integers(1 << 30)):064x}"
                    rows.append(
                        {
                            "clip_id": f"{c:032x}",
                            "caption_version": version,
                            "kind": kind,
                            "text": f"{kind} {len(rows)}",
                            "text_embedding_sha256": emb,
                            "model_version": "m",
                            "ingested_at": T0 + dt.timedelta(seconds=len(rows)),
                        }
                    )
    order = rng.permutation(len(rows))
    return pa.Table.from_pylist([rows[i] for i in order])


@pytest.mark.parametrize("kinds", [["dense"], ["short", "dense"], ["tags", "dense", "short"]])
def test_the_caption_pivot_gives_the_ordered_lists(kinds: list[str]) -> None:
    """Per clip: the latest text and latest non-null embedding of each kind it has, in
    the recipe's order of kinds, and the number of kinds: as the ordered lists gave."""
    table = _captions(np.random.default_rng(len(kinds)), 300)
    params: dict[str, Any] = {"caption_version": "1", "kinds": kinds}
    params.update({f"kind{i}": k for i, k in enumerate(kinds)})
    con = duckdb.connect()
    con.register("raw_captions", table)
    pivot = con.sql(
        f"WITH cap AS ({_captions_sql(len(kinds))}) SELECT * FROM cap ORDER BY clip_id",
        params=params,
    ).to_arrow_table()
    reference = con.sql(
        REFERENCE_CAPTIONS, params={"caption_version": "1", "kinds": kinds}
    ).to_arrow_table()
    assert pivot.num_rows > 0 and pivot.equals(reference)
    counts = set(pivot["caption_count"].to_pylist())
    assert 0 not in counts and len(kinds) in counts and (len(kinds) == 1 or 1 in counts)


def _latents(rng: np.random.Generator, clips: int) -> pa.Table:
    """Latent rows: most (clip, rung) keys once, some up to 4 times with equal and
    different times, two tokenizers."""
    rows: list[dict[str, Any]] = []
    for c in range(clips):
        for rung in ("256p", "512p"):
            for _ in range(1 if rng.random() < 0.7 else int(rng.integers(2, 5))):
                rows.append(
                    {
                        "clip_id": f"{c:032x}",
                        "rung": rung,
                        "tokenizer_version": "vae-a" if rng.random() < 0.9 else "vae-b",
                        "format": "safetensors",
                        "object_sha256": f"{int(rng.integers(4)):064x}",
                        "offset": int(rng.integers(100)),
                        "length": 10,
                        "member_sha256": f"{int(rng.integers(1 << 20)):064x}",
                        "tensor_keys": ["latent"],
                        "latent_frames": 4,
                        "tokens": 64,
                        "job_id": None,
                        "ingested_at": T0 + dt.timedelta(seconds=int(rng.integers(3))),
                    }
                )
    order = rng.permutation(len(rows))
    return pa.Table.from_pylist([rows[i] for i in order])


def test_the_latest_latent_is_the_one_the_full_window_ranks_first() -> None:
    """The latest row of each (clip, rung), ties to the smallest object then member
    SHA-256: the window over duplicated keys only picks what ranking every row did."""
    table = _latents(np.random.default_rng(7), 400)
    con = duckdb.connect()
    con.register("raw_latents", table)
    fast = con.sql(
        f"WITH {_LATEST_LATENT_SQL} SELECT * FROM lat ORDER BY clip_id, rung",
        params={"tokenizer": "vae-a"},
    ).to_arrow_table()
    reference = con.sql(REFERENCE_LATENTS, params={"tokenizer": "vae-a"}).to_arrow_table()
    assert fast.num_rows < table.num_rows and fast.equals(reference)


def _empty_inputs(con: duckdb.DuckDBPyConnection) -> None:
    """Empty clip-side scans and an empty ``raw_asset_view``, typed as a cut sees them."""
    from catalog.tables import TABLES, arrow_schema

    for name in ("clips", "latents", "scores", "captions"):
        schema = arrow_schema(TABLES[name].schema)
        con.register(f"raw_{name}", schema.empty_table().select(SCAN_COLUMNS[name]))
    con.execute(
        "CREATE TABLE raw_asset_view (asset_id VARCHAR, source VARCHAR, source_tier VARCHAR,"
        " license_id VARCHAR, territory VARCHAR, pii_class VARCHAR, probe_codec VARCHAR,"
        " probe_bitrate BIGINT, split VARCHAR, duplicate_of VARCHAR, tombstoned BOOLEAN,"
        " quarantined BOOLEAN, eval_duplicate BOOLEAN)"
    )


def _operators(
    node: dict[str, Any], parent: str | None = None
) -> list[tuple[str, str | None, Any]]:
    """(name, parent name, extra info) of every operator of an ``EXPLAIN (FORMAT json)``."""
    found = [(node["name"], parent, node.get("extra_info", {}))]
    for child in node.get("children", []):
        found.extend(_operators(child, node["name"]))
    return found


def test_the_plan_has_no_ordered_list_no_shared_view_and_one_narrow_window() -> None:
    """The query's plan: no ``list`` aggregate (an ordered one per clip sorted every
    group), no CTE but the small ``dup`` keys (the dropped and the kept rows came from
    one materialized view scanned twice) and the one window behind the semi join to
    the duplicated keys."""
    from materializer.clip_view import candidate_params

    recipe = load_recipe(small_corpus_demo())
    con = duckdb.connect()
    _empty_inputs(con)
    sql = f"EXPLAIN (FORMAT json) {candidate_sql(recipe)}"
    plan = json.loads(con.execute(sql, candidate_params(recipe)).fetchall()[0][1])
    ops = [op for root in plan for op in _operators(root)]
    aggregates = json.dumps([info.get("Aggregates") for name, _, info in ops])
    assert "list(" not in aggregates and "arg_max" in aggregates
    assert [info.get("CTE Name") for name, _, info in ops if name == "CTE"] == ["dup"]
    assert [parent for name, parent, _ in ops if name == "WINDOW"] == ["PROJECTION"]
    windows = [i for i, (name, _, _) in enumerate(ops) if name == "WINDOW"]
    assert len(windows) == 1 and ops[windows[0] + 1][2].get("Join Type") == "SEMI"


def test_kept_rows_are_gathered_in_the_stable_key_order() -> None:
    """``_kept_sorted`` equals a filter then a stable sort by ``(rung, clip_id)``, on a
    table of several chunks with repeated keys."""
    rng = np.random.default_rng(3)
    n = 5000
    table = pa.Table.from_batches(
        pa.table(
            {
                "rung": rng.choice(["256p", "512p", "1024p"], n),
                "clip_id": [f"{i:04x}" for i in rng.integers(0, 800, n)],
                "payload": pa.array([[str(i)] * (i % 3) for i in range(n)]),
                "value": np.arange(n),
            }
        ).to_batches(max_chunksize=700)
    )
    keep = pa.chunked_array([rng.random(n) < 0.6])
    expected = table.filter(keep).sort_by([("rung", "ascending"), ("clip_id", "ascending")])
    assert _kept_sorted(table, keep).equals(expected)


REFERENCE_ASSETS = """
SELECT * FROM raw_assets
QUALIFY row_number() OVER (PARTITION BY asset_id ORDER BY asset_id) = 1
ORDER BY asset_id
"""


def test_the_asset_view_keeps_one_row_of_a_repeated_asset() -> None:
    """An asset written twice (the same row) is one row of the asset view, as the
    window over every asset made it; the others pass as they are."""
    from catalog.tables import TABLES, arrow_schema
    from materializer.asset_side import asset_view

    rng = np.random.default_rng(11)
    ids = [f"{i:064x}" for i in rng.integers(0, 300, 500)]  # ~40 % repeated
    schema = arrow_schema(TABLES["assets"].schema)
    columns = SCAN_COLUMNS["assets"]
    assets = pa.table(
        {
            "asset_id": ids,
            "source": [f"s{int(i, 16) % 3}" for i in ids],
            "source_tier": ["crawl"] * len(ids),
            "license_id": ["lic"] * len(ids),
            "territory": ["US"] * len(ids),
            "pii_class": [None] * len(ids),
            "probe_codec": ["h264"] * len(ids),
            "probe_bitrate": [int(i, 16) for i in ids],
            "split": ["train"] * len(ids),
            "duplicate_of": [None] * len(ids),
            "near_duplicates": [None] * len(ids),
        }
    ).cast(pa.schema([schema.field(c) for c in columns]))
    tables = {
        "assets": assets,
        "tombstones": arrow_schema(TABLES["tombstones"].schema).empty_table(),
        "asset_events": arrow_schema(TABLES["asset_events"].schema).empty_table(),
    }
    con = duckdb.connect()
    view = asset_view(con, tables)
    con.register("raw_assets", assets)
    reference = con.sql(REFERENCE_ASSETS).to_arrow_table()
    assert view.num_rows == len(set(ids)) < len(ids)
    assert view["asset_id"].to_pylist() == reference["asset_id"].to_pylist()
    assert view["probe_bitrate"].to_pylist() == reference["probe_bitrate"].to_pylist()


def _asset_tables(rng: np.random.Generator) -> dict[str, pa.Table]:
    """Asset scans (some ids repeated, some tombstoned, quarantined or eval) as a cut
    sees them."""
    from catalog.tables import TABLES, arrow_schema

    ids = [f"{i:064x}" for i in rng.integers(0, 400, 600)]
    schema = arrow_schema(TABLES["assets"].schema)
    assets = pa.table(
        {
            "asset_id": ids,
            "source": [f"s{int(i, 16) % 3}" for i in ids],
            "source_tier": ["crawl"] * len(ids),
            "license_id": ["lic"] * len(ids),
            "territory": ["US"] * len(ids),
            "pii_class": [None] * len(ids),
            "probe_codec": ["h264"] * len(ids),
            "probe_bitrate": [int(i, 16) for i in ids],
            "split": ["eval" if int(i, 16) % 17 == 0 else "train" for i in ids],
            "duplicate_of": [ids[0] if int(i, 16) % 13 == 0 else None for i in ids],
            "near_duplicates": [[ids[1]] if int(i, 16) % 11 == 0 else None for i in ids],
        }
    ).cast(pa.schema([schema.field(c) for c in SCAN_COLUMNS["assets"]]))
    tombstones = pa.table({"asset_id": ids[::7], "kind": ["takedown"] * len(ids[::7])})
    events = pa.table(
        {
            "asset_id": ids[::5],
            "event": ["quarantined"] * len(ids[::5]),
            "at": [T0] * len(ids[::5]),
        }
    )
    return {
        "assets": assets,
        "tombstones": tombstones.cast(
            pa.schema(
                [arrow_schema(TABLES["tombstones"].schema).field(c) for c in ("asset_id", "kind")]
            )
        ),
        "asset_events": events.cast(
            pa.schema(
                [
                    arrow_schema(TABLES["asset_events"].schema).field(c)
                    for c in ("asset_id", "event", "at")
                ]
            )
        ),
    }


def test_the_unordered_asset_view_holds_the_same_rows_and_sorts_nothing() -> None:
    """The one-process cut's asset view and verdicts (no ``ORDER BY``: it only joins
    them) hold exactly the sorted ones' rows, and their plans have no sort."""
    from materializer.asset_side import asset_view, eval_sets, register_asset_view
    from materializer.clip_view import (
        ASSET_VERDICT_UNORDERED_SQL,
        ASSET_VIEW_PARAMS,
        ASSET_VIEW_UNORDERED_SQL,
    )

    tables = _asset_tables(np.random.default_rng(63))
    views = []
    for ordered in (True, False):
        con = duckdb.connect()
        view = asset_view(con, tables, ordered=ordered)
        register_asset_view(con, view, eval_sets(con, view), ordered=ordered)
        verdicts = con.sql("SELECT * FROM raw_asset_view").to_arrow_table()
        views.append((view.sort_by("asset_id"), verdicts.sort_by("asset_id")))
        if not ordered:
            for name in ("assets", "tombstones", "asset_events"):
                con.register(f"raw_{name}", tables[name])
            for name, table in eval_sets(con, view).tables().items():
                con.register(name, table)
            con.register("av", view)  # after eval_sets, which unregisters it
            for sql, params in (
                (ASSET_VIEW_UNORDERED_SQL, ASSET_VIEW_PARAMS),
                (ASSET_VERDICT_UNORDERED_SQL, {}),
            ):
                plan = json.loads(
                    con.execute(f"EXPLAIN (FORMAT json) {sql}", params).fetchall()[0][1]
                )
                names = [op[0] for root in plan for op in _operators(root)]
                assert "ORDER_BY" not in names and "TOP_N" not in names
        con.close()
    assert views[0][0].num_rows > 0 and views[0][1]["tombstoned"].to_pylist().count(True) > 0
    assert views[0][0].equals(views[1][0]) and views[0][1].equals(views[1][1])


def test_the_plain_cut_asks_for_the_asset_view_in_no_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """``query_candidates`` without the catalog's eval sets (the one-process cut) reads
    the asset view unordered; with them (a clip partition) as before."""
    from materializer import partition

    asked: list[object] = []
    real_view, real_register = partition.asset_view, partition.register_asset_view

    def view(*args: Any, **kwargs: Any) -> pa.Table:
        asked.append(("view", kwargs.get("ordered", True)))
        return real_view(*args, **kwargs)

    def register(*args: Any, **kwargs: Any) -> None:
        asked.append(("verdicts", kwargs.get("ordered", True)))
        real_register(*args, **kwargs)

    monkeypatch.setattr(partition, "asset_view", view)
    monkeypatch.setattr(partition, "register_asset_view", register)
    from catalog.tables import TABLES, arrow_schema

    recipe = load_recipe(small_corpus_demo())
    tables = _asset_tables(np.random.default_rng(5))
    for name in ("clips", "latents", "scores", "captions"):
        tables[name] = arrow_schema(TABLES[name].schema).empty_table().select(SCAN_COLUMNS[name])
    partition.query_candidates(partition.ViewQuery.of(recipe, coverage=False), tables)
    assert asked == [("view", False), ("verdicts", False)]
