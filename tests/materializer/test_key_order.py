"""The integer ``(rung, clip_id)`` order (materializer/key_order.py) against Arrow's
stable string sort, and ``_kept_sorted`` with it on hex clip ids."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from materializer.key_order import rung_clip_order
from materializer.partition import _kept_sorted


def _ids(values: list[int]) -> list[str]:
    return [hashlib.sha256(str(v).encode()).hexdigest() for v in values]


def _reference(rung: pa.Array, clip_id: pa.Array) -> list[int]:
    table = pa.table({"rung": rung, "clip_id": clip_id})
    keys = [("rung", "ascending"), ("clip_id", "ascending")]
    return list(pc.sort_indices(table, sort_keys=keys).to_pylist())


def test_hex_ids_over_several_rungs_sort_as_their_text() -> None:
    """Rungs whose text order is not their numeric order ("1024p" < "256p"), ids
    from one hash: the fast order is Arrow's, and it is used (not None)."""
    rng = np.random.default_rng(5)
    n = 4000
    rung = pa.array(rng.choice(["512p", "256p", "1024p"], n))
    clip_id = pa.array(_ids(rng.permutation(n).tolist()))
    order = rung_clip_order(rung, pa.chunked_array([clip_id[:1500], clip_id[1500:]]))
    assert order is not None
    assert order.tolist() == _reference(rung, clip_id)


def test_equal_leading_bytes_fall_back_to_the_strings() -> None:
    """Two ids of one rung that share their leading 8 bytes (a clip twice, or ids
    differing only late) cannot be ordered by the integer key: None."""
    base = _ids([1, 2, 3])
    late = base[0][:-1] + ("0" if base[0][-1] != "0" else "1")
    rung = pa.array(["256p"] * 4)
    assert rung_clip_order(rung, pa.array([base[0], base[1], late, base[2]])) is None
    assert rung_clip_order(rung, pa.array([base[0], base[1], base[0]])) is None
    # The same id at two rungs is two keys: still ordered by the integer key.
    two = pa.array(["512p", "256p"])
    assert rung_clip_order(two, pa.array([base[0], base[0]])) is not None


def test_ids_that_are_not_lowercase_hex_fall_back() -> None:
    rung = pa.array(["256p"] * 2)
    assert rung_clip_order(rung, pa.array(["ABCDEF0123456789", "abcdef0123456789"])) is None
    assert rung_clip_order(rung, pa.array(["0011", "0022"])) is None  # under 8 bytes
    assert rung_clip_order(rung, pa.array([_ids([1])[0], None])) is None
    assert rung_clip_order(pa.array(["256p", None]), pa.array(_ids([1, 2]))) is None


def test_kept_rows_with_hex_ids_equal_a_filter_then_a_stable_sort() -> None:
    """``_kept_sorted`` on hex ids (the integer path) and with a repeated key (the
    string path) equals a filter then a stable sort by ``(rung, clip_id)``."""
    rng = np.random.default_rng(9)
    n = 6000
    ids = _ids(rng.integers(0, 5000, n).tolist())  # repeats: the string path
    for clip_id in (_ids(rng.permutation(n).tolist()), ids):
        table = pa.Table.from_batches(
            pa.table(
                {
                    "rung": rng.choice(["256p", "512p", "1024p"], n),
                    "clip_id": clip_id,
                    "value": np.arange(n),
                }
            ).to_batches(max_chunksize=900)
        )
        keep = pa.chunked_array([rng.random(n) < 0.7])
        keys = [("rung", "ascending"), ("clip_id", "ascending")]
        assert _kept_sorted(table, keep).equals(table.filter(keep).sort_by(keys))


def test_distinct_clips_of_sorted_unsorted_and_multi_rung_samples() -> None:
    """The snapshot's clip count by neighbours where the selection's ids never
    decrease (repeats counted once); None where it cannot tell (two rungs, rows out
    of order, one row), which the caller hashes."""
    from materializer.cut import sorted_distinct_clips

    ids = sorted(_ids([1, 1, 2, 3, 3, 3, 4]))
    one = pa.table({"rung": ["256p"] * len(ids), "clip_id": ids})
    assert sorted_distinct_clips(one) == 4
    two = pa.table({"rung": ["256p"] * 3 + ["512p"] * 3, "clip_id": ids[:3] + ids[:3]})
    assert sorted_distinct_clips(two) is None
    assert sorted_distinct_clips(one.take(pa.array([6, 0, 5, 1, 4, 2, 3]))) is None
    assert sorted_distinct_clips(one.slice(0, 1)) is None
    assert sorted_distinct_clips(one.select(["rung"])) is None


def test_take_wide_equals_take_with_repeated_names_and_chunks() -> None:
    """The two-thread gather gives ``Table.take``'s table: every column in place,
    the schema (metadata, a repeated name) kept, on chunked input."""
    from materializer.gather import take_wide

    rng = np.random.default_rng(4)
    n = 70_000
    table = pa.Table.from_batches(
        pa.table(
            {
                "a": np.arange(n),
                "s": pa.array([str(i) for i in range(n)]),
                "l": pa.array([[str(i)] * (i % 3) for i in range(n)]),
                "f": rng.random(n),
            }
        ).to_batches(max_chunksize=9000)
    )
    table = table.append_column("a", pa.array(np.arange(n) * 2))
    table = table.replace_schema_metadata({b"k": b"v"})
    idx = pa.array(rng.permutation(n)[: n - 3])
    got = take_wide(table, idx)
    assert got.equals(table.take(idx))
    assert got.schema.metadata == {b"k": b"v"}


def test_sliced_and_large_string_ids_key_as_their_text() -> None:
    """A sliced id column (its offsets start past zero) and a large_string one key
    the rows they hold."""
    from materializer.key_order import hex_prefix_key

    ids = pa.array(_ids(list(range(50))))
    want = [int(i[:16], 16) for i in ids.to_pylist()[7:]]
    for column in (ids.slice(7), pa.chunked_array([ids.slice(7, 10), ids.slice(17)])):
        key = hex_prefix_key(column)
        assert key is not None and key.tolist() == want
    large = hex_prefix_key(ids.cast(pa.large_string()).slice(7))
    assert large is not None and large.tolist() == want
