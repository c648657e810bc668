"""Patches: every step kept, excluded rows skipped and accounted for, per step."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.errors import IntegrityError, InvalidInput, NotFound
from catalog.objects import ObjectStore
from catalog.objects.local import LocalObjectStore
from manifests import Registry
from manifests.format import PLAN_SCHEMA, SKIPPED_NAME
from manifests.patch import filter_plan_batch, patch
from tests.manifests._cutter import make_cut


def read_plan(registry: Registry, version: int) -> pa.Table:
    return pa.ipc.open_file(
        pa.BufferReader(registry.read_artifact(version, "plan.arrow"))
    ).read_all()


def read_skipped(registry: Registry, version: int) -> pa.Table:
    return pq.read_table(pa.BufferReader(registry.read_artifact(version, SKIPPED_NAME)))


def check_accounting(registry: Registry, original: int, patched: int) -> None:
    """Unpatched plan minus skipped rows = patched plan, per step; every step kept."""
    old, new = read_plan(registry, original), read_plan(registry, patched)
    skipped = read_skipped(registry, patched)
    assert new.schema.equals(PLAN_SCHEMA, check_metadata=False)
    for column in ("step", "phase", "bucket", "stream_epochs"):
        assert new.column(column).equals(old.column(column))
    per_step: dict[int, Counter[int]] = {}
    for step, row in zip(
        skipped.column("step").to_pylist(), skipped.column("row").to_pylist(), strict=True
    ):
        per_step.setdefault(step, Counter())[row] += 1
    old_rows, new_rows = old.column("rows").to_pylist(), new.column("rows").to_pylist()
    excluded = {r for c in per_step.values() for r in c}
    for step, (before, after) in enumerate(zip(old_rows, new_rows, strict=True)):
        # Order is kept; what went is exactly the skipped rows of this step.
        assert after == [r for r in before if r not in excluded]
        assert Counter(before) - Counter(after) == per_step.get(step, Counter())
    assert new.column("skipped").to_pylist() == [
        sum(per_step.get(s, Counter()).values()) for s in range(len(old_rows))
    ]
    # The skipped rows name the right clips, and the index and manifest are re-used.
    index = pa.ipc.open_file(pa.BufferReader(registry.read_artifact(patched, "index.arrow")))
    clip_of = index.read_all().column("clip_id").to_pylist()
    assert skipped.column("clip_id").to_pylist() == [clip_of[r] for r in skipped["row"].to_pylist()]
    a, b = registry.get(original).artifacts, registry.get(patched).artifacts
    assert a["index.arrow"] == b["index.arrow"] and a["manifest.parquet"] == b["manifest.parquet"]
    snapshot = registry.get(patched).snapshot
    assert snapshot["plan_rows"] == sum(len(r) for r in new_rows)
    assert snapshot["counts"]["skipped_plan_rows"] == skipped.num_rows


@st.composite
def plans_and_exclusions(draw: st.DrawFn) -> tuple[list[list[int]], dict[str, list[Any]]]:
    num_rows = draw(st.integers(1, 30))
    steps = draw(
        st.lists(st.lists(st.integers(0, num_rows - 1), max_size=12), min_size=1, max_size=10)
    )
    rows = st.integers(0, num_rows - 1)
    exclusions: dict[str, list[Any]] = {
        "exclude_clip_ids": [f"c{r}" for r in draw(st.sets(rows, max_size=5))],
        "exclude_asset_ids": [f"a{r // 3}" for r in draw(st.sets(rows, max_size=2))],
        "exclude_rows": sorted(draw(st.sets(rows, max_size=5))),
    }
    if not any(exclusions.values()):
        exclusions["exclude_rows"] = [draw(rows)]
    return [list(range(num_rows)), *steps], exclusions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans_and_exclusions())
def test_old_plan_minus_skipped_rows_is_the_new_plan(
    case: tuple[list[list[int]], dict[str, list[Any]]],
) -> None:
    # The first step lists every row, so make_cut's row count comes from it.
    steps, exclusions = case
    num_rows = len(steps[0])
    with tempfile.TemporaryDirectory() as tmp:
        registry = Registry(LocalObjectStore(Path(tmp) / "store"))
        clip_ids = [f"c{r}" for r in range(num_rows)]
        paths, meta = make_cut(
            Path(tmp) / "cut",
            clip_ids,
            asset_ids=[f"a{r // 3}" for r in range(num_rows)],
            steps=steps,
        )
        registry.publish(paths, meta, parent=None)
        record = patch(registry, 1, reason="loss spike", by="oncall", **exclusions)
        assert (record.version, record.parent, record.patch_of) == (2, 1, 1)
        # Reference resolution, row by row (fine in a test): which manifest rows go.
        excluded = {
            r
            for r in range(num_rows)
            if f"c{r}" in exclusions["exclude_clip_ids"]
            or f"a{r // 3}" in exclusions["exclude_asset_ids"]
            or r in exclusions["exclude_rows"]
        }
        skipped = read_skipped(registry, 2)
        assert set(skipped.column("row").to_pylist()) == excluded & {r for s in steps for r in s}
        assert skipped.num_rows == sum(1 for s in steps for r in s if r in excluded)
        info = record.snapshot["patch"]
        assert info["reason"] == "loss spike" and info["by"] == "oncall"
        assert info["excluded"]["manifest_rows"] == len(excluded)
        assert set(skipped.column("reason").to_pylist()) <= {"loss spike"}
        check_accounting(registry, 1, 2)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 20), max_size=9), min_size=1, max_size=12),
    st.sets(st.integers(0, 20)),
    st.integers(1, 5),
)
def test_filter_plan_batch(steps: list[list[int]], excluded: set[int], offset: int) -> None:
    skipped_before = [i % 3 for i in range(len(steps))]
    table = pa.table(
        {
            "step": np.arange(len(steps), dtype=np.int64) + 10,
            "phase": np.zeros(len(steps), np.int32),
            "bucket": np.ones(len(steps), np.int32),
            "stream_epochs": pa.array([[0]] * len(steps), pa.list_(pa.int32())),
            "rows": pa.array(steps, pa.list_(pa.int64())),
            "skipped": np.asarray(skipped_before, np.int32),
        },
        schema=PLAN_SCHEMA,
    )
    # A sliced batch: list offsets that do not start at 0 must not matter.
    batch = table.to_batches()[0].slice(min(offset, len(steps) - 1))
    first = len(steps) - batch.num_rows
    out, dropped, at_steps, rows = filter_plan_batch(batch, pa.array(sorted(excluded), pa.int64()))
    expect = [[r for r in s if r not in excluded] for s in steps[first:]]
    assert out.column("rows").to_pylist() == expect
    assert dropped.tolist() == [len(s) - len(e) for s, e in zip(steps[first:], expect, strict=True)]
    assert out.column("skipped").to_pylist() == [
        b + d for b, d in zip(skipped_before[first:], dropped.tolist(), strict=True)
    ]
    assert list(zip(at_steps.tolist(), rows.tolist(), strict=True)) == [
        (first + 10 + i, r) for i, s in enumerate(steps[first:]) for r in s if r in excluded
    ]


def test_a_patch_of_a_patch_accumulates(store: ObjectStore, tmp_path: Path) -> None:
    registry = Registry(store)
    clip_ids = [f"c{r}" for r in range(12)]
    steps = [[(3 * s + k) % 12 for k in range(6)] for s in range(8)]
    paths, meta = make_cut(tmp_path / "cut", clip_ids, steps=steps)
    registry.publish(paths, meta, parent=None)
    registry.publish(paths, meta, parent=1)  # an unrelated later version
    first = patch(registry, 1, exclude_clip_ids=["c0", "c5"], reason="spike A", by="ann")
    assert (first.version, first.parent, first.patch_of) == (3, 2, 1)
    second = patch(registry, 3, exclude_asset_ids=["asset-c7"], exclude_rows=[0], reason="B")
    assert (second.version, second.parent, second.patch_of) == (4, 3, 3)
    check_accounting(registry, 1, 4)
    skipped = read_skipped(registry, 4)
    assert set(skipped.column("clip_id").to_pylist()) == {"c0", "c5", "c7"}
    assert dict(Counter(skipped.column("reason").to_pylist())) == {
        "spike A": read_skipped(registry, 3).num_rows,
        "B": second.snapshot["patch"]["skipped_plan_rows"],
    }
    # Row 0 is clip c0, already skipped by the first patch: nothing is counted twice.
    assert second.snapshot["patch"]["skipped_plan_rows"] == sum(s.count(7) for s in steps)
    shares = second.snapshot["patch"]["skipped_by_stream"]
    assert sum(shares.values()) == second.snapshot["patch"]["skipped_plan_rows"]
    assert set(shares) <= {"main", "aux"}
    # Pinning the patch protects its own plan and skipped list and its base's index.
    registry.pin(4, reason="run resumed on the patch")
    protected = registry.protected_objects()
    assert {ref.sha256 for ref in second.artifacts.values()} <= protected
    assert registry.get(1).artifacts["index.arrow"].sha256 in protected
    assert registry.get(1).artifacts["plan.arrow"].sha256 not in protected


def test_bad_patches_change_nothing(tmp_path: Path) -> None:
    registry = Registry(LocalObjectStore(tmp_path / "store"))
    paths, meta = make_cut(tmp_path / "cut", [f"c{r}" for r in range(6)])
    registry.publish(paths, meta, parent=None)
    bad: list[dict[str, object]] = [
        {"reason": "x"},
        {"reason": " ", "exclude_rows": [1]},
        {"reason": "x", "exclude_clip_ids": ["c1", "typo"]},
        {"reason": "x", "exclude_asset_ids": ["asset-zz"]},
        {"reason": "x", "exclude_rows": [6]},
        {"reason": "x", "exclude_rows": [-1]},
        {"reason": "x", "exclude_clip_ids": "c1"},
    ]
    for kwargs in bad:
        with pytest.raises(InvalidInput):
            patch(registry, 1, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput) as info:
        patch(registry, 1, exclude_clip_ids=["c1", "typo"], reason="x")
    assert info.value.details["unknown"] == ["typo"]
    with pytest.raises(NotFound):
        patch(registry, 2, exclude_rows=[0], reason="x")
    assert registry.versions() == [1]


def test_a_plan_with_the_wrong_schema_is_refused(tmp_path: Path) -> None:
    registry = Registry(LocalObjectStore(tmp_path / "store"))
    paths, meta = make_cut(tmp_path / "cut", [f"c{r}" for r in range(4)])
    bad_plan = tmp_path / "bad.arrow"
    table = pa.table({"step": [0], "rows": [[1, 2]]})
    with pa.OSFile(str(bad_plan), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    registry.publish({**paths, "plan.arrow": bad_plan}, meta, parent=None)
    with pytest.raises(IntegrityError):
        patch(registry, 1, exclude_rows=[1], reason="x")
    assert registry.versions() == [1]


def _served_shares(registry: Registry, version: int) -> dict[str, float]:
    """Share of plan rows per stream, counted from the plan and the index."""
    index = pa.ipc.open_file(pa.BufferReader(registry.read_artifact(version, "index.arrow")))
    stream_of = index.read_all().column("stream").to_pylist()
    names = registry.get(version).snapshot["streams"]
    served = Counter(
        names[stream_of[r]]
        for rows in read_plan(registry, version)["rows"].to_pylist()
        for r in rows
    )
    total = sum(served.values())
    return {n: served[n] / total for n in names}


def test_diff_of_a_patch_reports_what_its_plan_serves(tmp_path: Path) -> None:
    registry = Registry(LocalObjectStore(tmp_path / "store"))
    clip_ids = [f"c{r}" for r in range(12)]
    # Rows 0..9 are served (stream = row % 2); rows 10 and 11 are in the manifest only.
    steps = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 2], [4, 6, 8, 1]]
    paths, meta = make_cut(tmp_path / "cut", clip_ids, steps=steps)
    registry.publish(paths, {**meta, "stream_shares": _served_shares_of(steps)}, parent=None)
    base = registry.get(1).snapshot["stream_shares"]
    record = patch(registry, 1, exclude_clip_ids=["c0", "c2", "c4"], exclude_rows=[11], reason="x")

    diff = registry.diff(1, record.version)
    assert diff.clips_removed == ["c0", "c11", "c2", "c4"] and diff.num_clips_removed == 4
    assert diff.num_clips_added == 0 and diff.num_clips_b == 8
    assert diff.rows == {"a": 12, "b": 8, "delta": -4}
    served = _served_shares(registry, record.version)
    assert served != base
    assert record.snapshot["stream_shares"] == pytest.approx(served)
    assert {k: v["b"] for k, v in diff.stream_shares.items()} == pytest.approx(served)
    new_plan = read_plan(registry, record.version)
    phase0 = [
        len(r)
        for p, r in zip(new_plan["phase"].to_pylist(), new_plan["rows"].to_pylist(), strict=True)
        if p == 0
    ]
    assert record.snapshot["phases"][0]["plan_rows"] == sum(phase0)
    # A patch of the patch keeps what the first excluded, and reasons stay the first's.
    again = patch(registry, record.version, exclude_clip_ids=["c1"], reason="y")
    chained = registry.diff(1, again.version)
    assert chained.clips_removed == ["c0", "c1", "c11", "c2", "c4"]
    assert registry.diff(record.version, again.version).clips_removed == ["c1"]


def _served_shares_of(steps: list[list[int]]) -> dict[str, float]:
    served = Counter(("main", "aux")[r % 2] for rows in steps for r in rows)
    total = sum(served.values())
    return {n: served[n] / total for n in ("main", "aux")}
