"""The cut's artifact stages: the plan, the index and lineage on a side thread,
overlapped with the manifest and quality; on a process pool by step range; the same
bytes."""

from __future__ import annotations

import gc
import hashlib
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from catalog.catalog import VidlakeCatalog
from materializer import cut
from materializer import cut_artifacts as artifacts
from materializer.cut import build_artifacts
from materializer.executors import LocalExecutor
from materializer.recipe import Recipe
from materializer.select import Execution, Selection
from tests.materializer.test_cut import DATA_ARTIFACTS, lake, recipe

__all__ = ["lake", "recipe"]  # fixtures


def _digests(artifacts: dict[str, Path]) -> dict[str, str]:
    return {k: hashlib.sha256(artifacts[k].read_bytes()).hexdigest() for k in DATA_ARTIFACTS}


def test_progress_comes_from_the_calling_thread_each_stage_opened_then_closed(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan is written on a side thread (overlapping the index and manifest), but
    every progress report comes from the caller's thread, each stage opened first."""
    catalog, _ = lake
    planned_on: list[int] = []
    real = artifacts.write_plan  # type: ignore[attr-defined]

    def spy(*args: object, **kwargs: object) -> object:
        planned_on.append(threading.get_ident())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts, "write_plan", spy)
    indexed_on: list[int] = []
    real_table = artifacts.write_table  # type: ignore[attr-defined]

    def table_spy(path: Path, *args: object, **kwargs: object) -> None:
        if path.name == "index.arrow":
            indexed_on.append(threading.get_ident())
        real_table(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts, "write_table", table_spy)
    calls: list[tuple[str, float, int]] = []
    build_artifacts(
        catalog, recipe, tmp_path, progress=lambda s, f: calls.append((s, f, threading.get_ident()))
    )
    assert {t for _, _, t in calls} == {threading.get_ident()}
    assert planned_on and threading.get_ident() not in planned_on
    # The index goes to the side thread too, behind the plan: the threads' CPU evens out.
    assert indexed_on == planned_on
    opened: dict[str, int] = {}
    for i, (stage, fraction, _) in enumerate(calls):
        if fraction == 0.0:
            opened[stage] = i
        elif fraction >= 1.0:
            assert stage in opened, f"{stage} closed before it opened"
    expected = {"pin", "scatter", "plan", "index", "manifest", "quality", "lineage"}
    assert expected <= {s for s, f, _ in calls if f >= 1.0}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".plan-ranges-", "lineage"))
                and p.is_dir()]  # fmt: skip


@pytest.mark.slow
def test_a_plan_on_a_process_pool_gives_the_same_artifacts(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    catalog, _ = lake
    one, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "one"))
    monkeypatch.setattr(artifacts, "PARALLEL_PLAN_ROWS", 0)
    calls: list[int] = []
    real = artifacts.write_plan  # type: ignore[attr-defined]

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(int(kwargs["workers"]))  # type: ignore[call-overload]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts, "write_plan", spy)
    pooled, _ = build_artifacts(
        catalog, recipe, _mkdir(tmp_path / "pool"), execution=Execution(LocalExecutor(2))
    )
    assert calls == [2]
    assert _digests(pooled) == _digests(one)


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def test_the_plan_does_not_wait_for_the_scatter_of_every_column(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The side thread's plan runs before this thread has scattered the samples (the
    index and lineage are queued after it): it reads nothing this thread has yet to
    compute."""
    catalog, _ = lake
    one, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "one"))
    planned = threading.Event()
    real_plan, real_rows = artifacts.write_named_plan, artifacts.with_rows
    calls = []

    def plan(*args: object, **kwargs: object) -> object:
        try:
            return real_plan(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            planned.set()

    def rows(table: object) -> object:
        calls.append(table)
        if len(calls) == 2:  # the full scatter: let the plan finish first
            assert planned.wait(60)
            time.sleep(0.3)
        return real_rows(table)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts, "write_named_plan", plan)
    monkeypatch.setattr(artifacts, "with_rows", rows)
    late, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "late"))
    assert len(calls) == 2
    assert _digests(late) == _digests(one)


@pytest.mark.parametrize("partitions", [None, 3])
def test_the_sorted_samples_are_dropped_once_scattered(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    partitions: int | None,
) -> None:
    """The driver does not hold every kept row twice: by the quality stage (after the
    manifest) the selection's sorted samples are gone, only the scattered copy is
    left (one process; partitioned, where the streaming keeps three narrow columns)."""
    catalog, _ = lake
    sorted_refs: list[weakref.ref[pa.Table]] = []
    selections: list[Selection] = []
    real_select = cut.select

    def selected(*args: Any, **kwargs: Any) -> Selection:
        selection = real_select(*args, **kwargs)
        sorted_refs.append(weakref.ref(selection.samples))
        selections.append(selection)
        return selection

    alive: list[bool] = []
    real_quality = artifacts.cut_quality

    def quality(*args: Any, **kwargs: Any) -> Any:
        gc.collect()
        # Neither the table nor a view of its buffers (an empty slice keeps them all).
        alive.append(sorted_refs[0]() is not None)
        alive.append(selections[0].samples.get_total_buffer_size() > 1024)
        return real_quality(*args, **kwargs)

    monkeypatch.setattr(cut, "select", selected)
    monkeypatch.setattr(artifacts, "cut_quality", quality)
    execution = None if partitions is None else Execution(LocalExecutor(1), partitions)
    paths, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "cut"), execution=execution)
    assert alive == [False, False]
    one, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "one"))
    assert _digests(paths) == _digests(one)


def test_a_partitioned_driver_measures_quality_from_the_written_manifest(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partitioned driver never gathers its samples in manifest order: the quality
    report reads the rows the plan draws from the written manifest, and the driver
    columns carry no quality key but the asset id (the snapshot's count); the same
    bytes as the one-process cut, which measures its table."""
    from materializer.partition_merge import driver_columns

    catalog, _ = lake
    measured: list[Any] = []
    real_quality = artifacts.cut_quality

    def quality(recipe: Recipe, plan: Path, samples: Any, out: Path, **kwargs: Any) -> Any:
        measured.append(samples)
        return real_quality(recipe, plan, samples, out, **kwargs)

    monkeypatch.setattr(artifacts, "cut_quality", quality)
    execution = Execution(LocalExecutor(1), 3)
    paths, snap = build_artifacts(catalog, recipe, _mkdir(tmp_path / "cut"), execution=execution)
    one, one_snap = build_artifacts(catalog, recipe, _mkdir(tmp_path / "one"))
    assert measured[0] == paths["manifest.parquet"] and isinstance(measured[1], pa.Table)
    assert not {"source", "cluster", "asset_id"} & set(driver_columns(recipe))
    assert _digests(paths) == _digests(one)
    assert snap["counts"] == one_snap["counts"] and snap["quality"] == one_snap["quality"]


