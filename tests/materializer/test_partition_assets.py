"""The asset side of a partitioned cut, split by ``asset_id``: the asset view computed per
key range and looked up per clip partition equals the one computed over every asset,
verdicts included (tombstoned, quarantined, each way of being an eval duplicate)."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from catalog.errors import StorageError
from materializer.asset_side import (
    ASSET_TABLES,
    EvalSets,
    Shard,
    asset_partition,
    asset_view_of,
    lookup,
    with_verdicts,
)
from materializer.partition import bucket_bounds


def _id(i: int) -> str:
    return hashlib.sha256(f"asset:{i}".encode()).hexdigest()


def _raw_asset_side(n: int, seed: int) -> dict[str, pa.Table]:
    """``n`` assets with eval ones, duplicate and near-duplicate links (some to eval
    assets, some from them), tombstones and status events."""
    rng = np.random.default_rng(seed)
    ids = [_id(i) for i in range(n)]
    split = np.where(rng.random(n) < 0.15, "eval", "train")
    dup = [ids[int(rng.integers(n))] if rng.random() < 0.2 else None for _ in range(n)]
    near = [
        [ids[int(j)] for j in rng.integers(0, n, int(rng.integers(1, 4)))]
        if rng.random() < 0.2
        else None
        for _ in range(n)
    ]
    assets = pa.table(
        {
            "asset_id": ids,
            "source": ["web"] * n,
            "source_tier": ["crawl"] * n,
            "license_id": ["lic"] * n,
            "territory": ["US"] * n,
            "pii_class": [None] * n,
            "probe_codec": ["h264"] * n,
            "probe_bitrate": pa.array(rng.integers(1, 9, n) * 1_000_000, pa.int64()),
            "split": split,
            "duplicate_of": pa.array(dup, pa.string()),
            "near_duplicates": pa.array(near, pa.list_(pa.string())),
        }
    )
    picked = [ids[int(i)] for i in rng.choice(n, min(n, 30), replace=False)]
    tombstones = pa.table({"asset_id": picked[:10], "kind": ["soft"] * len(picked[:10])})
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    events = [("quarantined", 1), ("released", 2)]
    rows = [(i, *events[k % 2]) for k, i in enumerate(picked[10:])]
    rows += [(i, "quarantined", 3) for i in picked[11:12]]  # released, quarantined again
    asset_events = pa.table(
        {
            "asset_id": [r[0] for r in rows],
            "event": [r[1] for r in rows],
            "at": pa.array([t0 + dt.timedelta(days=r[2]) for r in rows], pa.timestamp("us", "UTC")),
        }
    )
    return {"assets": assets, "tombstones": tombstones, "asset_events": asset_events}


def _in_range(table: pa.Table, lo: str | None, hi: str | None) -> pa.Table:
    ids = table["asset_id"].to_pylist()
    keep = [(lo is None or i >= lo) and (hi is None or i < hi) for i in ids]
    return table.filter(pa.array(keep, pa.bool_()))


def _sharded(
    raw: dict[str, pa.Table], partitions: int, root: Path
) -> tuple[tuple[Shard, ...], EvalSets]:
    shards, parts = [], []
    for p in range(partitions):
        shard = Shard(str(root / f"assets-{p:05d}"), *bucket_bounds(p, partitions))
        tables = {name: _in_range(raw[name], shard.lo, shard.hi) for name in ASSET_TABLES}
        parts.append(asset_partition(tables, shard))
        shards.append(shard)
    return tuple(shards), EvalSets.of(parts)


@pytest.mark.parametrize("partitions", [1, 3, 16])
def test_asset_ranges_looked_up_give_the_whole_asset_view(tmp_path: Path, partitions: int) -> None:
    raw = _raw_asset_side(300, seed=partitions)
    whole = asset_view_of(raw)
    verdicts = {c: int(pc.sum(whole[c]).as_py()) for c in ("tombstoned", "quarantined")}
    assert verdicts["tombstoned"] == 10 and verdicts["quarantined"] > 0
    assert pc.sum(whole["eval_duplicate"]).as_py() > 0
    shards, evals = _sharded(raw, partitions, tmp_path)
    assert len(evals.eval_ids) == pc.sum(pc.equal(raw["assets"]["split"], "eval")).as_py()
    every = pc.sort_indices(raw["assets"]["asset_id"])
    ids = pc.take(raw["assets"]["asset_id"], every)
    assert with_verdicts(lookup(shards, ids.combine_chunks()), evals).equals(whole)
    # A clip partition's few assets: only theirs, with the catalog-wide verdicts.
    some = pc.take(ids, pa.array(sorted(np.random.default_rng(1).choice(300, 40, False))))
    mine = with_verdicts(lookup(shards, some.combine_chunks()), evals)
    assert mine.num_rows == 40
    assert mine.equals(whole.filter(pc.is_in(whole["asset_id"], value_set=some)))


def test_each_eval_link_makes_an_eval_duplicate() -> None:
    """Linked to eval, linked from eval (an eval asset's ``duplicate_of``), or an eval
    asset among its near duplicates; a train asset an eval one links as *its* near
    duplicate is not (the one-process cut's rule)."""
    e, to_eval, target, near, linked_by_eval = (_id(i) for i in range(5))
    raw = _raw_asset_side(1, seed=0)
    assets = pa.table(
        {
            **{c: raw["assets"][c].take([0] * 5) for c in raw["assets"].column_names},
            "asset_id": [e, to_eval, target, near, linked_by_eval],
            "split": ["eval", "train", "train", "train", "train"],
            "duplicate_of": [target, e, None, None, None],
            "near_duplicates": pa.array(
                [[linked_by_eval], None, None, [to_eval, e], None], pa.list_(pa.string())
            ),
        }
    ).select(raw["assets"].column_names)
    tables = {**raw, "assets": assets, "tombstones": raw["tombstones"].slice(0, 0)}
    tables["asset_events"] = raw["asset_events"].slice(0, 0)
    view = asset_view_of(tables)
    flags = dict(zip(view["asset_id"].to_pylist(), view["eval_duplicate"].to_pylist(), strict=True))
    assert flags == {e: False, to_eval: True, target: True, near: True, linked_by_eval: False}


def test_a_lookup_finds_only_what_a_shard_holds(tmp_path: Path) -> None:
    raw = _raw_asset_side(50, seed=7)
    shards, _ = _sharded(raw, 4, tmp_path)
    held = sorted(raw["assets"]["asset_id"].to_pylist())
    absent = sorted([_id(1000), _id(1001), held[3] + "0", held[5][:-1]])
    found = lookup(shards, pa.array(sorted(set(absent) | {held[3], held[5]})))
    assert found["asset_id"].to_pylist() == [held[3], held[5]]
    assert lookup(shards, pa.array([], pa.string())).num_rows == 0


def test_an_empty_asset_range_is_an_empty_shard(tmp_path: Path) -> None:
    raw = _raw_asset_side(3, seed=2)
    shards, _ = _sharded(raw, 16, tmp_path)  # most of the 16 ranges hold no asset
    ids = pa.array(sorted(raw["assets"]["asset_id"].to_pylist()))
    assert lookup(shards, ids)["asset_id"].to_pylist() == ids.to_pylist()


def test_a_shard_this_worker_cannot_see_is_a_clear_error(tmp_path: Path) -> None:
    raw = _raw_asset_side(20, seed=3)
    shards, _ = _sharded(raw, 2, tmp_path)
    Path(f"{shards[1].path}.arrow").unlink()
    ids = pa.array(sorted(raw["assets"]["asset_id"].to_pylist()))
    with pytest.raises(StorageError, match=r"not visible here.*shared by every worker") as err:
        lookup(shards, ids)
    assert err.value.details["path"] == shards[1].path
