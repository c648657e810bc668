"""Snapshots over HTTP: snapshot.json, artifacts and objects with Range and SHA-256,
steps and lineage forensics, patch, pin and diff."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from manifests.registry import canonical_json
from service.app import create_app
from tests.service.support import (
    STREAMS,
    TestClient,
    World,
    artifact_table,
    assert_error,
    build_world,
    serve,
    world_recipe,
)


def test_list_and_get_snapshot_json(client: TestClient, world: World) -> None:
    body = client.get("/v1/snapshots").json()
    assert body["count"] == len(world.versions)
    assert [s["version"] for s in body["data"]] == sorted(world.versions, reverse=True)
    first = world.registry.get(1)
    r = client.get("/v1/snapshots/1")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    # Byte for byte what the registry stored, and named by its SHA-256.
    assert r.content == canonical_json(first.snapshot)
    assert hashlib.sha256(r.content).hexdigest() == r.headers["x-vidlake-sha256"]
    assert r.headers["x-vidlake-sha256"] == first.entry.snapshot_sha256
    assert_error(client.get("/v1/snapshots/999"), 404, "not_found")


@pytest.mark.parametrize("name", ["plan.arrow", "index.arrow", "manifest.parquet"])
def test_artifacts_stream_whole_and_ranged(client: TestClient, world: World, name: str) -> None:
    ref = world.registry.artifact_ref(1, name)
    whole = client.get(f"/v1/snapshots/1/artifacts/{name}")
    assert whole.status_code == 200
    assert whole.headers["x-vidlake-sha256"] == ref.sha256
    assert whole.headers["accept-ranges"] == "bytes"
    assert int(whole.headers["content-length"]) == ref.size == len(whole.content)
    assert hashlib.sha256(whole.content).hexdigest() == ref.sha256
    size = ref.size
    cases = {
        "bytes=0-9": (0, 10),
        f"bytes={size - 5}-": (size - 5, size),
        "bytes=-7": (size - 7, size),
        f"bytes=10-{size + 100}": (10, size),
        "bytes=3-3": (3, 4),
    }
    for header, (start, stop) in cases.items():
        part = client.get(f"/v1/snapshots/1/artifacts/{name}", headers={"Range": header})
        assert part.status_code == 206, header
        assert part.content == whole.content[start:stop], header
        assert part.headers["content-range"] == f"bytes {start}-{stop - 1}/{size}"
        assert part.headers["x-vidlake-sha256"] == ref.sha256
    # Reassembling ranges gives the verified whole.
    pieces = [
        client.get(
            f"/v1/snapshots/1/artifacts/{name}",
            headers={"Range": f"bytes={o}-{min(size, o + 1000) - 1}"},
        ).content
        for o in range(0, size, 1000)
    ]
    assert hashlib.sha256(b"".join(pieces)).hexdigest() == ref.sha256


def test_bad_ranges(client: TestClient) -> None:
    size = int(client.get("/v1/snapshots/1/artifacts/plan.arrow").headers["content-length"])
    for header in [
        f"bytes={size}-",
        f"bytes={size + 5}-{size + 9}",
        "bytes=9-3",
        "bytes=-0",
        "bytes=x-y",
    ]:
        r = client.get("/v1/snapshots/1/artifacts/plan.arrow", headers={"Range": header})
        assert_error(r, 416, "range_not_satisfiable")
        assert r.headers["content-range"] == f"bytes */{size}"
    # Several ranges, or another unit: the whole object (RFC 9110 lets us ignore it).
    for header in ["bytes=0-1,5-6", "items=0-3"]:
        r = client.get("/v1/snapshots/1/artifacts/plan.arrow", headers={"Range": header})
        assert r.status_code == 200 and len(r.content) == size
    assert_error(client.get("/v1/snapshots/1/artifacts/nope.bin"), 404, "not_found")
    assert_error(client.get("/v1/snapshots/1/artifacts/..%2Fsecret"), 404)


def test_objects(client: TestClient, world: World) -> None:
    clip = world.train_clips[0]
    sha = world.latent_object[clip]
    data = world.catalog.objects.get(sha)
    r = client.get(f"/v1/objects/{sha}")
    assert r.status_code == 200 and r.content == data
    assert r.headers["x-vidlake-sha256"] == sha
    r = client.get(f"/v1/objects/{sha}", headers={"Range": "bytes=5-24"})
    assert r.status_code == 206 and r.content == data[5:25]
    assert_error(client.get(f"/v1/objects/{'0' * 64}"), 404, "not_found")
    assert_error(client.get("/v1/objects/not-a-sha"), 422, "invalid_input")
    metrics = client.get("/metrics").text
    assert 'vidlake_served_bytes_total{kind="object",name="object"}' in metrics


def test_step_samples_match_the_plan(client: TestClient, world: World) -> None:
    plan = artifact_table(world.registry, 1, "plan.arrow").to_pylist()
    index = artifact_table(world.registry, 1, "index.arrow").to_pylist()
    for step in (0, len(plan) - 1):
        body = client.get(f"/v1/snapshots/1/steps/{step}").json()
        assert body["step"] == step and body["count"] == len(plan[step]["rows"])
        assert [s["row"] for s in body["samples"]] == plan[step]["rows"]
        for sample in body["samples"]:
            entry = index[sample["row"]]
            assert sample["clip_id"] == entry["clip_id"]
            assert sample["asset_id"] == entry["asset_id"] == world.clips[entry["clip_id"]]
            assert sample["stream"] == STREAMS[entry["stream"]]
            assert sample["source"] in ("stock-a", "stock-b")
            assert sample["license_id"].startswith("lic-")
            assert sample["tier"] in ("gold", "silver")
            # The recipe names aesthetic version 2: its score, not version 1's.
            assert set(sample["scores"]) == {"aesthetic"}
            assert sample["scores"]["aesthetic"] >= 5.0
    assert_error(client.get(f"/v1/snapshots/1/steps/{len(plan)}"), 404, "not_found")
    assert_error(client.get("/v1/snapshots/1/steps/-1"), 422, "invalid_input")


def test_clip_lineage(client: TestClient, world: World) -> None:
    index = artifact_table(world.registry, 1, "index.arrow")
    plan = artifact_table(world.registry, 1, "plan.arrow").to_pylist()
    clip = index.column("clip_id")[0].as_py()
    body = client.get(f"/v1/lineage/clips/{clip}").json()
    assert body["clip"]["clip_id"] == clip
    assert body["asset"]["asset_id"] == world.clips[clip]
    assert body["asset"]["provenance"] == {"vendor": "acme", "batch": 7}
    assert body["asset"]["license_id"].startswith("lic-")
    assert {(s["filter_name"], s["filter_version"]) for s in body["scores"]} == {
        ("aesthetic", "1"),
        ("aesthetic", "2"),
    }
    assert [c["caption_version"] for c in body["captions"]] == ["1"]
    assert body["latents"][0]["object_sha256"] == world.latent_object[clip]
    served = {s["version"]: s for s in body["snapshots"]}
    assert set(served) == set(world.versions)
    expected_steps = sorted(p["step"] for p in plan if 0 in p["rows"])
    assert served[1]["rows"] == [0]
    assert served[1]["steps"] == expected_steps
    assert served[1]["streams"] == [STREAMS[0]]
    assert json.dumps(body)  # JSON all the way down


def test_lineage_of_tombstoned_and_unknown_clips(client: TestClient, world: World) -> None:
    gone = next(c for c, a in world.clips.items() if a == world.tombstoned)
    body = client.get(f"/v1/lineage/clips/{gone}").json()
    assert [t["reason"] for t in body["tombstones"]] == ["dmca"]
    assert body["snapshots"] == []  # the fake cuts left the tombstoned asset out
    assert_error(client.get(f"/v1/lineage/clips/{'f' * 32}"), 404, "not_found")
    assert_error(client.get("/v1/lineage/clips/NOT-HEX"), 422, "invalid_input")


def test_patch_pin_and_diff(client: TestClient, world: World) -> None:
    victim = world.train_clips[0]
    r = client.post(
        "/v1/snapshots/1/patch",
        json={
            "reason": "loss spike",
            "exclude_clip_ids": [victim],
            "where": "tier = 'gold'",
            "by": "oncall",
        },
    )
    assert r.status_code == 201, r.text
    patched = r.json()
    assert patched["patch_of"] == 1 and patched["version"] == max(world.versions) + 1
    recorded = client.get(f"/v1/snapshots/{patched['version']}").json()["patch"]
    assert (recorded["reason"], recorded["by"]) == ("loss spike", "oncall")
    world.versions.append(patched["version"])
    v = patched["version"]
    lineage = client.get(f"/v1/lineage/clips/{victim}").json()
    assert all(s["steps"] == [] for s in lineage["snapshots"] if s["version"] == v)
    for step in range(6):
        samples = client.get(f"/v1/snapshots/{v}/steps/{step}").json()["samples"]
        assert all(s["clip_id"] != victim and s["tier"] != "gold" for s in samples)
    diff = client.get(f"/v1/snapshots/1/diff/{v}").json()
    assert diff["a"] == 1 and diff["b"] == v
    assert diff["plan_rows"]["delta"] < 0
    # Bad patches are 4xx and publish nothing.
    count = client.get("/v1/snapshots").json()["count"]
    assert_error(client.post("/v1/snapshots/1/patch", json={"reason": "x"}), 422)
    assert_error(
        client.post("/v1/snapshots/1/patch", json={"reason": "x", "exclude_clip_ids": ["nope"]}),
        422,
    )
    assert_error(
        client.post("/v1/snapshots/1/patch", json={"reason": "x", "where": "no_col = 1"}),
        400,
        "invalid_sql",
    )
    assert_error(
        client.post(
            "/v1/snapshots/1/patch",
            json={"reason": "x", "where": "row IN (SELECT 1 FROM read_csv('/etc/passwd'))"},
        ),
        400,
    )
    assert_error(
        client.post("/v1/snapshots/99/patch", json={"reason": "x", "exclude_rows": [0]}), 404
    )
    assert client.get("/v1/snapshots").json()["count"] == count
    # Pins.
    pin = client.post("/v1/snapshots/1/pin", json={"reason": "prod run 7"}).json()
    assert (pin["pinned"], pin["changed"], pin["reason"]) == (True, True, "prod run 7")
    listed = {s["version"]: s["pinned"] for s in client.get("/v1/snapshots").json()["data"]}
    assert listed[1] is True and listed[2] is False
    assert client.post("/v1/snapshots/1/pin", json={"reason": "again"}).json()["changed"] is False
    assert client.delete("/v1/snapshots/1/pin").json() == {
        "version": 1,
        "pinned": False,
        "changed": True,
        "reason": None,
        "by": "anonymous",
        "at": None,
    }
    assert client.delete("/v1/snapshots/1/pin").json()["changed"] is False
    assert_error(client.post("/v1/snapshots/1/pin", json={"reason": ""}), 422)
    assert_error(client.post("/v1/snapshots/42/pin", json={"reason": "x"}), 404)


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("random() < 0.5", "is not allowed (allowed: abs,"),  # not a pure row predicate
        ("count(*) > 0", "aggregate function count is not allowed"),
        ("stream = 1 /* why */", "comments are not allowed"),
        ("row IN (SELECT 1 FROM read_csv('/etc/passwd'))", "subqueries are not allowed"),
        ("stream + 1", "must be a boolean expression"),
        ("$1 = stream", "parameters are not allowed"),
    ],
)
def test_a_patch_where_is_checked_by_the_recipe_predicate_rules(
    client: TestClient, where: str, says: str
) -> None:
    """The patch ``where`` goes through the one predicate validator
    (materializer/predicates.py, an allowlist), answered as a 400 that says what is
    wrong; nothing is published."""
    count = client.get("/v1/snapshots").json()["count"]
    error = assert_error(
        client.post("/v1/snapshots/1/patch", json={"reason": "x", "where": where}),
        400,
        "invalid_sql",
    )
    assert says in error["message"], error
    assert (error["details"]["path"], error["details"]["reason"]) == ("where", "predicate")
    assert client.get("/v1/snapshots").json()["count"] == count


def test_a_patch_where_names_the_column_the_manifest_lacks(client: TestClient) -> None:
    error = assert_error(
        client.post("/v1/snapshots/1/patch", json={"reason": "x", "where": "strem = 1"}),
        400,
        "invalid_sql",
    )
    assert (error["details"]["column"], error["details"]["reason"]) == ("strem", "column")
    assert "unknown column 'strem' (did you mean 'stream'?)" in error["message"]


# -- idempotent cuts --------------------------------------------------------------------
CUT_RECIPE: dict[str, Any] = world_recipe("idempotent-cut", seed=11)


@pytest.fixture
def cutter(tmp_path: Path) -> Iterator[tuple[str, World]]:
    """A fresh world (no versions yet) served by uvicorn, cutting for real."""
    world = build_world(tmp_path / "world", snapshots=0)
    with serve(create_app(world.settings(), catalog=world.catalog)) as url:
        yield url, world


def _cut(url: str, recipe: dict[str, Any], **extra: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/snapshots", json={"recipe": recipe, **extra}, timeout=60)


def _version_of(url: str, response: httpx.Response) -> int:
    """The version a cut request names: at once (200) or once its job is done (202)."""
    body = response.json()
    if response.status_code == 200:
        assert response.headers["location"] == f"/v1/snapshots/{body['version']}"
        return int(body["version"])
    assert response.status_code == 202, response.text
    assert response.headers["location"] == f"/v1/jobs/{body['id']}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/v1/jobs/{body['id']}", timeout=30).json()
        if job["state"] in ("succeeded", "failed"):
            assert job["state"] == "succeeded", job
            return int(job["result"]["version"])
        time.sleep(0.05)
    raise AssertionError(f"job {body['id']} did not finish")


def test_eight_concurrent_identical_cuts_make_one_version(cutter: tuple[str, World]) -> None:
    url, world = cutter
    barrier = threading.Barrier(8)

    def post(_: int) -> httpx.Response:
        barrier.wait(30)
        return _cut(url, CUT_RECIPE)

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(post, range(8)))
    assert {r.status_code for r in responses} <= {200, 202}
    # Every request that started or joined a job names the same one.
    job_ids = {r.json()["id"] for r in responses if r.status_code == 202}
    assert len(job_ids) == 1, job_ids
    versions = {_version_of(url, r) for r in responses}
    assert versions == {1}
    assert world.registry.versions() == [1]
    jobs = httpx.get(f"{url}/v1/jobs", params={"kind": "cut"}, timeout=30).json()
    assert jobs["count"] == 1
    # Once published, the same request is answered at once with that version.
    again = _cut(url, CUT_RECIPE)
    assert again.status_code == 200 and again.json()["version"] == 1
    assert again.headers["location"] == "/v1/snapshots/1"
    snapshot = world.registry.get(1).snapshot
    assert again.json()["inputs_sha256"] == snapshot["inputs_sha256"]
    assert jobs["data"][0]["params"]["inputs_sha256"] == snapshot["inputs_sha256"]


def test_a_new_recipe_a_new_commit_or_new_version_true_make_new_versions(
    cutter: tuple[str, World],
) -> None:
    url, world = cutter
    assert _version_of(url, _cut(url, CUT_RECIPE)) == 1
    # Asked for explicitly: a new version of the same inputs, with the same artifacts.
    forced = _cut(url, CUT_RECIPE, new_version=True)
    assert forced.status_code == 202
    assert _version_of(url, forced) == 2
    one, two = world.registry.get(1), world.registry.get(2)
    assert one.snapshot["inputs_sha256"] == two.snapshot["inputs_sha256"]
    assert one.snapshot["artifacts"] == two.snapshot["artifacts"]
    # Same inputs again: the newest version that has them.
    assert _cut(url, CUT_RECIPE).json()["version"] == 2
    # Another recipe: a new version.
    changed = {**CUT_RECIPE, "seed": 12}
    assert _version_of(url, _cut(url, changed)) == 3
    # A new catalog commit: the pin moved, so the same recipe makes a new version.
    world.catalog.add_scores(
        [
            {"clip_id": c, "filter_name": "aesthetic", "filter_version": "2", "score": 9.0}
            for c in world.train_clips[:2]
        ]
    )
    after = _cut(url, CUT_RECIPE)
    assert after.status_code == 202
    assert _version_of(url, after) == 4
    four = world.registry.get(4).snapshot
    assert four["inputs_sha256"] != one.snapshot["inputs_sha256"]
    assert four["catalog_snapshot_ids"] != one.snapshot["catalog_snapshot_ids"]
    assert_error(_cut(url, CUT_RECIPE, new_version="maybe"), 422)
    assert world.registry.versions() == [1, 2, 3, 4]


def test_the_client_cuts_through_the_service_idempotently(cutter: tuple[str, World]) -> None:
    from materializer.recipe import load_recipe
    from service.client import HttpClient

    url, world = cutter
    recipe = load_recipe(CUT_RECIPE)
    client = HttpClient(url)
    first = client.cut(recipe)
    again = client.cut(recipe)  # a 200
    forced = client.cut(recipe, new_version=True)
    assert (first["version"], again["version"], forced["version"]) == (1, 1, 2)
    assert world.registry.versions() == [1, 2]


def test_a_cut_job_cuts_the_state_its_request_resolved(tmp_path: Path) -> None:
    from service.deps import _default_cut

    world = build_world(tmp_path / "world", snapshots=0)
    scores = [
        {"clip_id": c, "filter_name": "aesthetic", "filter_version": "2", "score": 8.0}
        for c in world.train_clips[:1]
    ]

    def cut(catalog: Any, registry: Any, recipe: Any, progress: Any, *, pin: Any = None) -> Any:
        catalog.add_scores(scores)  # a commit lands after the request resolved its pin
        return _default_cut(catalog, registry, recipe, progress, pin=pin)

    with serve(create_app(world.settings(), catalog=world.catalog, cut=cut)) as url:
        response = _cut(url, CUT_RECIPE)
        version = _version_of(url, response)
        params = httpx.get(f"{url}/v1/jobs/{response.json()['id']}", timeout=30).json()["params"]
    snapshot = world.registry.get(version).snapshot
    assert snapshot["catalog_snapshot_ids"] == params["catalog_snapshot_ids"]
    assert snapshot["catalog_snapshot_ids"] != world.catalog.pin().to_dict()
    assert snapshot["inputs_sha256"] == params["inputs_sha256"]
