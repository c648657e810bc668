"""Bodies that expand (issue 15, items 5 and 6): a small compressed Arrow body that
inflates to gigabytes, a batch declaring billions of cells, a JSON ``[{},{},…]``,
a refused declared length that the server would otherwise drain, a truncated
stream, and non-integral numbers for integer columns."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from service.app import create_app
from service.settings import Settings
from tests.service.support import TestClient, assert_error, serve

ARROW = "application/vnd.apache.arrow.stream"
#: Decoded bytes of the ZSTD bomb (16 values of 128 MiB of zeros: 2 GiB).
BOMB_COLUMNS, BOMB_COLUMN_BYTES = 16, 128 << 20


def arrow_stream(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def asset(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "asset_id": hashlib.sha256(f"body-{i}".encode()).hexdigest(),
        "uri": f"s3://raw/{i}.mp4",
        "size": 10 + i,
        "source_tier": "crawl",
        **extra,
    }


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """An app with low body limits."""
    settings = Settings(
        home=tmp_path_factory.mktemp("bodies"),
        eval_fraction=0.0,
        max_body_bytes=4 << 20,
        max_json_body_bytes=1 << 20,
        max_json_values=10_000,
        max_decoded_bytes=8 << 20,
        max_batch_cells=1_000_000,
    )
    with TestClient(create_app(settings)) as client:
        yield client


_BOMB_SERVER = """
import json, resource, sys
import pyarrow as pa
from service.app import create_app
from service.settings import Settings
from tests.service.support import TestClient

body = open(sys.argv[1], "rb").read()
settings = Settings(home=sys.argv[2], eval_fraction=0.0, max_decoded_bytes=64 << 20)
with TestClient(create_app(settings)) as client:
    client.get("/v1/health")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pool_before = pa.default_memory_pool().max_memory()
    r = client.post("/v1/assets", content=body,
                    headers={"Content-Type": "application/vnd.apache.arrow.stream"})
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"status": r.status_code, "body": r.json(),
                      "rss_growth_mb": (after - before) / 1024,
                      "pool_max_mb": pa.default_memory_pool().max_memory() / 2**20,
                      "pool_before_mb": pool_before / 2**20}))
