"""Key digests and their order: the vectorised paths agree with the one-key rule."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.key_index_rows import digests, heads, packed_digests

_HEXISH = st.text(alphabet="0123456789abcdefABg\x1f", min_size=31, max_size=33)
_IDS = st.one_of(
    st.none(),
    _HEXISH,
    st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
)


@given(st.lists(_IDS, max_size=40), st.integers(0, 3))
@settings(max_examples=150, deadline=None)
def test_packed_digests_are_digests_of_any_column(keys: list[str | None], cut: int) -> None:
    arr = pa.array(keys, pa.large_string()).slice(min(cut, len(keys)))
    values = arr.to_pylist()
    present = [i for i, k in enumerate(values) if k is not None]
    want = dict(zip(present, digests(pa.array([values[i] for i in present])), strict=True))
    got: dict[int, bytes] = {}
    for group in packed_digests(arr):
        for j, row in enumerate(group.rows.tolist()):
            got[row] = group.data[j * group.width : (j + 1) * group.width]
    assert got == want


@given(st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=60))
@settings(max_examples=80, deadline=None)
def test_sorted_puts_keys_in_head_order_with_their_rows(keys: list[bytes]) -> None:
    arr = pa.array([k.hex() for k in keys], pa.large_string())
    (group,) = packed_digests(arr)
    ordered = group.sorted()
    head = heads(np.frombuffer(ordered.data, np.uint8).reshape(-1, 16))
    assert (head[1:] >= head[:-1]).all()
    rows = ordered.rows.tolist()
    assert [ordered.data[j * 16 : (j + 1) * 16] for j in range(len(rows))] == [
        keys[r] for r in rows
    ]
    assert sorted(rows) == list(range(len(keys)))
