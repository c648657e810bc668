"""The plan generated per step range on an executor: the same bytes as one process.

``write_plan(executor=..., workers=N)`` cuts every ``num_steps`` phase into N ranges
of whole chunks; each range seeks the phase's state (bucket schedule, pool walks)
without generating the steps before it. The bytes must not depend on N.
"""

from __future__ import annotations

import hashlib
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.errors import InvalidInput, InvalidRecipe
from materializer.executors import LocalExecutor
from materializer.plan import PhaseSpec, Pool, write_plan
from materializer.plan.draw import PoolWalk
from materializer.plan.layout import PhaseModel
from materializer.plan.rng import TAG_EPOCH, derive
from materializer.plan.steps import phase_chunks

from .test_plan import phase_specs, small_pool_phases

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
IN_PROCESS = LocalExecutor(1)  # runs every range here, in order: the split is what is tested


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(
    path: Path, specs: list[PhaseSpec], workers: int, batch_rows: int
) -> tuple[str, dict[str, Any]]:
    executor = IN_PROCESS if workers > 1 else None
    summary = write_plan(
        path, specs, seed=5, batch_rows=batch_rows, executor=executor, workers=workers
    )
    return _sha(path), summary.to_dict()


def _mixed_phases() -> list[PhaseSpec]:
    """A steps phase, a token-budget phase, a steps phase with tiny pools that repeat
    rows in a step (pools smaller than a step's draw: no seek shortcut)."""
    i = np.arange(3000)
    big = Pool(row=i, stream=i % 3, bucket=(i // 3) % 2, tokens=10 + i % 7)
    j = np.arange(20)
    tiny = Pool(row=j, stream=j % 2, bucket=np.zeros_like(j), tokens=5 + j % 3)
    return [
        PhaseSpec(0, big, {0: 64, 1: 32}, {0: 0.5, 1: 0.3, 2: 0.2}, num_steps=700),
        PhaseSpec(1, big, {0: 32, 1: 64}, {0: 0.2, 2: 0.8}, token_budget=400_000),
        PhaseSpec(2, tiny, {0: 16}, {0: 0.7, 1: 0.3}, num_steps=300, allow_repeats_in_step=True),
    ]


@pytest.mark.parametrize("batch_rows", [1 << 20, 2_000])
def test_ranges_give_the_same_bytes_for_every_worker_count(tmp_path: Path, batch_rows: int) -> None:
    specs = _mixed_phases()
    one = _write(tmp_path / "one.arrow", specs, 1, batch_rows)
    for workers in (2, 3, 16):
        assert _write(tmp_path / f"w{workers}.arrow", specs, workers, batch_rows) == one
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".plan-ranges-")]


@pytest.mark.slow
@SETTINGS
@given(
    spec=st.one_of(phase_specs(), small_pool_phases()),
    workers=st.integers(2, 7),
    batch_rows=st.sampled_from([1, 7, 64, 1 << 20]),
)
def test_random_phases_split_anywhere(
    tmp_path: Path, spec: PhaseSpec, workers: int, batch_rows: int
) -> None:
    try:
        one = _write(tmp_path / "one.arrow", [spec], 1, batch_rows)
    except InvalidRecipe as exc:  # a pool below its quota: refused the same way
        with pytest.raises(InvalidRecipe, match=re.escape(exc.message)):
            _write(tmp_path / "many.arrow", [spec], workers, batch_rows)
        return
    assert _write(tmp_path / "many.arrow", [spec], workers, batch_rows) == one


@pytest.mark.slow
@SETTINGS
@given(spec=st.one_of(phase_specs(), small_pool_phases()), data=st.data())
def test_seek_leaves_the_state_the_steps_leave(spec: PhaseSpec, data: st.DataObject) -> None:
    """Steps generated after ``seek(s)`` equal steps ``s..`` of a whole run."""
    if spec.num_steps is None:
        spec = PhaseSpec(0, spec.pool, dict(spec.global_batch), dict(spec.stream_weights),
                         num_steps=200, allow_repeats_in_step=True)  # fmt: skip
    assert spec.num_steps is not None
    try:
        model = PhaseModel(spec)
    except InvalidRecipe:
        return
    whole = np.concatenate([c.rows for c in phase_chunks(model, 9, 4, 0, 1, 1)])
    offsets = np.concatenate(
        [c.offsets[:-1] + c.offsets.dtype.type(0) for c in phase_chunks(model, 9, 4, 0, 1, 1)]
    )
    skip = data.draw(st.integers(0, spec.num_steps - 1))
    tail = list(phase_chunks(model, 9, 4, 0, 1, 1, skip=skip, count=spec.num_steps - skip))
    assert tail[0].first_step == skip
    got = np.concatenate([c.rows for c in tail])
    sizes = np.array([c.offsets[-1] for c in phase_chunks(model, 9, 4, 0, 1, 1)])
    start = int(sizes[:skip].sum())
    np.testing.assert_array_equal(got, whole[start:])
    assert offsets.size == spec.num_steps


def test_replay_matches_a_walk_that_drew_every_step() -> None:
    """A pool of 50 rows drawn 13-17 at a time: epochs start inside steps, so their
    heads are reordered; a walk put at any step by ``replay_from`` draws what the
    walk that drew every step draws next."""
    rng = np.random.default_rng(1)
    counts = rng.integers(13, 18, 40)
    rows = np.arange(100, 150)
    base = derive(3, TAG_EPOCH, 0, 1, 2)
    full = PoolWalk(rows, rows, base)
    drawn = [full.draw(counts[i : i + 1])[0] for i in range(counts.size)]
    cum = np.r_[0, np.cumsum(counts)]
    for j in range(counts.size):
        walk = PoolWalk(rows, rows, base)
        walk.replay_from(cum[: j + 1], quota=17)
        assert walk.drawn == cum[j]
        np.testing.assert_array_equal(walk.draw(counts[j:])[0], np.concatenate(drawn[j:]))


def test_a_pickled_spec_keeps_its_exact_weights() -> None:
    """Workers get the checked spec: weights are not normalised a second time."""
    # Normalised once these sum to 0.9999999999999999: a second pass would move them.
    weights = {0: 0.8102172359965896, 1: 0.9021659504395827, 2: 0.3101475693193326}
    spec = PhaseSpec(0, Pool(row=np.arange(6), stream=np.arange(6) % 3,
                             bucket=np.zeros(6, dtype=np.int64), tokens=np.ones(6, dtype=np.int64)),
                     {0: 3}, weights, num_steps=2)  # fmt: skip
    again = pickle.loads(pickle.dumps(spec))
    assert dict(again.stream_weights) == dict(spec.stream_weights)
    assert dict(again.global_batch) == {0: 3} and again.num_steps == 2
    np.testing.assert_array_equal(again.pool.row, spec.pool.row)


def test_workers_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="workers"):
        write_plan(tmp_path / "p.arrow", _mixed_phases(), seed=1, executor=IN_PROCESS, workers=0)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_process_pool_gives_the_same_bytes(tmp_path: Path) -> None:
    specs = _mixed_phases()
    one = _write(tmp_path / "one.arrow", specs, 1, 5_000)
    summary = write_plan(
        tmp_path / "pool.arrow", specs, seed=5, batch_rows=5_000, executor=LocalExecutor(2),
        workers=2,
    )  # fmt: skip
    assert (_sha(tmp_path / "pool.arrow"), summary.to_dict()) == one
