"""Planned scans: what a worker reads from a pickled plan equals ``catalog.scan``."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import NotFound
from catalog.pins import Pin
from catalog.reads import one_of
from catalog.scan_plan import all_of, key_range, plan_scan, read_plan, split_plan
from service.demo.corpus import generate_corpus


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> VidlakeCatalog:
    cat = VidlakeCatalog.open(
        CatalogConfig.embedded(tmp_path_factory.mktemp("lake"), eval_salt="00" * 16)
    )
    generate_corpus(cat, assets=30, seed=1)
    return cat


@pytest.mark.parametrize(
    ("table", "columns"),
    [
        ("clips", ["clip_id", "asset_id", "split", "num_frames"]),
        ("latents", ["clip_id", "rung", "tensor_keys", "ingested_at"]),
        ("captions", ["clip_id", "kind", "text"]),
    ],
)
def test_a_pickled_plan_reads_what_scan_reads(
    catalog: VidlakeCatalog, table: str, columns: list[str]
) -> None:
    pin = catalog.pin()
    expr = all_of(key_range("clip_id", "4", "c"), None)
    plan = pickle.loads(pickle.dumps(plan_scan(catalog, table, pin, columns, expr)))
    got = read_plan(plan)
    want = catalog.scan(table, pin=pin, columns=columns, row_filter=expr, include_eval=True)
    assert got.schema == want.schema
    assert got.sort_by([(c, "ascending") for c in columns[:2]]).equals(
        want.sort_by([(c, "ascending") for c in columns[:2]])
    )
    ids = got["clip_id"].to_pylist()
    assert ids and all("4" <= i < "c" for i in ids)
    assert plan.files >= 1 and plan.rows >= got.num_rows


def test_ranges_partition_the_rows_and_filters_combine(catalog: VidlakeCatalog) -> None:
    pin = catalog.pin()
    whole = catalog.scan("latents", pin=pin, columns=["clip_id", "rung"], include_eval=True)
    bounds = [(None, "5"), ("5", "a"), ("a", None)]
    parts = [
        read_plan(
            plan_scan(catalog, "latents", pin, ["clip_id", "rung"], key_range("clip_id", lo, hi))
        )
        for lo, hi in bounds
    ]
    assert sum(p.num_rows for p in parts) == whole.num_rows
    rung = whole["rung"][0].as_py()
    only = read_plan(
        plan_scan(
            catalog, "latents", pin, ["clip_id", "rung"],
            all_of(one_of("rung", [rung]), key_range("clip_id", "5", "a")),
        )
    )  # fmt: skip
    assert set(only["rung"].to_pylist()) == {rung}
    assert only.num_rows <= parts[1].num_rows


def test_an_empty_table_and_a_missing_snapshot(catalog: VidlakeCatalog, tmp_path: Path) -> None:
    empty = read_plan(plan_scan(catalog, "clips", Pin({"clips": None}), ["clip_id"]))
    assert empty.num_rows == 0 and empty.schema.field("clip_id").type in (
        pa.string(),
        pa.large_string(),
    )
    with pytest.raises(NotFound):
        plan_scan(catalog, "clips", Pin({"clips": 12345}), ["clip_id"])


def test_a_split_plan_deals_files_by_their_bounds_and_reads_each_range(tmp_path: Path) -> None:
    """Files written in clip_id order: each range plans only the files that hold it, and
    the ranges read together are the whole table."""
    cat = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0))
    generate_corpus(cat, assets=12, seed=2)
    clips = cat.scan("clips", include_eval=True).sort_by("clip_id")
    sorted_root = tmp_path / "sorted"
    two = VidlakeCatalog.open(CatalogConfig.embedded(sorted_root, eval_fraction=0.0))
    assets = cat.scan("assets", include_eval=True)
    two.add_assets(
        assets.drop_columns(
            [c for c in ("duplicate_of", "near_duplicates") if c in assets.column_names]
        )
    )
    half = clips.num_rows // 2
    for part in (clips.slice(0, half), clips.slice(half)):
        two.add_clips(
            part.select(
                [
                    "clip_id",
                    "asset_id",
                    "t_start_s",
                    "t_end_s",
                    "split_version",
                    "fps",
                    "num_frames",
                    "width",
                    "height",
                ]
            )
        )
    # Iceberg keeps 16 characters of a string bound: split at the truncated lower
    # bound of the second file, which every id of the first file sorts before.
    mid = clips["clip_id"][half].as_py()[:16]
    plan = plan_scan(two, "clips", two.pin(), ["clip_id"])
    low, high = split_plan(plan, "clip_id", [(None, mid), (mid, None)])
    assert plan.files == 2 and (low.files, high.files) == (1, 1)
    got = sorted(read_plan(low)["clip_id"].to_pylist() + read_plan(high)["clip_id"].to_pylist())
    assert got == clips["clip_id"].to_pylist()
    assert (
        max(read_plan(low)["clip_id"].to_pylist())
        < mid
        <= min(read_plan(high)["clip_id"].to_pylist())
    )
