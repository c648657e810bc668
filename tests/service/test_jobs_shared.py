"""Job records shared by replicas on one PostgreSQL catalog: a job created on one
replica is listed and pollable on another, identical requests at two replicas share
one job, and a crashed replica's jobs are marked interrupted as on SQLite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.job_store import JobStore, open_job_store
from service.job_store_pg import PostgresJobStore, job_table_name
from service.jobs import JobRunner
from service.settings import Settings
from tests.service.support import TestClient

pytestmark = pytest.mark.postgres


def _settings(home: Path, url: str, namespace: str) -> Settings:
    return Settings(home=home, catalog_uri=url, namespace=namespace)


@pytest.fixture
def replicas(postgres_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, TestClient]]:
    """Two apps on one PostgreSQL catalog, each with its own home (nothing shared on
    disk: what they share is the database)."""
    namespace = f"t_{uuid.uuid4().hex[:12]}"
    a = create_app(_settings(tmp_path / "a", postgres_url, namespace))
    b = create_app(_settings(tmp_path / "b", postgres_url, namespace))
    with TestClient(a) as ca, TestClient(b) as cb:
        yield ca, cb


def _runner(client: TestClient) -> JobRunner:
    runner: JobRunner = client.app.state.services.runner  # type: ignore[attr-defined]
    return runner


def _poll(client: TestClient, job_id: str, until: Callable[[dict[str, Any]], bool]) -> Any:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        body = client.get(f"/v1/jobs/{job_id}").json()
        if until(body):
            return body
        time.sleep(0.02)
    raise AssertionError(f"job {job_id}: {client.get(f'/v1/jobs/{job_id}').json()}")


def test_a_job_created_on_one_replica_is_seen_and_polled_on_another(
    replicas: tuple[TestClient, TestClient],
) -> None:
    a, b = replicas
    gate = threading.Event()

    def work(progress: Callable[[str, float], None]) -> dict[str, Any]:
        progress("plan", 0.5)
        gate.wait(10)
        return {"version": 7}

    assert isinstance(_runner(b).store, PostgresJobStore)
    job = _runner(a).submit("cut", work, {"recipe": "r"}, owner="alice")
    running = _poll(b, job.id, lambda body: body["stage"] == "plan")
    assert running["state"] == "running" and running["owner"] == "alice"
    assert [j["id"] for j in b.get("/v1/jobs").json()["data"]] == [job.id]
    gate.set()
    done = _poll(b, job.id, lambda body: body["state"] == "succeeded")
    assert done["result"] == {"version": 7} and done["progress"] == 1.0
    assert b.get("/v1/jobs", params={"state": "succeeded"}).json()["count"] == 1
    assert b.get("/v1/jobs/job_nope").status_code == 404


def test_identical_requests_at_two_replicas_share_one_job(
    replicas: tuple[TestClient, TestClient],
) -> None:
    a, b = replicas
    gate = threading.Event()

    def wait(progress: Callable[[str, float], None]) -> None:
        gate.wait(10)

    first, created = _runner(a).submit_once("cut", wait, {}, key="k")
    again, joined_created = _runner(b).submit_once("cut", lambda p: None, {}, key="k")
    gate.set()
    assert created and not joined_created and again.id == first.id
    assert _poll(a, first.id, lambda body: body["state"] == "succeeded")["state"] == "succeeded"


def test_the_jobs_of_two_namespaces_stay_apart(postgres_url: str, tmp_path: Path) -> None:
    one = PostgresJobStore(postgres_url, namespace=f"t_{uuid.uuid4().hex[:12]}")
    two = PostgresJobStore(postgres_url, namespace=f"t_{uuid.uuid4().hex[:12]}")
    job = one.create("cut", {}, owner=None, runner_id="r")
    assert [r.id for r in one.list()] == [job.id] and two.list() == []
    assert isinstance(open_job_store(postgres_url, "vidlake", tmp_path), PostgresJobStore)
    assert isinstance(open_job_store("sqlite:///x.db", "vidlake", tmp_path), JobStore)
    with pytest.raises(Exception, match="cannot name a PostgreSQL jobs table"):
        job_table_name('bad"; DROP TABLE x; --')


def test_calls_reuse_a_kept_connection_and_replace_one_the_server_dropped(
    postgres_url: str,
) -> None:
    import psycopg2

    store = PostgresJobStore(postgres_url, namespace=f"t_{uuid.uuid4().hex[:12]}")
    opened: list[Any] = []
    real_open = store._open

    def counting_open() -> Any:
        opened.append(con := real_open())
        return con

    store._open = counting_open  # type: ignore[method-assign]
    job = store.create("cut", {}, owner=None, runner_id="r")
    store.start(job.id)
    for i in range(20):
        store.progress(job.id, "plan", i / 20)
    assert store.get(job.id).progress == pytest.approx(0.95)
    # One connection for the table's creation, one kept for every call after it.
    assert len(opened) == 2
    # The server drops the kept connection (a restart, an idle timeout): the next call
    # notices before its transaction and opens a fresh one; nothing fails.
    admin = psycopg2.connect(**store._args)
    with admin, admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", (opened[-1].get_backend_pid(),))
    admin.close()
    assert store.get(job.id).id == job.id and len(opened) == 3
    store.close()
    assert opened[-1].closed


_CRASHER = """
import sys, threading
from service.job_store_pg import PostgresJobStore
from service.jobs import JobRunner
runner = JobRunner(PostgresJobStore(sys.argv[1], namespace=sys.argv[2]))
started = threading.Event()
def work(progress):
    progress("plan", 0.4)
    started.set()
    threading.Event().wait()
job = runner.submit("cut", work, {})
started.wait(30)
print(job.id, flush=True)
threading.Event().wait()
"""


def test_a_crashed_replicas_running_job_is_marked_interrupted(postgres_url: str) -> None:
    namespace = f"t_{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHER, postgres_url, namespace],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    store = PostgresJobStore(postgres_url, namespace=namespace)
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip()
        assert job_id.startswith("job_"), job_id
        assert store.get(job_id).state == "running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert store.get(job_id).state == "running"  # nobody has looked yet
    runner = JobRunner(store)  # another replica of this host starts
    assert runner.recovered == 1
    record = store.get(job_id)
    assert record.state == "failed" and record.error is not None
    assert record.error["code"] == "interrupted"
    assert record.stage == "plan" and record.progress == pytest.approx(0.4)
    runner.close()
    assert JobRunner(store).recovered == 0
