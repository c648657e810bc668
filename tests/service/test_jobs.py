"""Background jobs: lifecycle, persistence across a crash, racing cuts, and the
``POST /v1/snapshots`` → ``GET /v1/jobs/{id}`` round trip."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import Conflict
from manifests.registry import SnapshotRecord
from service.app import create_app
from service.jobs import JobRecord, JobRunner, JobStore
from tests.service.support import (
    TestClient,
    World,
    artifact_table,
    assert_error,
    world_recipe,
    write_fake_cut,
)

RECIPE = Path(__file__).resolve().parents[2] / "docs" / "recipes" / "warmup_256p.yaml"


def wait_done(get: Callable[[], JobRecord], timeout: float = 20.0) -> JobRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = get()
        if record.done:
            return record
        time.sleep(0.02)
    raise AssertionError(f"job not done after {timeout} s: {get()}")


def test_lifecycle_progress_result_and_errors(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    runner = JobRunner(store, workers=2)
    gate = threading.Event()
    seen: list[tuple[str | None, float]] = []

    def work(progress: Callable[[str, float], None]) -> dict[str, Any]:
        progress("scan", 0.0)
        progress("scan", 0.5)
        gate.wait(10)
        progress("plan", 0.25)
        return {"version": 3}

    job = runner.submit("cut", work, {"recipe": "r"}, owner="alice")
    assert job.state == "queued" and job.params == {"recipe": "r"} and job.owner == "alice"
    deadline = time.monotonic() + 10
    while store.get(job.id).state != "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    running = store.get(job.id)
    seen.append((running.stage, running.progress))
    assert running.state == "running" and running.started_at is not None
    gate.set()
    done = wait_done(lambda: store.get(job.id))
    assert (done.state, done.progress, done.result, done.error) == (
        "succeeded",
        1.0,
        {"version": 3},
        None,
    )
    assert done.finished_at is not None and done.duration_s is not None and done.duration_s >= 0

    def conflict(progress: Callable[[str, float], None]) -> None:
        raise Conflict("version 4 was claimed first", version=4, latest=4)

    def crash(progress: Callable[[str, float], None]) -> None:
        raise RuntimeError("boom")

    lost_id = runner.submit("cut", conflict, {}).id
    lost = wait_done(lambda: store.get(lost_id))
    assert lost.state == "failed"
    assert lost.error == {
        "code": "conflict",
        "message": "version 4 was claimed first",
        "details": {"version": 4, "latest": 4},
    }
    bug_id = runner.submit("cut", crash, {}).id
    bug = wait_done(lambda: store.get(bug_id))
    assert bug.error is not None and bug.error["code"] == "internal_error"
    assert [j.id for j in store.list()][:1] == [bug.id]  # newest first
    assert store.counts() == {"queued": 0, "running": 0, "succeeded": 1, "failed": 2}
    assert [j.state for j in store.list(state="failed")] == ["failed", "failed"]
    runner.close()


_CRASHER = """
import sys, time
from service.jobs import JobRunner, JobStore
runner = JobRunner(JobStore(sys.argv[1]))
def forever(progress):
    progress("plan", 0.4)
    time.sleep(600)
job = runner.submit("cut", forever, {"n": 1})
while JobStore(sys.argv[1]).get(job.id).stage != "plan":
    time.sleep(0.01)
