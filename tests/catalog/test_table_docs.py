"""catalog.table_docs: every column of every table described, and the examples are
rows the catalog's own checks accept."""

from __future__ import annotations

import pytest

from catalog.coerce import coerce_batch
from catalog.rules import clip_id
from catalog.table_docs import COLUMNS, TABLE_DESCRIPTIONS, example_row
from catalog.tables import TABLES, arrow_schema


@pytest.mark.parametrize("table", list(TABLES))
def test_every_column_is_described_in_table_order(table: str) -> None:
    names = [f.name for f in arrow_schema(TABLES[table].schema)]
    assert list(COLUMNS[table]) == names
    assert TABLE_DESCRIPTIONS[table].strip()
    assert all(col.description.strip() for col in COLUMNS[table].values())


@pytest.mark.parametrize("table", list(TABLES))
def test_example_row_passes_the_ingest_checks(table: str) -> None:
    row = example_row(table)
    got = coerce_batch(TABLES[table], [row])
    assert got.num_rows == 1
    for name, value in row.items():
        if name != "fingerprint" and not name.endswith("_at"):
            assert got[name][0].as_py() == value, name


def test_example_corpus_is_consistent() -> None:
    clip = example_row("clips")
    expected = clip_id(clip["asset_id"], clip["t_start_s"], clip["t_end_s"], clip["split_version"])
    assert COLUMNS["clips"]["clip_id"].example == expected
    assert example_row("assets")["asset_id"] == clip["asset_id"]
    for table in ("latents", "scores", "captions", "embeddings"):
        assert example_row(table)["clip_id"] == expected


def test_required_columns_have_an_example_in_the_row() -> None:
    for table, tdef in TABLES.items():
        filled = set(tdef.derived) | set(tdef.defaults) | {tdef.time_column}
        for fld in arrow_schema(tdef.schema):
            if not fld.nullable and fld.name not in filled:
                assert fld.name in example_row(table), (table, fld.name)
