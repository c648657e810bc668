"""Eval isolation of POST /v1/sql: whatever pin a caller names, in whatever order
requests arrive, a token without ``eval`` never sees an eval row.

The catalog here has history: the support world (eight train and two eval assets)
is extended after its snapshots were cut with a third eval asset, a train asset, and
rows of every table that reference them, so that old pins of ``clips``/``assets``
lack eval ids that newer pins of the other tables reference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.tables import TABLE_NAMES
from service.app import create_app
from tests.catalog._latents import safetensors_bytes
from tests.service.support import TestClient, World, bearer, build_world, write_tokens

READ, EVAL = bearer("tok-read"), bearer("tok-eval")
#: Per table, the columns that can name eval material.
KEYS = {
    "assets": ["asset_id", "split"],
    "asset_events": ["asset_id"],
    "tombstones": ["asset_id"],
    "clips": ["clip_id", "asset_id", "split"],
    "latents": ["clip_id", "object_sha256"],
    "scores": ["clip_id"],
    "captions": ["clip_id"],
    "jobs": ["job_id"],
}


@dataclass
class History:
    world: World
    eval_assets: set[str]
    eval_clips: set[str]
    eval_objects: set[str]
    snapshots: dict[str, list[int]]  # table -> every snapshot id, oldest first
    version_pin: dict[str, int | None]  # the pin of the first published version


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _extend(world: World) -> None:
    """Add an eval and a train asset with rows in every table, after the cuts."""
    catalog = world.catalog
    late_eval, late_train = _sha("late-eval-asset"), _sha("late-train-asset")
    catalog.add_assets(
        [
            {"asset_id": a, "uri": f"s3://raw/{a[:8]}.mp4", "size": 10, "source": "late"}
            | {"source_tier": "licensed", "license_id": "lic-9"}
            | ({"split": "eval"} if a == late_eval else {})
            for a in (late_eval, late_train)
        ]
    )
    catalog.add_clips(
        [
            {"asset_id": a, "t_start_s": 0.0, "t_end_s": 2.0, "split_version": "v1"}
            | {"num_frames": 48, "width": 640, "height": 360, "fps": 24.0}
            for a in (late_eval, late_train)
        ]
    )
    clips = catalog.scan("clips", include_eval=True, columns=["clip_id", "asset_id", "split"])
    pairs = zip(clips["clip_id"].to_pylist(), clips["asset_id"].to_pylist(), strict=True)
    late = {c: a for c, a in pairs if a in (late_eval, late_train)}
    for clip_id, asset_id in late.items():
        world.clips[clip_id] = asset_id
        world.clip_split[clip_id] = "eval" if asset_id == late_eval else "train"
    latents = []
    for clip_id in sorted(late):
        latent = safetensors_bytes(
            {"latent": ("BF16", [4, 12, 4, 4])}, header={"__metadata__": {"clip_id": clip_id}}
        )
        put = catalog.objects.put_bytes(latent)
        world.latent_object[clip_id] = put.info.sha256
        latents.append(
            {"clip_id": clip_id, "rung": "256p", "tokenizer_version": "vae-v1"}
            | {"format": "safetensors", "object_sha256": put.info.sha256}
            | {"tensor_keys": ["latent"], "latent_frames": 12, "tokens": 1024}
        )
    catalog.add_latents(latents)
    catalog.add_scores(
        [
            {"clip_id": c, "filter_name": "aesthetic", "filter_version": "2", "score": 3.0}
            for c in late
        ]
    )
    catalog.add_captions(
        [{"clip_id": c, "caption_version": "2", "kind": "dense", "text": "late"} for c in late]
    )
    events = [
        {"asset_id": a, "event": "quarantined", "reason": "review"} for a in (late_eval, late_train)
    ]
    catalog.add_asset_events([*events, {"asset_id": world.eval_assets[0], "event": "released"}])
    catalog.add_tombstones(
        [
            {"asset_id": a, "reason": "dmca", "kind": "soft"}
            for a in (late_eval, world.eval_assets[1])
        ]
    )
    catalog.add_jobs([{"job_id": "job-late", "stage": "caption"}])
    world.eval_assets.append(late_eval)
    world.train_assets.append(late_train)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    world = build_world(tmp_path_factory.mktemp("eval-world"), snapshots=1)
    version_pin = dict(world.registry.get(1).snapshot["catalog_snapshot_ids"])
    _extend(world)
    snapshots = {t: world.catalog.snapshot_ids(t) for t in TABLE_NAMES}
    return History(
        world,
        set(world.eval_assets),
        set(world.eval_clips),
        {world.latent_object[c] for c in world.eval_clips},
        snapshots,
        version_pin,
    )


@pytest.fixture(scope="module")
def eval_client(history: History, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tokens = write_tokens(tmp_path_factory.mktemp("eval-auth") / "tokens.json")
    world = history.world
    app = create_app(world.settings(tokens_file=tokens, sql_workers=2), catalog=world.catalog)
    with TestClient(app) as c:
        yield c


def _rows(
    client: TestClient, table: str, pin: Any, headers: dict[str, str]
) -> list[dict[str, Any]]:
    cols = KEYS[table]
    r = client.post(
        "/v1/sql",
        json={"query": f"SELECT {', '.join(cols)} FROM {table}", "pin": pin},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    return [dict(zip(cols, row, strict=True)) for row in r.json()["rows"]]


def _eval_rows(history: History, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def is_eval(row: dict[str, Any]) -> bool:
        return (
            row.get("split") == "eval"
            or row.get("asset_id") in history.eval_assets
            or row.get("clip_id") in history.eval_clips
            or row.get("object_sha256") in history.eval_objects
        )

    return [row for row in rows if is_eval(row)]


def test_partial_pin_does_not_leak(eval_client: TestClient, history: History) -> None:
    """The reported request: a pin that names captions but not clips/assets."""
    pin = {"captions": history.snapshots["captions"][-1]}
    body = {"query": "SELECT count(*) FROM captions", "pin": pin}
    read = eval_client.post("/v1/sql", json=body, headers=READ).json()["rows"][0][0]
    full = eval_client.post("/v1/sql", json=body, headers=EVAL).json()["rows"][0][0]
    train = sum(1 for c, split in history.world.clip_split.items() if split == "train")
    assert (read, full) == (train, len(history.world.clip_split)), (read, full)
    for table in ("captions", "latents", "scores", "asset_events", "tombstones"):
        pin = {table: history.snapshots[table][-1]}
        assert _eval_rows(history, _rows(eval_client, table, pin, READ)) == [], table
        assert _eval_rows(history, _rows(eval_client, table, pin, EVAL)), table


def test_complete_old_pin_does_not_leak(eval_client: TestClient, history: History) -> None:
    """Every table pinned, clips/assets at the version's (older) state and the rest at
    the latest: the late eval asset's rows must stay hidden."""
    pin = dict(history.version_pin)
    pin |= {t: history.snapshots[t][-1] for t in TABLE_NAMES if t not in ("clips", "assets")}
    for table in TABLE_NAMES:
        assert _eval_rows(history, _rows(eval_client, table, pin, READ)) == [], table
    counted = eval_client.post(
        "/v1/sql", json={"query": "SELECT count(*) FROM captions", "pin": pin}, headers=READ
    ).json()["rows"][0][0]
    latest = eval_client.post(
        "/v1/sql", json={"query": "SELECT count(*) FROM captions"}, headers=READ
    ).json()["rows"][0][0]
    assert counted == latest


