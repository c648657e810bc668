"""The one-process cut's kept rows gathered once (materializer/kept_rows.py): the
narrow sorted rows, then the wide columns gathered straight into manifest order,
equal the full sorted table scattered, on the integer-key and string-sort paths."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from materializer.kept_rows import AT, gather_scattered, sorted_narrow
from materializer.partition import _kept_sorted


def _ids(values: list[int]) -> list[str]:
    return [f"{v:064x}" for v in values]


def test_narrow_rows_gathered_into_manifest_order_equal_the_sorted_rows_scattered() -> None:
    rng = np.random.default_rng(63)
    n = 5000
    for clip_id in (_ids(rng.permutation(n).tolist()), _ids(rng.integers(0, 4000, n).tolist())):
        rows = pa.Table.from_batches(
            pa.table(
                {
                    "clip_id": clip_id,
                    "rung": rng.choice(["256p", "512p"], n),
                    "wide": [f"text {i}" for i in range(n)],
                    "tokens": np.arange(n, dtype=np.int64),
                }
            ).to_batches(max_chunksize=700)
        )
        keep = pa.chunked_array([rng.random(n) < 0.6])
        full = _kept_sorted(rows, keep)
        narrow = sorted_narrow(rows, keep, ("rung", "clip_id", "tokens"))
        assert narrow.column_names == ["clip_id", "rung", "tokens", AT]
        assert narrow.drop_columns([AT]).equals(full.select(["clip_id", "rung", "tokens"]))
        # Selection drops rows and adds ``bucket`` to its narrow rows: both carry over.
        bucket = pa.array(rng.integers(0, 4, narrow.num_rows), pa.int32())
        later = pc.greater(narrow["tokens"], 100)
        narrow = narrow.append_column("bucket", bucket).filter(later)
        full = full.append_column("bucket", bucket).filter(later)
        order = pa.array(rng.permutation(narrow.num_rows))
        assert gather_scattered(rows, narrow, order).equals(full.take(order))
