"""The SQLite job store keeps one connection per thread (issue 16: ``GET /v1/jobs``
opened and closed one per call), and stays correct with it: threads, nested
transactions, rollbacks, a forked child."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from service import job_store
from service.job_store import JobStore


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Thread ids of every ``sqlite3.connect`` the job store makes."""
    made: list[int] = []
    real = sqlite3.connect

    def counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        made.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(job_store.sqlite3, "connect", counting)
    return made


def test_many_calls_one_connection(tmp_path: Path, connects: list[int]) -> None:
    store = JobStore(tmp_path / "jobs.db")
    job = store.create("cut", {"r": 1}, owner=None, runner_id="x")
    before = len(connects)
    for _ in range(20):
        assert [r.id for r in store.list()] == [job.id]
        assert store.get(job.id).state == "queued"
    store.counts()
    assert len(connects) == before  # every call reused the kept connection
    assert before <= 2  # the schema's one-off connection, then the kept one


def test_each_thread_its_own(tmp_path: Path, connects: list[int]) -> None:
    store = JobStore(tmp_path / "jobs.db")
    store.counts()
    start = len(connects)

    # Every thread stays alive until all have worked: a finished thread's id can be
    # given to the next one, and then two threads would look like one.
    together = threading.Barrier(3)

    def work() -> None:
        for i in range(5):
            store.create("cut", {"i": i}, owner=None, runner_id="x")
        together.wait(timeout=60)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(connects) - start == 3  # one per thread, not one per call
    assert len(set(connects[start:])) == 3
    assert store.counts()["queued"] == 15


def test_rollback_and_nested_transactions(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    with pytest.raises(RuntimeError), store._connect() as tx:
        tx.run(
            "INSERT INTO jobs (id, kind, state, params, host, pid, runner_id, created_at)"
            " VALUES ('a', 'cut', 'queued', '{}', 'h', 1, 'r', 't')"
        )
        raise RuntimeError("boom")
    assert store.list() == []  # the kept connection rolled back
    with store._connect() as outer:
        job = store.create("cut", {}, owner=None, runner_id="x")  # nested: its own
        assert outer.rows("SELECT id FROM jobs")[0]["id"] == job.id
    assert store.get(job.id).state == "queued"
    record, created = store.create_once("cut", {}, key="k", owner=None, runner_id="x")
    again, created_again = store.create_once("cut", {}, key="k", owner=None, runner_id="x")
    assert created and not created_again and again.id == record.id


def _child_lists(path: str, out: Any) -> None:
    store = _INHERITED[path]
    out.put([r.id for r in store.list()])


_INHERITED: dict[str, JobStore] = {}


def test_forked_child_opens_its_own(tmp_path: Path) -> None:
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    store = JobStore(tmp_path / "jobs.db")
    job = store.create("cut", {}, owner=None, runner_id="x")
    _INHERITED[str(store.path)] = store  # the parent's connection is held now
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_lists, args=(str(store.path), out))
    child.start()
    assert out.get(timeout=20) == [job.id]
    child.join(20)
    assert child.exitcode == 0
    assert store.get(job.id).id == job.id  # the parent's own connection still works


def test_close_drops_the_kept_connection(tmp_path: Path, connects: list[int]) -> None:
    store = JobStore(tmp_path / "jobs.db")
    store.counts()
    n = len(connects)
    store.close()
    store.counts()
    assert len(connects) == n + 1