"""


def _zeros_strings() -> pa.Array:
    """16 strings of 128 MiB of NUL bytes (2 GiB) whose pages are never touched:
    ``np.zeros`` memory is mapped lazily, so building and compressing them costs
    no resident memory."""
    data = pa.py_buffer(np.zeros(BOMB_COLUMNS * BOMB_COLUMN_BYTES, np.uint8))
    offsets = pa.py_buffer(np.arange(BOMB_COLUMNS + 1, dtype=np.int64) * BOMB_COLUMN_BYTES)
    return pa.Array.from_buffers(pa.large_string(), BOMB_COLUMNS, [None, offsets, data])


def test_zstd_bomb_is_refused_without_inflating(tmp_path: Path) -> None:
    body = arrow_stream(pa.table({"uri": _zeros_strings()}), compression="zstd")
    assert len(body) < 200_000
    path = tmp_path / "bomb.arrows"
    path.write_bytes(body)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", _BOMB_SERVER, str(path), str(tmp_path / "home")],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == 413, result
    assert result["body"]["error"]["details"]["what"] == "decoded_bytes"
    assert result["rss_growth_mb"] < 100, result
    assert result["pool_max_mb"] < 64, result


def test_rows_times_columns_are_bounded_before_decoding(small: TestClient) -> None:
    # A null column has no buffers: a ~300-byte body declaring 2 million rows, which
    # the catalog would fill with every column of the table.
    body = arrow_stream(pa.table({"uri": pa.nulls(2_000_000)}))
    assert len(body) < 1000
    r = small.post("/v1/assets", content=body, headers={"Content-Type": ARROW})
    assert assert_error(r, 413, "payload_too_large")["details"]["what"] == "cells"


def test_json_of_empty_objects_is_refused_before_parsing(small: TestClient) -> None:
    body = b"[" + b",".join([b"{}"] * 300_000) + b"]"  # 900 KB: under the byte cap
    tracemalloc.start()
    try:
        r = small.post("/v1/assets", content=body, headers={"Content-Type": "application/json"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = assert_error(r, 413, "payload_too_large")
    assert error["details"]["what"] == "json_values" and ARROW in error["message"]
    # Parsing it would make 300k dicts (~20 MB); refusing costs a few body copies.
    assert peak < 6 * len(body), peak


def test_json_bodies_have_a_lower_cap_that_points_to_arrow(small: TestClient) -> None:
    body = json.dumps([asset(i, provenance=json.dumps({"pad": "x" * 3000})) for i in range(400)])
    assert (1 << 20) < len(body) < (4 << 20)
    r = small.post("/v1/assets", content=body, headers={"Content-Type": "application/json"})
    error = assert_error(r, 413, "payload_too_large")
    assert error["details"]["limit"] == 1 << 20 and ARROW in error["message"]


def test_arrow_within_the_limits_is_accepted(small: TestClient) -> None:
    rows = [asset(i) for i in range(50)]
    table = pa.Table.from_pylist(rows)
    body = arrow_stream(table, compression="zstd")
    r = small.post("/v1/assets", content=body, headers={"Content-Type": ARROW})
    assert r.status_code == 200, r.text
    assert r.json()["inserted"] == 50
    dictionary = table.set_column(
        table.schema.get_field_index("source_tier"),
        "source_tier",
        table.column("source_tier").dictionary_encode(),
    )
    # The same rows, so the same canonical bytes: without a key of its own it would be
    # a replay of the first batch (the first response, "replayed": true).
    headers = {"Content-Type": ARROW, "Idempotency-Key": "dictionary-columns"}
    r = small.post("/v1/assets", content=arrow_stream(dictionary), headers=headers)
    assert r.status_code == 200, r.text
    assert (r.json()["duplicates"], r.json()["replayed"]) == (50, False)


def test_dictionary_expansion_counts_as_decoded_bytes(small: TestClient) -> None:
    # One 1 MiB dictionary value referenced by 100 rows: 100 MiB once decoded.
    n = 100
    uri = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, np.int32)), pa.array(["u" * (1 << 20)])
    )
    table = pa.table(
        {"asset_id": [asset(i)["asset_id"] for i in range(n)], "uri": uri, "size": [1] * n}
    )
    body = arrow_stream(table, compression="zstd")
    assert len(body) < (4 << 20)
    r = small.post("/v1/assets", content=body, headers={"Content-Type": ARROW})
    assert assert_error(r, 413, "payload_too_large")["details"]["what"] == "decoded_bytes"


# Cutting exactly the 8-byte end-of-stream marker leaves a valid stream (the marker
# is optional: a writer may just close), so the cuts fall elsewhere.
@pytest.mark.parametrize("cut", [1, 4, 20, 60, 200])
def test_a_truncated_arrow_stream_is_422(small: TestClient, cut: int) -> None:
    body = arrow_stream(pa.Table.from_pylist([asset(i) for i in range(3)]))
    r = small.post("/v1/assets", content=body[:-cut], headers={"Content-Type": ARROW})
    assert "Arrow IPC" in assert_error(r, 422, "invalid_batch")["message"]


def test_an_arrow_body_with_no_schema_is_422(small: TestClient) -> None:
    r = small.post("/v1/assets", content=b"", headers={"Content-Type": ARROW})
    assert_error(r, 422, "invalid_batch")


def test_a_json_row_repeating_a_key_is_422(small: TestClient) -> None:
    row = json.dumps(asset(960))[:-1] + ', "size": 99}'
    r = small.post("/v1/assets", content=f"[{row}]", headers={"Content-Type": "application/json"})
    error = assert_error(r, 422, "invalid_batch")
    assert error["details"]["field"] == "size" and "twice" in error["message"]


def test_an_arrow_stream_repeating_a_column_is_422(small: TestClient) -> None:
    table = pa.Table.from_pylist([asset(950)])
    twice = table.append_column("asset_id", pa.array([asset(951)["asset_id"]]))
    r = small.post("/v1/assets", content=arrow_stream(twice), headers={"Content-Type": ARROW})
    error = assert_error(r, 422, "invalid_batch")
    assert error["details"]["field"] == "asset_id" and "twice" in error["message"]


def test_non_integral_numbers_for_integer_columns_are_422(small: TestClient) -> None:
    error = assert_error(small.post("/v1/assets", json=[asset(900, size=1.5)]), 422)
    assert error["details"] == {"row": 0, "field": "size"}
    error = assert_error(
        small.post("/v1/assets", json=[asset(901), asset(902, probe={"width": 10.25})]), 422
    )
    assert error["details"] == {"row": 1, "field": "probe.width"}
    r = small.post("/v1/assets", json=[asset(903, size=7.0)])  # integral: fine
    assert r.status_code == 200, r.text
    sql = small.post(
        "/v1/sql", json={"query": f"SELECT size FROM assets WHERE uri = '{asset(903)['uri']}'"}
    )
    assert sql.json()["rows"] == [[7]]
    assert small.post(
        "/v1/sql", json={"query": "SELECT count(*) FROM assets WHERE size = 1"}
    ).json()["rows"] == [[0]]


def test_a_refused_declared_length_closes_the_connection(tmp_path: Path) -> None:
    """A 300 MB declared body gets its 413 at once and the connection closes: the
    server does not read (drain) the body it refused."""
    app = create_app(Settings(home=tmp_path, max_body_bytes=1 << 20))
    with serve(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/assets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 300000000\r\n\r\n" + b"[" * 65536
            )
            start = time.monotonic()
            received = b""
            sock.settimeout(5)
            while True:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    pytest.fail(f"the server kept the connection open: {received[:200]!r}")
                if not chunk:
                    break
                received += chunk
            assert received.startswith(b"HTTP/1.1 413"), received[:200]
            assert time.monotonic() - start < 5


def test_a_partition_value_too_long_for_a_directory_name_is_422(small: TestClient) -> None:
    # 60 non-ASCII characters percent-encode to 360 bytes: a file name the warehouse
    # cannot create (the append failed with a 502 after every check had passed).
    row = {"clip_id": "0" * 32, "caption_version": "é" * 60, "kind": "dense", "text": "t"}
    error = assert_error(small.post("/v1/captions", json=[row]), 422, "invalid_batch")
    assert error["details"] == {"row": 0, "field": "caption_version"}
    table = pa.Table.from_pylist([row])
    r = small.post("/v1/captions", content=arrow_stream(table), headers={"Content-Type": ARROW})
    assert assert_error(r, 422, "invalid_batch")["details"]["field"] == "caption_version"


def test_large_integers_and_bad_frame_hashes_are_not_server_errors(small: TestClient) -> None:
    # Found by schemathesis over the typed row schemas: both were 500s.
    r = small.post("/v1/assets", json=[asset(950, size=407902493670644864)])
    assert r.status_code == 200, r.text
    for hashes in ([-1], [2**64], ["x"]):
        r = small.post("/v1/assets", json=[asset(951, fingerprint=hashes)])
        assert assert_error(r, 422, "invalid_batch")["details"] == {
            "row": 0,
            "field": "fingerprint",
        }