print(job.id, flush=True)
time.sleep(600)
"""


def test_interrupted_job_shows_failed_after_restart(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHER, str(db)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip()
        assert job_id.startswith("job_"), job_id
        assert JobStore(db).get(job_id).state == "running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = JobStore(db)
    assert store.get(job_id).state == "running"  # nobody has looked yet
    runner = JobRunner(store)  # the restarted service
    assert runner.recovered == 1
    record = store.get(job_id)
    assert record.state == "failed" and record.error is not None
    assert record.error["code"] == "interrupted"
    assert record.stage == "plan" and record.progress == pytest.approx(0.4)
    runner.close()
    assert JobRunner(JobStore(db)).recovered == 0  # recorded once, not again


def test_closing_a_runner_fails_its_queued_jobs(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    runner = JobRunner(store, workers=1)
    gate = threading.Event()

    def blocked(progress: Callable[[str, float], None]) -> None:
        gate.wait(10)

    first = runner.submit("cut", blocked, {})
    second = runner.submit("cut", lambda p: None, {})
    threading.Timer(0.2, gate.set).start()
    runner.close(wait=True)
    assert store.get(first.id).state == "succeeded"
    assert store.get(second.id).state == "failed"
    error = store.get(second.id).error
    assert error is not None and error["code"] == "interrupted"


# -- through the API --------------------------------------------------------------------
@pytest.fixture(scope="module")
def cut_client(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """An app whose cuts publish fake artifacts; cuts racing for a version meet at a
    barrier after reading the parent, so that both claim the same version."""
    work = tmp_path_factory.mktemp("cuts")
    barrier = threading.Barrier(2, timeout=20)
    counter = iter(range(100, 10_000))

    def cut(
        catalog: Any, registry: Any, recipe: Any, progress: Any, *, pin: Any = None
    ) -> SnapshotRecord:
        progress("select", 0.5)
        seed = next(counter)
        paths, snapshot = write_fake_cut(world, work / f"cut{seed}", seed=seed)
        parent = registry.next_parent()
        if recipe.description == "race":
            barrier.wait()
        progress("publish", 0.9)
        record: SnapshotRecord = registry.publish(paths, snapshot, parent=parent)
        return record

    with TestClient(create_app(world.settings(), catalog=world.catalog, cut=cut)) as c:
        yield c


def poll(client: TestClient, job_id: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if body["state"] in ("succeeded", "failed"):
            return body
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish")


def test_cut_job_round_trip(cut_client: TestClient) -> None:
    before = cut_client.get("/v1/snapshots").json()["count"]
    # Its own description: the fake cut's version must not answer the real cut below.
    recipe = {**REAL_RECIPE, "description": "round trip"}
    r = cut_client.post("/v1/snapshots", json={"recipe": recipe})
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["kind"] == "cut" and job["state"] in ("queued", "running")
    assert job["params"]["recipe_name"] == "svc-real-cut"
    done = poll(cut_client, job["id"])
    assert done["state"] == "succeeded" and done["progress"] == 1.0, done
    version = done["result"]["version"]
    assert cut_client.get(f"/v1/snapshots/{version}").status_code == 200
    assert cut_client.get("/v1/snapshots").json()["count"] == before + 1
    listed = cut_client.get("/v1/jobs", params={"kind": "cut"}).json()
    assert job["id"] in [j["id"] for j in listed["data"]]
    assert 'vidlake_cut_seconds_count{outcome="succeeded"}' in cut_client.get("/metrics").text


def test_racing_cuts_one_wins_one_reports_conflict(cut_client: TestClient) -> None:

    recipe = {**REAL_RECIPE, "description": "race"}
    # Identical requests would share one job: asking for new versions makes two cuts.
    jobs = [
        cut_client.post("/v1/snapshots", json={"recipe": recipe, "new_version": True}).json()
        for _ in range(2)
    ]
    results = sorted((poll(cut_client, j["id"]) for j in jobs), key=lambda j: j["state"])
    assert [j["state"] for j in results] == ["failed", "succeeded"]
    lost, won = results
    assert lost["error"]["code"] == "conflict"
    assert lost["error"]["details"]["version"] == won["result"]["version"]


def test_bad_recipes_start_no_job(cut_client: TestClient) -> None:
    before = cut_client.get("/v1/jobs").json()["count"]
    error = assert_error(
        cut_client.post("/v1/snapshots", json={"recipe": {"name": "x"}}), 422, "invalid_recipe"
    )
    assert "path" in error["details"]
    assert_error(cut_client.post("/v1/snapshots", json={"recipe": str(RECIPE)}), 422)
    assert_error(cut_client.post("/v1/snapshots", json={"recipe": "a: [unclosed"}), 422)
    # Well formed but wrong for this catalog (a tokenizer, a stream matching nothing):
    # refused when asked, as recipes:validate does, not by a job that fails later.
    wrong = assert_error(
        cut_client.post("/v1/snapshots", json={"recipe": RECIPE.read_text()}), 422, "invalid_recipe"
    )
    assert wrong["details"]["path"] == "tokenizer_version"
    typo = {
        **REAL_RECIPE,
        "streams": [*REAL_RECIPE["streams"], {"name": "c", "where": "source = 'x'"}],
    }
    typo["phases"] = [{**REAL_RECIPE["phases"][0], "weights": {"a": 0.4, "b": 0.3, "c": 0.3}}]
    for new_version in (False, True):
        body = {"recipe": typo, "new_version": new_version}
        error = assert_error(cut_client.post("/v1/snapshots", json=body), 422, "invalid_recipe")
        assert error["details"]["path"] == "streams[2].where"
    # Valid everywhere, but its plan would fill the disk.
    huge = {**REAL_RECIPE, "phases": [{**REAL_RECIPE["phases"][0], "steps": 10**12}]}
    for path in ("/v1/snapshots", "/v1/recipes:validate"):
        error = assert_error(cut_client.post(path, json={"recipe": huge}), 422)
        assert error["details"]["path"] == "phases[0].steps"
    assert cut_client.get("/v1/jobs").json()["count"] == before
    assert_error(cut_client.get("/v1/jobs", params={"state": "exploded"}), 422)


def test_recipe_validation_endpoint(cut_client: TestClient, world: World) -> None:
    from materializer.recipe import load_recipe

    r = cut_client.post("/v1/recipes:validate", json={"recipe": REAL_RECIPE})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["valid"] is True and body["name"] == "svc-real-cut"
    assert body["sha256"] == load_recipe(REAL_RECIPE).sha256()
    assert body["pin"] == world.catalog.pin().to_dict()
    assert_error(
        cut_client.post("/v1/recipes:validate", json={"recipe": {"seed": -1}}),
        422,
        "invalid_recipe",
    )
    # Well formed, but checked against the catalog: this one names a tokenizer the
    # world's latents do not have, and the error says which ones it has.
    error = assert_error(
        cut_client.post("/v1/recipes:validate", json={"recipe": RECIPE.read_text()}),
        422,
        "invalid_recipe",
    )
    assert error["details"]["path"] == "tokenizer_version"
    assert error["details"]["value"] == "vae-8x8x4-c16-v1"
    assert error["details"]["known"] == ["vae-v1"]
    typo = {
        **REAL_RECIPE,
        "streams": [*REAL_RECIPE["streams"], {"name": "c", "where": "source = 'stock-c'"}],
    }
    error = assert_error(
        cut_client.post("/v1/recipes:validate", json={"recipe": typo}), 422, "invalid_recipe"
    )
    assert error["details"]["path"] == "streams[2].where"


REAL_RECIPE: dict[str, Any] = world_recipe("svc-real-cut", seed=7)


def test_real_cut_job_and_its_forensics(world: World) -> None:
    """The default cut function (``materializer.cut.cut_snapshot``) end to end: the
    job succeeds, and steps and lineage answer from the artifacts it published."""
    with TestClient(create_app(world.settings(), catalog=world.catalog)) as client:
        job = client.post("/v1/snapshots", json={"recipe": REAL_RECIPE}).json()
        done = poll(client, job["id"], timeout=120)
        assert done["state"] == "succeeded", done
        assert done["stage"] == "publish"
        v = done["result"]["version"]
        snapshot = client.get(f"/v1/snapshots/{v}").json()
        assert "lineage.arrow" in snapshot["artifacts"]
        plan = artifact_table(world.registry, v, "plan.arrow").to_pylist()
        index = artifact_table(world.registry, v, "index.arrow")
        step = client.get(f"/v1/snapshots/{v}/steps/0").json()
        assert [s["row"] for s in step["samples"]] == plan[0]["rows"]
        for sample in step["samples"]:
            assert sample["asset_id"] == world.clips[sample["clip_id"]]
            assert sample["stream"] in ("a", "b") and sample["tier"] is not None
            assert set(sample["scores"]) == {"aesthetic"}  # from the manifest's score column
            assert world.clip_split[sample["clip_id"]] == "train"
        clip = index.column("clip_id")[0].as_py()
        served = {
            s["version"]: s for s in client.get(f"/v1/lineage/clips/{clip}").json()["snapshots"]
        }
        # lineage.arrow and a scan of the plan agree on the steps that served the clip.
        expected = sorted(p["step"] for p in plan if 0 in p["rows"])
        assert served[v]["rows"] == [0] and served[v]["steps"] == expected


# -- once per key -------------------------------------------------------------------------
def test_submit_once_shares_one_job_per_key_until_it_fails(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    runner = JobRunner(store, workers=4)
    gate = threading.Event()
    runs: list[str] = []

    def work(progress: Callable[[str, float], None]) -> dict[str, Any]:
        runs.append("ran")
        gate.wait(10)
        return {"version": 1}

    barrier = threading.Barrier(8)

    def submit(_: int) -> tuple[JobRecord, bool]:
        barrier.wait(10)
        return runner.submit_once("cut", work, {"k": "a"}, key="key-a")

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(submit, range(8)))
    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1
    other, created = runner.submit_once("cut", work, {}, key="key-b")  # another key: its own
    assert created and other.id != results[0][0].id
    gate.set()
    done = wait_done(lambda: store.get(results[0][0].id))
    assert done.state == "succeeded" and runs == ["ran", "ran"]
    # A succeeded job still answers for its key; a failed one does not.
    again, created = runner.submit_once("cut", work, {}, key="key-a")
    assert (again.id, created) == (done.id, False)

    def conflict(progress: Callable[[str, float], None]) -> None:
        raise Conflict("lost", version=2, latest=2)

    lost, _ = runner.submit_once("cut", conflict, {}, key="key-c")
    assert wait_done(lambda: store.get(lost.id)).state == "failed"
    retry, created = runner.submit_once("cut", work, {}, key="key-c")
    assert created and retry.id != lost.id
    wait_done(lambda: store.get(retry.id))
    # The same key under another kind is another job.
    assert runner.submit_once("export", work, {}, key="key-a")[1]
    # A job submitted unconditionally under a key (a forced new version) is joined too.
    forced = runner.submit("cut", work, {}, key="key-d")
    forced_again = runner.submit("cut", work, {}, key="key-d")
    assert forced_again.id != forced.id
    joined, created = runner.submit_once("cut", work, {}, key="key-d")
    assert not created and joined.id == forced_again.id  # the newest
    runner.close()


def test_a_job_file_from_before_dedupe_keys_is_upgraded(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as con:  # the schema as it was, with one old job
        con.executescript(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL,"
            " stage TEXT, progress REAL NOT NULL DEFAULT 0, params TEXT NOT NULL, result TEXT,"
            " error TEXT, owner TEXT, host TEXT NOT NULL, pid INTEGER NOT NULL,"
            " runner_id TEXT NOT NULL, created_at TEXT NOT NULL, started_at TEXT,"
            " finished_at TEXT);"
            "INSERT INTO jobs (id, kind, state, params, host, pid, runner_id, created_at,"
            " result) VALUES ('job_old', 'cut', 'succeeded', '{}', 'h', 1, 'r',"
            " '2026-01-01T00:00:00+00:00', '{\"version\": 1}');"
        )
    con.close()
    store = JobStore(path)
    assert store.get("job_old").result == {"version": 1}
    job, created = store.create_once("cut", {}, key="k", owner=None, runner_id="r")
    assert created and store.create_once("cut", {}, key="k", owner=None, runner_id="r") == (
        job,
        False,
    )
