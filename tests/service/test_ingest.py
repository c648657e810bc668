"""Ingest endpoints: JSON and Arrow round trips, counts, 413/415/422 and the error shape."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from catalog import rules
from service.app import create_app
from service.deps import Services
from service.settings import Settings
from tests.service.support import TestClient, assert_error

ARROW = "application/vnd.apache.arrow.stream"
LIMIT = 64 * 1024


def asset_rows(prefix: str, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "asset_id": hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest(),
            "uri": f"s3://raw/{prefix}/{i}.mp4",
            "size": 10 + i,
            "source_tier": "crawl",
            **extra,
        }
        for i in range(n)
    ]


def arrow_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Services]]:
    """An app that opens its own (empty) catalog from settings, with a small body limit."""
    home = tmp_path_factory.mktemp("ingest")
    app = create_app(Settings(home=home, eval_fraction=0.0, max_body_bytes=LIMIT))
    with TestClient(app) as c:
        yield c, app.state.services


def count(client: TestClient, table: str) -> int:
    r = client.post("/v1/sql", json={"query": f"SELECT count(*) FROM {table}"})
    assert r.status_code == 200, r.text
    return int(r.json()["rows"][0][0])


def test_module_app_is_built_lazily_and_opens_nothing(tmp_path: Path) -> None:
    code = (
        "import service.app as m\n"
        "assert 'app' not in vars(m)\n"
        "app = m.app\n"
        "assert vars(m)['app'] is app and app.title == 'vidlake'\n"
    )
    env = {**os.environ, "VIDLAKE_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
    assert not (tmp_path / "home").exists()  # no catalog, no job store until first use


def test_json_round_trip_counts_duplicates_and_eval(fresh: tuple[TestClient, Services]) -> None:
    client, services = fresh
    rows = asset_rows("json", 6)
    rows[0]["split"] = "eval"  # a producer may force eval
    r = client.post("/v1/assets", json=rows)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body == {
        "table": "assets",
        "received": 6,
        "inserted": 6,
        "duplicates": 0,
        "eval": 1,
        "rejected": 0,
        "near_duplicates": 0,
        "snapshot_id": body["snapshot_id"],
        "idempotency_key": body["idempotency_key"],
        "replayed": False,
    }
    # The same batch replays its first response; under another key it is all duplicates.
    assert client.post("/v1/assets", json=rows).json() == {**body, "replayed": True}
    again = client.post("/v1/assets", json=rows, headers={"Idempotency-Key": "second"}).json()
    assert (again["inserted"], again["duplicates"]) == (0, 6)
    stored = services.catalog.scan("assets", include_eval=True)
    assert sorted(stored.column("asset_id").to_pylist()) >= sorted(r["asset_id"] for r in rows)
    assert count(client, "assets") >= 6


def test_arrow_round_trip(fresh: tuple[TestClient, Services]) -> None:
    client, services = fresh
    assets = asset_rows("arrow", 3)
    assert client.post("/v1/assets", json=assets).status_code == 200
    clips = pa.table(
        {
            "asset_id": [a["asset_id"] for a in assets],
            "t_start_s": [0.0, 1.0, 2.0],
            "t_end_s": [1.0, 2.0, 3.0],
            "split_version": ["v1"] * 3,
            "num_frames": pa.array([24, 24, 24], pa.int32()),
            "width": pa.array([320] * 3, pa.int32()),
            "height": pa.array([240] * 3, pa.int32()),
        }
    )
    r = client.post("/v1/clips", content=arrow_stream(clips), headers={"Content-Type": ARROW})
    assert r.status_code == 200, r.text
    assert r.json()["inserted"] == 3
    expected = {
        rules.clip_id(a["asset_id"], float(i), float(i + 1), "v1") for i, a in enumerate(assets)
    }
    stored = set(services.catalog.scan("clips", include_eval=True).column("clip_id").to_pylist())
    assert expected <= stored
    # The same batch again replays; under another key it is all duplicates.
    r = client.post("/v1/clips", content=arrow_stream(clips), headers={"Content-Type": ARROW})
    assert (r.json()["inserted"], r.json()["replayed"]) == (3, True)
    headers = {"Content-Type": ARROW, "Idempotency-Key": "clips-again"}
    r = client.post("/v1/clips", content=arrow_stream(clips), headers=headers)
    assert (r.json()["inserted"], r.json()["duplicates"]) == (0, 3)


def test_other_tables_accept_batches(fresh: tuple[TestClient, Services]) -> None:
    client, _ = fresh
    asset = asset_rows("misc", 1)
    client.post("/v1/assets", json=asset)
    aid = asset[0]["asset_id"]
    for path, rows in {
        "tombstones": [{"asset_id": aid, "reason": "takedown", "kind": "soft"}],
        "asset-events": [{"asset_id": aid, "event": "quarantined", "reason": "review"}],
        "jobs": [{"job_id": "curation-17", "stage": "caption", "status": "done"}],
    }.items():
        r = client.post(f"/v1/{path}", json=rows)
        assert r.status_code == 200, (path, r.text)
        assert r.json()["inserted"] == 1
    assert client.post("/v1/scores", json=[]).json()["received"] == 0


def test_bad_row_is_422_naming_row_and_field_and_writes_nothing(
    fresh: tuple[TestClient, Services],
) -> None:
    client, _ = fresh
    before = count(client, "assets")
    rows = asset_rows("bad", 3)
    rows[2]["asset_id"] = "not-a-sha"
    error = assert_error(client.post("/v1/assets", json=rows), 422, "invalid_batch")
    assert error["details"] == {"row": 2, "field": "asset_id"}
    assert count(client, "assets") == before


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"{not json", "application/json", 422, "invalid_batch"),
        (b'{"rows": []}', "application/json", 422, "invalid_batch"),
        (b"[1, 2]", "application/json", 422, "invalid_batch"),
        (b"\x00\x01garbage", ARROW, 422, "invalid_batch"),
        (b"a,b\n1,2\n", "text/csv", 415, "unsupported_media_type"),
    ],
)
def test_unreadable_bodies(
    fresh: tuple[TestClient, Services], body: bytes, content_type: str, status: int, code: str
) -> None:
    client, _ = fresh
    r = client.post("/v1/assets", content=body, headers={"Content-Type": content_type})
    assert_error(r, status, code)


def test_declared_oversize_body_is_413_and_writes_nothing(
    fresh: tuple[TestClient, Services],
) -> None:
    client, _ = fresh
    before = count(client, "assets")
    rows = asset_rows("big", 600)
    body = json.dumps(rows).encode()
    assert len(body) > LIMIT
    error = assert_error(
        client.post("/v1/assets", content=body, headers={"Content-Type": "application/json"}),
        413,
        "payload_too_large",
    )
    assert error["details"]["limit"] == LIMIT
    assert count(client, "assets") == before


@pytest.mark.parametrize("path", ["/v1/assets", "/v1/sql"])
def test_streamed_oversize_body_is_413(fresh: tuple[TestClient, Services], path: str) -> None:
    client, _ = fresh

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must count bytes
        yield b'{"query": "'
        for _ in range(LIMIT // 1024 + 2):
            yield b"x" * 1024
        yield b'"}'

    r = client.post(path, content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(r, 413, "payload_too_large")


def test_framework_errors_have_the_one_shape(fresh: tuple[TestClient, Services]) -> None:
    client, _ = fresh
    error = assert_error(client.post("/v1/sql", json={}), 422, "invalid_input")
    assert error["details"]["errors"][0]["loc"] == ["body", "query"]
    assert_error(client.post("/v1/sql", json={"query": "select 1", "nope": 1}), 422)
    assert_error(client.get("/v1/snapshots/abc"), 422, "invalid_input")
    assert_error(client.get("/v1/no/such/route"), 404, "not_found")
    assert_error(client.put("/v1/assets", json=[]), 405, "method_not_allowed")
    assert_error(client.get("/v1/jobs/job_missing"), 404, "not_found")
    assert_error(client.get("/v1/snapshots/7"), 404, "not_found")


def test_embeddings(fresh: tuple[TestClient, Services]) -> None:
    from catalog.embeddings import EmbeddingIndex

    client, services = fresh
    assets = asset_rows("emb", 2)
    assets[1]["split"] = "eval"
    client.post("/v1/assets", json=assets)
    client.post(
        "/v1/clips",
        json=[
            {
                "asset_id": a["asset_id"],
                "t_start_s": 0.0,
                "t_end_s": 1.0,
                "split_version": "v1",
                "num_frames": 8,
                "width": 64,
                "height": 64,
            }
            for a in assets
        ],
    )
    clip_ids = [rules.clip_id(a["asset_id"], 0.0, 1.0, "v1") for a in assets]
    rows = [{"clip_id": c, "vector": [1.0, float(i), 0.5]} for i, c in enumerate(clip_ids)]
    r = client.post("/v1/embeddings?model_version=siglip-v1", json=rows)
    assert r.status_code == 200, r.text
    assert (r.json()["inserted"], r.json()["eval"]) == (2, 1)
    r = client.post("/v1/embeddings?model_version=siglip-v1", json=rows)
    assert (r.json()["inserted"], r.json()["duplicates"]) == (0, 2)
    index = EmbeddingIndex(services.catalog.config.lance, "siglip-v1")
    assert index.count() == 2 and index.count("eval") == 1  # the split is the catalog's
    unknown = [{"clip_id": "0" * 32, "vector": [1.0, 0.0, 0.0]}]
    error = assert_error(
        client.post("/v1/embeddings?model_version=siglip-v1", json=unknown), 422, "invalid_batch"
    )
    assert error["details"] == {"row": 0, "field": "clip_id"}
    error = assert_error(client.post("/v1/embeddings", json=rows), 422, "invalid_batch")
    assert error["details"]["field"] == "model_version"


def test_metrics_count_ingested_rows(fresh: tuple[TestClient, Services]) -> None:
    client, _ = fresh
    client.post("/v1/assets", json=asset_rows("metrics", 4))
    text = client.get("/metrics").text
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith('vidlake_ingest_rows_total{outcome="inserted",table="assets"}')
    )
    assert float(line.split()[-1]) >= 4
    assert 'vidlake_requests_total{method="POST",route="/v1/assets",status="200"}' in text
    assert "vidlake_request_seconds_bucket" in text
    assert 'vidlake_jobs{state="running"}' in text
