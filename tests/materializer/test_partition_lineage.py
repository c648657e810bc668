"""``lineage.arrow`` by an external sort: the bytes of the all-in-memory inversion,
whatever the row ranges, with memory bounded by one range."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from manifests.format import LINEAGE_SCHEMA, PLAN_SCHEMA
from manifests.ipc import DEFAULT_CHUNK, iter_batches, write_table
from materializer.plan import lineage
from materializer.plan.lineage import write_lineage


def _reference(plan_path: Path, num_rows: int) -> pa.Table:
    """The inversion as the cut did it before: every pair in memory, one sort."""
    rows_parts, steps_parts = [], []
    for batch in iter_batches(plan_path):
        lists = batch.column("rows")
        lengths = pc.list_value_length(lists).to_numpy()
        rows_parts.append(np.asarray(pc.list_flatten(lists).to_numpy(), np.int64))
        steps_parts.append(np.repeat(batch.column("step").to_numpy(), lengths).astype(np.int64))
    rows, steps = np.concatenate(rows_parts), np.concatenate(steps_parts)
    span = int(steps.max()) + 1
    keys = rows * span + steps
    keys.sort()
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_rows), out=offsets[1:])
    lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(keys % span, pa.int64()))
    return pa.table(
        {"row": pa.array(np.arange(num_rows, dtype=np.int64)), "steps": lists},
        schema=LINEAGE_SCHEMA,
    )


def _plan(path: Path, num_rows: int, steps: int, batch: int, seed: int) -> int:
    """A plan of ``steps`` steps of ``batch`` rows drawn with repeats (some rows twice
    in one step, some never); its plan rows."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, num_rows, (steps, batch)).astype(np.int64)
    drawn[:, 1] = drawn[:, 0]  # a row a step holds twice lists that step twice
    table = pa.table(
        {
            "step": pa.array(np.arange(steps, dtype=np.int64)),
            "phase": pa.array(np.zeros(steps, np.int32)),
            "bucket": pa.array(np.zeros(steps, np.int32)),
            "stream_epochs": pa.array([[0]] * steps, pa.list_(pa.int32())),
            "rows": pa.array(list(drawn), pa.list_(pa.int64())),
            "skipped": pa.array(np.zeros(steps, np.int32)),
        },
        schema=PLAN_SCHEMA,
    )
    write_table(path, table, max_chunksize=7)  # many small plan batches
    return steps * batch


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("narrow", [True, False], ids=["uint32-keys", "int64-keys"])
@pytest.mark.parametrize("pairs_per_range", [1, 13, 500, 1 << 30])
def test_every_range_size_gives_the_bytes_of_the_in_memory_sort(
    tmp_path: Path, pairs_per_range: int, narrow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not narrow:  # keys too wide for 32 bits: the int64 path
        monkeypatch.setattr(lineage, "NARROW_KEYS", 0)
    num_rows = 1000
    plan_rows = _plan(tmp_path / "plan.arrow", num_rows, steps=60, batch=32, seed=1)
    write_table(tmp_path / "ref.arrow", _reference(tmp_path / "plan.arrow", num_rows))
    out = tmp_path / "lineage.arrow"
    spill = tmp_path / "spill"
    write_lineage(
        out, tmp_path / "plan.arrow", num_rows, plan_rows, spill, pairs_per_range=pairs_per_range
    )
    assert _sha(out) == _sha(tmp_path / "ref.arrow")
    assert list(spill.iterdir()) == []  # every spill file is gone


def test_ranges_bound_the_pairs_held_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The largest range read back holds about ``pairs_per_range`` pairs, not the plan."""
    num_rows = 4000
    plan_rows = _plan(tmp_path / "plan.arrow", num_rows, steps=100, batch=64, seed=2)
    held: list[int] = []
    real = lineage._sorted_range

    def spy(file: Path, rows: int, span: int, dtype: np.dtype) -> tuple[object, object]:
        held.append(file.stat().st_size // dtype.itemsize)
        return real(file, rows, span, dtype)

    monkeypatch.setattr(lineage, "_sorted_range", spy)
    write_lineage(
        tmp_path / "l.arrow", tmp_path / "plan.arrow", num_rows, plan_rows,
        tmp_path / "spill", pairs_per_range=400,
    )  # fmt: skip
    assert sum(held) == plan_rows and len(held) == 16
    assert max(held) < 600  # ~400 per range (random rows), never the plan's 6,400


def test_lineage_batches_keep_the_ipc_chunk_across_ranges(tmp_path: Path) -> None:
    """More rows than one lineage batch: batches of DEFAULT_CHUNK rows, as before."""
    num_rows = DEFAULT_CHUNK + 3000
    plan_rows = _plan(tmp_path / "plan.arrow", num_rows, steps=20, batch=4096, seed=3)
    write_table(tmp_path / "ref.arrow", _reference(tmp_path / "plan.arrow", num_rows))
    write_lineage(
        tmp_path / "l.arrow", tmp_path / "plan.arrow", num_rows, plan_rows,
        tmp_path / "spill", pairs_per_range=20_000,
    )  # fmt: skip
    assert _sha(tmp_path / "l.arrow") == _sha(tmp_path / "ref.arrow")


def test_keys_are_spilled_in_four_bytes_when_a_range_fits_32_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range whose keys fit in 32 bits spills 4 bytes a pair, else 8; same output."""
    plan_rows = _plan(tmp_path / "plan.arrow", 1000, steps=60, batch=32, seed=4)
    sizes: dict[str, int] = {}
    real = lineage._sorted_range

    def spy(file: Path, rows: int, span: int, dtype: np.dtype) -> tuple[object, object]:
        sizes[dtype.name] = sizes.get(dtype.name, 0) + file.stat().st_size
        return real(file, rows, span, dtype)

    monkeypatch.setattr(lineage, "_sorted_range", spy)
    outs = []
    for limit in (1 << 32, 1000 * 60 - 1):  # 1000 rows x 60 steps: fits, then not
        monkeypatch.setattr(lineage, "NARROW_KEYS", limit)
        out = tmp_path / f"l-{limit}.arrow"
        write_lineage(out, tmp_path / "plan.arrow", 1000, plan_rows, tmp_path / "spill")
        outs.append(_sha(out))
    assert sizes == {"uint32": 4 * plan_rows, "int64": 8 * plan_rows}
    assert outs[0] == outs[1]
