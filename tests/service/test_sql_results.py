"""Encoding of sandbox results (row and byte caps, deadline checks) and the small
helpers of the sandbox: memory sizes and the view-name scan."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from catalog.errors import InvalidSQL
from service.sql.pool import parse_bytes
from service.sql.results import encode_arrow, encode_json
from service.sql.validate import mentioned

BATCH = pa.record_batch({"i": list(range(100)), "s": [f"v{i:03d}" for i in range(100)]})


def test_json_caps_rows_and_bytes() -> None:
    whole = encode_json([BATCH], 1000, 1 << 20)
    assert (whole.rows, whole.truncated) == (100, False)
    assert json.loads(whole.body) == [[i, f"v{i:03d}"] for i in range(100)]
    by_rows = encode_json([BATCH], 7, 1 << 20)
    assert (by_rows.rows, by_rows.truncated) == (7, True)
    by_bytes = encode_json([BATCH], 1000, 100)
    assert by_bytes.truncated and 0 < by_bytes.rows < 100 and len(by_bytes.body) <= 100
    assert json.loads(by_bytes.body) == [[i, f"v{i:03d}"] for i in range(by_bytes.rows)]
    with pytest.raises(InvalidSQL) as info:
        encode_json([BATCH], 1000, 5)
    assert info.value.details["reason"] == "result_too_large"


def test_arrow_caps_rows_and_bytes() -> None:
    by_rows = encode_arrow([BATCH], BATCH.schema, 7, 1 << 20)
    assert (by_rows.rows, by_rows.truncated) == (7, True)
    table = pa.ipc.open_stream(by_rows.body).read_all()
    assert table.column("i").to_pylist() == list(range(7))
    by_bytes = encode_arrow([BATCH], BATCH.schema, 1000, 1500)
    assert by_bytes.truncated and 0 < by_bytes.rows < 100 and len(by_bytes.body) <= 1500 + 1024


def test_encoding_checks_the_deadline_per_chunk() -> None:
    wide = pa.record_batch({f"c{i}": list(range(50)) for i in range(3000)})
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) > 3:
            raise InvalidSQL("stop", reason="timeout")

    with pytest.raises(InvalidSQL):
        encode_json([wide], 1000, 1 << 30, check)
    assert len(calls) == 4  # a 3,000-column batch is checked every few rows


def test_parse_bytes() -> None:
    assert parse_bytes("1GB") == 10**9
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("100") == 100
    for bad in ("", "GB", "-1GB", "1 parsec", "0MB"):
        with pytest.raises(InvalidSQL):
            parse_bytes(bad)


def test_mentioned_is_a_case_insensitive_word_scan() -> None:
    names = ["clips", "plans", "assets"]
    assert mentioned('SELECT * FROM "CLIPS" c, Plans', names) == {"clips", "plans"}
    assert mentioned("SELECT * FROM clips_x, xassets, assets2", names) == set()
