"""Deferring an old epoch's tail in the next epoch's head (materializer/plan/draw.py).

Checked on the walk alone, where the draw order is visible (the plan shuffles each
step): every step window of the walk holds ``min(c, n)`` distinct rows, every epoch is
a permutation, positions past the reordered prefix are untouched, a deferred row moves
back by fewer than ``c``, and the one-pass form equals applying boundaries one by one.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from materializer.plan.draw import Boundaries, defer_tails, step_boundaries


def _epochs(rng: np.random.Generator, n: int, count: int) -> np.ndarray:
    return np.argsort(rng.random((count, n)), axis=1).astype(np.int64)


def _walk(n: int, counts: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Original and deferred epochs covering ``counts``, drawn in one call."""
    total = int(counts.sum())
    epochs = -(-total // n)
    original = _epochs(np.random.default_rng(seed), n, epochs)
    perms = original.copy()
    bounds = step_boundaries(0, counts, n)
    defer_tails(perms[1:], perms[0], 1, bounds.select(1, epochs))
    return original, perms


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 30),
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=60),
    seed=st.integers(0, 2**32 - 1),
)
def test_steps_hold_no_row_twice_and_epochs_stay_permutations(
    n: int, counts: list[int], seed: int
) -> None:
    c = np.array(counts, dtype=np.int64)
    if not c.sum():
        return
    original, perms = _walk(n, c, seed)
    assert (np.sort(perms, axis=1) == np.arange(n)).all()  # exactly once per epoch
    walk = perms.reshape(-1)
    ends = np.cumsum(c)
    for lo, hi in zip((ends - c).tolist(), ends.tolist(), strict=True):
        step = walk[lo:hi]
        assert np.unique(step).size == min(hi - lo, n), (lo, hi, step)
    # A deferred row moves back by fewer than the step's draw; rows past the step's
    # share of the new epoch move forward at most by the tail's length.
    where_orig = np.argsort(original, axis=1)
    where_new = np.argsort(perms, axis=1)
    shift = where_new - where_orig
    assert shift.max(initial=0) < max(int(c.max()), 1)
    assert -shift.min(initial=0) < max(int(c.max()), 1)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 40),
    counts=st.lists(st.integers(1, 25), min_size=2, max_size=80),
    seed=st.integers(0, 2**32 - 1),
)
def test_one_pass_equals_one_boundary_at_a_time(n: int, counts: list[int], seed: int) -> None:
    c = np.array(counts, dtype=np.int64)
    epochs = -(-int(c.sum()) // n)
    base = _epochs(np.random.default_rng(seed), n, epochs)
    bounds = step_boundaries(0, c, n)
    together = base.copy()
    defer_tails(together[1:], together[0], 1, bounds.select(1, epochs))
    single = base.copy()
    for e in bounds.epoch.tolist():
        defer_tails(single[e : e + 1], single[e - 1], e, bounds.select(e, e + 1))
    assert np.array_equal(together, single)


def test_prefix_is_a_stable_partition() -> None:
    """Tail rows 7, 3 sit in the new head; the first two rows outside the tail come
    first in their order, the tail's rows follow in theirs, the rest is untouched."""
    prev = np.array([0, 1, 2, 4, 5, 6, 7, 3], dtype=np.int64)  # tail [6:] = {7, 3}
    perms = np.array([[7, 3, 0, 1, 2, 4, 5, 6]], dtype=np.int64)
    bounds = Boundaries(np.array([1]), np.array([6]), np.array([2]))
    defer_tails(perms, prev, 1, bounds)
    assert perms.tolist() == [[0, 1, 7, 3, 2, 4, 5, 6]]


def test_boundaries_are_strictly_inside_two_epoch_steps() -> None:
    n = 5
    # Steps: [0,3) [3,6) crosses 5; [6,10) inside; [10,13) starts on 10; [13,20)
    # crosses 15 with tail 2, head 5 > n - 2 (defer what can be); [20,32) holds a whole
    # epoch (no boundary kept); [32,35) crosses 35? no: ends on it.
    counts = np.array([3, 3, 4, 3, 7, 12, 3, 0], dtype=np.int64)
    b = step_boundaries(0, counts, n)
    assert b.epoch.tolist() == [1, 3]
    assert b.tail_start.tolist() == [3, 3]
    assert b.head.tolist() == [1, 5]
    later = step_boundaries(32, np.array([4]), n)  # continues a walk mid-epoch
    assert later.epoch.tolist() == [7] and later.tail_start.tolist() == [2]
    assert later.head.tolist() == [1]


def test_long_chains_of_dependent_boundaries() -> None:
    """Pools barely larger than a step's draw (n < 2c): nearly every boundary reads the
    one before it, in long runs broken here and there; one pass with redos equals
    one boundary at a time."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(3, 30))
        c = rng.integers(max(1, n // 2), n + 1, size=int(rng.integers(20, 200))).astype(np.int64)
        epochs = -(-int(c.sum()) // n)
        base = _epochs(rng, n, epochs)
        bounds = step_boundaries(0, c, n)
        together = base.copy()
        defer_tails(together[1:], together[0], 1, bounds.select(1, epochs))
        single = base.copy()
        for e in bounds.epoch.tolist():
            defer_tails(single[e : e + 1], single[e - 1], e, bounds.select(e, e + 1))
        assert np.array_equal(together, single), (n, c.tolist())
