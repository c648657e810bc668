"""Batch coercion of producer tables (:func:`catalog.coerce.coerce_batch`)."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from catalog.coerce import coerce_batch
from catalog.errors import InvalidBatch
from catalog.tables import TABLES

ASSET_ID = hashlib.sha256(b"tables").hexdigest()


def _asset(**extra: pa.Array) -> dict[str, pa.Array]:
    return {
        "asset_id": pa.array([ASSET_ID]),
        "uri": pa.array(["s3://raw/a.mp4"]),
        "size": pa.array([10]),
        "source_tier": pa.array(["crawl"]),
        **extra,
    }


def test_a_repeated_column_is_an_invalid_batch_naming_it() -> None:
    cols = _asset()
    other = pa.array([hashlib.sha256(b"other").hexdigest()])
    table = pa.Table.from_arrays([*cols.values(), other], names=[*cols, "asset_id"])
    with pytest.raises(InvalidBatch, match="given twice") as err:
        coerce_batch(TABLES["assets"], table)
    assert err.value.details["field"] == "asset_id"


def test_a_probe_struct_next_to_its_flattened_column_is_refused() -> None:
    probe = pa.array([{"width": 640, "height": 360}])
    table = pa.table(_asset(probe=probe, probe_width=pa.array([1280])))
    with pytest.raises(InvalidBatch, match="given twice") as err:
        coerce_batch(TABLES["assets"], table)
    assert err.value.details["field"] == "probe_width"
    # Either alone is fine.
    alone = coerce_batch(TABLES["assets"], pa.table(_asset(probe=probe)))
    assert alone["probe_width"].to_pylist() == [640]


@pytest.mark.parametrize("value", ["12", "1e3", "true"])
def test_a_text_column_for_a_number_is_refused_as_in_json(value: str) -> None:
    """Arrow's cast parses "12" into 12, where a JSON body's "12" is a 422: one rule."""
    table = pa.table(_asset(size=pa.array([value])))
    with pytest.raises(InvalidBatch, match="send numbers") as err:
        coerce_batch(TABLES["assets"], table)
    assert err.value.details == {"row": 0, "field": "size"}


def test_iso_time_strings_still_fill_timestamp_columns() -> None:
    table = pa.table(_asset(ingested_at=pa.array(["2026-11-30T12:00:00+00:00"])))
    out = coerce_batch(TABLES["assets"], table)
    assert out["ingested_at"][0].as_py().year == 2026