def test_a_leak_is_not_cached_for_later_requests(eval_client: TestClient, history: History) -> None:
    """After partial-pin requests, a default-pin request still sees no eval row."""
    for table in TABLE_NAMES:
        _rows(eval_client, table, {table: history.snapshots[table][-1]}, READ)
        _rows(eval_client, table, {table: history.snapshots[table][-1]}, EVAL)
    for table in TABLE_NAMES:
        assert _eval_rows(history, _rows(eval_client, table, "latest", READ)) == [], table


def _pins(history: History) -> st.SearchStrategy[Any]:
    per_table = {t: st.sampled_from([None, *history.snapshots[t]]) for t in TABLE_NAMES}
    partial = st.fixed_dictionaries({}, optional=per_table)
    return st.one_of(st.just("latest"), partial, st.fixed_dictionaries(per_table))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_eval_row_under_any_pin_in_any_order(
    data: st.DataObject, eval_client: TestClient, history: History
) -> None:
    """Random sequences of (pin, table, scope) requests on one server (its caches
    shared across the sequence): read-scope answers hold no eval row, and eval-scope
    answers at a pin hold every row the read scope sees there."""
    requests = data.draw(
        st.lists(
            st.tuples(_pins(history), st.sampled_from(TABLE_NAMES), st.booleans()),
            min_size=1,
            max_size=6,
        )
    )
    for pin, table, sees_eval in requests:
        rows = _rows(eval_client, table, pin, EVAL if sees_eval else READ)
        if not sees_eval:
            assert _eval_rows(history, rows) == [], (pin, table)


def test_eval_scope_sees_eval_rows(eval_client: TestClient, history: History) -> None:
    for table in ("assets", "clips", "latents", "scores", "captions"):
        assert _eval_rows(history, _rows(eval_client, table, "latest", EVAL)), table


def test_fixture_has_history(history: History, tmp_path: Path) -> None:
    """The property above is only meaningful if old clips pins lack late eval ids."""
    assert len(history.snapshots["clips"]) >= 2 and len(history.snapshots["captions"]) >= 2
    assert history.version_pin["clips"] != history.snapshots["clips"][-1]