def test_the_pools_and_the_permutation_go_before_they_are_idle(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partitioned driver streams the index and manifest holding one permutation
    (each sorted sample's manifest row), not it and the scatter order, and the plan's
    pools go once the plan is written, not at the end of the cut."""
    import numpy as np

    catalog, _ = lake
    orders: list[weakref.ref[Any]] = []
    pools: list[weakref.ref[Any]] = []
    real_order, real_specs = artifacts.scatter_order, artifacts.phase_specs

    def scatter_order(n: int, seed: int) -> Any:
        order = real_order(n, seed)
        orders.append(weakref.ref(order))
        return order

    def phase_specs(*args: Any) -> Any:
        specs = real_specs(*args)
        pools.extend(weakref.ref(a) for s in specs for a in (s.pool.row, s.pool.tokens))
        return specs

    alive: dict[str, bool] = {}
    real_stream, real_quality = artifacts.stream_artifacts, artifacts.cut_quality

    def stream(parts: Any, selected: Any, dest: Any, **kwargs: Any) -> Any:
        gc.collect()
        alive["order while streaming"] = orders[0]() is not None
        assert isinstance(dest, np.ndarray) and dest.size == selected.num_rows
        return real_stream(parts, selected, dest, **kwargs)

    def quality(*args: Any, **kwargs: Any) -> Any:
        gc.collect()
        alive["pools after the plan"] = any(p() is not None for p in pools)
        return real_quality(*args, **kwargs)

    monkeypatch.setattr(artifacts, "scatter_order", scatter_order)
    monkeypatch.setattr(artifacts, "phase_specs", phase_specs)
    monkeypatch.setattr(artifacts, "stream_artifacts", stream)
    monkeypatch.setattr(artifacts, "cut_quality", quality)
    execution = Execution(LocalExecutor(1), 3)
    paths, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "cut"), execution=execution)
    assert pools and alive == {"order while streaming": False, "pools after the plan": False}
    one, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "one"))
    assert _digests(paths) == _digests(one)


def test_selection_takes_the_merged_candidates_so_each_drop_replaces_them(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drops after the join filter the candidates into new tables; the merged
    table is not kept beside them until selection returns."""
    from materializer import select as sel
    from materializer.cut import checked_pin

    catalog, _ = lake
    merged: list[weakref.ref[pa.Table]] = []
    real_candidates, real_gate = sel._candidates, sel._phase_gate

    def candidates(*args: Any, **kwargs: Any) -> Any:
        found = real_candidates(*args, **kwargs)
        merged.append(weakref.ref(found.kept))
        return found

    seen: list[bool] = []

    def gate(recipe: Recipe, table: pa.Table, drops: dict[str, int]) -> pa.Table:
        gc.collect()
        seen.append(merged[0]() is not None and merged[0]() is not table)
        return real_gate(recipe, table, drops)

    monkeypatch.setattr(sel, "_candidates", candidates)
    monkeypatch.setattr(sel, "_phase_gate", gate)
    selection = sel.select(catalog, recipe, checked_pin(catalog, recipe, None))
    assert selection.drops and seen == [False]
    selection.close()


def test_the_one_process_cut_gathers_the_wide_columns_once(
    lake: tuple[VidlakeCatalog, Path],
    recipe: Recipe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Selection's sorted samples hold only the narrow columns it reads (the wide ones
    stay in the query's rows until the scatter gathers them into manifest order), the
    query's rows are dropped once gathered, and the artifacts equal those cut from the
    full sorted samples (decision 063)."""
    catalog, _ = lake
    real_select = cut.select
    seen: list[tuple[list[str], bool]] = []
    selections: list[Selection] = []

    def full(*args: Any, **kwargs: Any) -> Selection:
        return real_select(*args, **{**kwargs, "narrow": False})

    monkeypatch.setattr(cut, "select", full)
    wide, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "wide"))

    def narrow(*args: Any, **kwargs: Any) -> Selection:
        selection = real_select(*args, **kwargs)
        seen.append((selection.samples.column_names, selection.rows is not None))
        selections.append(selection)
        return selection

    monkeypatch.setattr(cut, "select", narrow)
    once, _ = build_artifacts(catalog, recipe, _mkdir(tmp_path / "once"))
    ((columns, has_rows),) = seen
    assert has_rows
    assert "object_sha256" not in columns and "captions" not in columns
    assert {"rung", "clip_id", "stream", "_at"} <= set(columns)
    assert selections[0].rows is None  # gathered, then dropped
    assert _digests(once) == _digests(wide)
