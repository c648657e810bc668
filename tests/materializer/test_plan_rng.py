"""The plan's sorts by mix: :func:`mix_order` is exactly ``argsort(mix(keys))``, ties
of the packed high bits included."""

from __future__ import annotations

import numpy as np
import pytest

from materializer.plan.rng import mix, mix_order, packed_order


@pytest.mark.parametrize("n", [1, 2, 3, 64, 1000, 1024, 1025, 5000, 70_000])
def test_mix_order_is_the_argsort_of_the_mixed_keys(n: int) -> None:
    rows = max(1, 200_000 // n)
    keys = np.arange(rows * n, dtype=np.uint64).reshape(rows, n) + np.uint64(0xDEADBEEF)
    want = np.argsort(mix(keys.copy()), axis=1)
    got = mix_order(keys.copy())
    assert got.dtype == np.int64 and np.array_equal(got, want)


@pytest.mark.parametrize("width", [32, 64])
def test_ties_of_the_high_bits_are_ordered_by_the_full_key(width: int) -> None:
    """Keys whose high bits collide in most rows (a few distinct tops, distinct
    bottoms): every row that the packed sort would order by slot is argsorted."""
    rng = np.random.default_rng(5)
    n, rows = 300, 400
    top = rng.integers(0, 4, (rows, n)).astype(np.uint64) << np.uint64(60)
    slots = np.tile(np.arange(n, dtype=np.uint64) * np.uint64(7919), (rows, 1))
    low = rng.permuted(slots, axis=1)
    h = top | low  # distinct per row; high 32 (or 55) bits tie within each top
    assert np.array_equal(packed_order(h, width), np.argsort(h, axis=1))


def test_a_row_longer_than_the_pack_falls_back_to_argsort() -> None:
    h = mix(np.arange(3 * 70_000, dtype=np.uint64).reshape(3, 70_000))
    assert np.array_equal(packed_order(h, 16), np.argsort(h, axis=1))
