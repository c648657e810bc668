"""``loader.gather``: a few records sliced, many taken, both equal to the index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loader.gather import SLICE_MAX_ROWS
from loader.plan import open_plan
from manifests.synthetic import write_snapshot

COLUMNS = ["clip_id", "member_sha256", "captions", "tensor_keys", "offset"]


@pytest.mark.parametrize("index_rows", [40, [17, 50, 9, 64]])  # equal batches, and uneven
def test_gathered_records_equal_the_index_in_the_order_asked(
    tmp_path: Path, index_rows: Any
) -> None:
    snap = write_snapshot(
        tmp_path / "store", num_rows=140, num_steps=2, index_rows_per_batch=index_rows
    )
    plan = open_plan(snap.url, 1, tmp_path / "cache")
    rng = np.random.default_rng(0)
    cases = [
        np.array([95, 0, 41, 41, 17, 60, 61, 62, 139]),  # repeats, a run, batch edges
        np.arange(30, 30 + SLICE_MAX_ROWS),  # one run across batches, slices at the limit
        rng.integers(0, 140, SLICE_MAX_ROWS + 1),  # just past it: take
        rng.permutation(140),
    ]
    for rows in cases:
        got = plan.index_columns(rows.astype(np.int64), COLUMNS)
        assert got.equals(snap.index.take(rows).select(["row", *COLUMNS])), rows
    plan.close()


def test_few_rows_take_nothing_and_many_of_one_batch_take_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.compute as pc

    snap = write_snapshot(tmp_path / "store", num_rows=200, num_steps=2, index_rows_per_batch=100)
    plan = open_plan(snap.url, 1, tmp_path / "cache")
    takes: list[int] = []
    real = pc.take

    def take(data: Any, indices: Any, **kw: Any) -> Any:
        takes.append(len(indices))
        return real(data, indices, **kw)

    monkeypatch.setattr(pc, "take", take)
    few = np.array([9, 3, 3, 0, 7], dtype=np.int64)
    many = np.random.default_rng(1).integers(0, 100, SLICE_MAX_ROWS + 8)  # one index batch
    spread = np.r_[many, [150, 120]]  # two index batches
    for rows, expected in ((few, []), (many, [len(many)]), (spread, [len(many), 2, len(spread)])):
        takes.clear()
        got = plan.index_columns(rows, ["clip_id", "captions"])
        assert takes == expected
        assert got.equals(snap.index.take(rows).select(["row", "clip_id", "captions"]))
    plan.close()
