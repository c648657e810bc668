"""Idempotent ingest over HTTP (``Idempotency-Key``) and the CLI (``--idempotency-key``),
and the clips response's eval count (issue 11, items 5 and 6)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog import rules
from service.app import create_app
from service.settings import Settings
from tests.service.support import TestClient, assert_error
from tests.service.test_cli import _vidlake
from tests.service.test_ingest import asset_rows, count


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """An empty catalog whose carve-out puts about half the assets in eval."""
    app = create_app(Settings(home=tmp_path_factory.mktemp("keys"), eval_fraction=0.5))
    with TestClient(app) as c:
        yield c


def _clips(prefix: str, n: int) -> list[dict[str, Any]]:
    ids = [hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest() for i in range(n)]
    return [
        {"asset_id": a, "t_start_s": 0.0, "t_end_s": 1.0, "split_version": "v1"}
        | {"num_frames": 24, "width": 64, "height": 64}
        for a in ids
    ]


def test_the_clips_response_counts_eval_clips(client: TestClient) -> None:
    n_eval = client.post("/v1/assets", json=asset_rows("ev", 40)).json()["eval"]
    assert 0 < n_eval < 40
    body = client.post("/v1/clips", json=_clips("ev", 40)).json()
    assert (body["inserted"], body["eval"]) == (40, n_eval)


def test_a_rerun_with_the_same_key_replays_the_first_response(client: TestClient) -> None:
    client.post("/v1/assets", json=asset_rows("rk", 2))
    client.post("/v1/clips", json=_clips("rk", 2))
    clip = rules.clip_id(hashlib.sha256(b"rk-0").hexdigest(), 0.0, 1.0, "v1")
    rows = [{"clip_id": clip, "filter_name": "motion", "filter_version": "1", "score": 0.5}]
    headers = {"Idempotency-Key": "motion-job-1"}
    first = client.post("/v1/scores", json=rows, headers=headers).json()
    assert (first["inserted"], first["replayed"], first["idempotency_key"]) == (
        1,
        False,
        "motion-job-1",
    )
    again = client.post("/v1/scores", json=[{**rows[0], "score": 0.7}], headers=headers).json()
    assert again["replayed"] and again["inserted"] == 1
    assert again["snapshot_id"] == first["snapshot_id"]
    assert count(client, "scores") == 1
    # Without a header the key is the batch's hash: the same body replays too.
    derived = client.post("/v1/scores", json=[{**rows[0], "score": 0.9}]).json()
    assert derived["idempotency_key"].startswith("sha256:") and not derived["replayed"]
    assert client.post("/v1/scores", json=[{**rows[0], "score": 0.9}]).json()["replayed"]
    assert count(client, "scores") == 2
    bad = client.post("/v1/scores", json=rows, headers={"Idempotency-Key": "x" * 201})
    assert_error(bad, 422, "invalid_input")
    assert count(client, "scores") == 2


def test_the_cli_takes_an_idempotency_key(tmp_path: Path) -> None:
    rows = tmp_path / "assets.json"
    rows.write_text(json.dumps(asset_rows("cli", 3)))
    args = ("ingest", "assets", str(rows), "--idempotency-key", "a-1", "--json")
    first = _vidlake(tmp_path / "home", *args)
    again = _vidlake(tmp_path / "home", *args)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    one, two = json.loads(first.stdout), json.loads(again.stdout)
    assert (one["inserted"], one["replayed"], two["inserted"], two["replayed"]) == (
        3,
        False,
        3,
        True,
    )
    assert two["idempotency_key"] == "a-1"
