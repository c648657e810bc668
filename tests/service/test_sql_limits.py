"""The SQL sandbox's hard limits: time, memory (expression evaluation included),
result rows and bytes, cancellation, and a responsive server while queries run away.

Sizes are small: the caps are meant to stop each runaway query long before it costs
anything, so the exact requests of the report run here with a 128 MB memory limit
and a one-second deadline.
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.sql import Sandbox
from tests.service.support import TestClient, World, assert_error, serve

LIMIT_MB, TIMEOUT_S = 128, 1.0
RUNAWAY = [
    "SELECT length(repeat('x', 1000000000))",
    "SELECT list_sum(range(50000000))",
    "SELECT list_sum(range(100000000))",
    "SELECT count(*) FROM unnest(range(2000000000))",
]
#: A constant DuckDB evaluates in uninterruptible calls (~300 MB, ~2 s here).
UNINTERRUPTIBLE = "SELECT md5(repeat(repeat('a', 10000), 30000))"


def _settings(world: World, **extra: Any) -> Any:
    base = {
        "sql_memory_limit": f"{LIMIT_MB}MB",
        "sql_timeout_s": TIMEOUT_S,
        "sql_workers": 2,
        "sql_row_limit": 100_000,
    }
    return world.settings(**(base | extra))


@pytest.fixture(scope="module")
def limits_app(world: World) -> Any:
    return create_app(_settings(world, sql_result_bytes=256 * 1024), catalog=world.catalog)


@pytest.fixture(scope="module")
def limits_client(limits_app: Any) -> Iterator[TestClient]:
    with TestClient(limits_app) as c:
        yield c


def _sandbox(app: Any) -> Sandbox:
    sandbox: Sandbox = app.state.services.sandbox
    return sandbox


class _PeakRss:
    """Peak summed RSS (MB) of the pool's worker processes while in use."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox, self.peak, self._stop = sandbox, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            total = 0
            for pid in self.sandbox.pool.pids():
                try:
                    with open(f"/proc/{pid}/statm") as f:
                        total += int(f.read().split()[1]) * 4096
                except OSError:
                    pass
            self.peak = max(self.peak, total / 2**20)
            time.sleep(0.005)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("query", RUNAWAY)
def test_runaway_scalar_work_is_stopped(
    limits_client: TestClient, limits_app: Any, query: str
) -> None:
    sandbox = _sandbox(limits_app)
    sandbox.pool.warm(1)
    limits_client.post("/v1/sql", json={"query": "SELECT 1"})
    idle = sum(_rss_mb(p) for p in sandbox.pool.pids())
    with _PeakRss(sandbox) as rss:
        start = time.monotonic()
        r = limits_client.post("/v1/sql", json={"query": query})
        took = time.monotonic() - start
    error = assert_error(r, 400, "invalid_sql")
    assert error["details"]["reason"] in ("memory", "timeout"), error
    assert took <= TIMEOUT_S + 1.0, took
    workers = max(1, len(sandbox.pool.pids()))
    assert rss.peak - idle <= LIMIT_MB + 256 + 64 * workers, (rss.peak, idle)
    ok = limits_client.post("/v1/sql", json={"query": "SELECT 41 + 1 AS x"})
    assert ok.status_code == 200 and ok.json()["rows"] == [[42]]


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    except OSError:
        return 0.0


def test_memory_cap_holds_for_a_constant_expression(limits_client: TestClient) -> None:
    """400 MB of one string is over 128 MB + headroom: refused, not served."""
    r = limits_client.post("/v1/sql", json={"query": "SELECT length(repeat('x', 400000000))"})
    assert assert_error(r, 400, "invalid_sql")["details"]["reason"] == "memory"


def test_uninterruptible_expression_meets_the_deadline(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB cannot interrupt one long scalar call: the pool kills the worker.

    The grace a worker gets to report its own timeout is set to nothing here: on a
    fast box the expression (0.6-1 s) can finish inside deadline + grace, and the
    worker then answers ``timeout`` itself, which is right but not the kill path."""
    monkeypatch.setattr("service.sql.pool.GRACE_S", 0.0)
    settings = _settings(world, sql_timeout_s=0.2, sql_memory_limit="512MB")
    app = create_app(settings, catalog=world.catalog)
    with TestClient(app) as client:
        _sandbox(app).pool.warm(1)
        client.post("/v1/sql", json={"query": "SELECT 1"})
        start = time.monotonic()
        r = client.post("/v1/sql", json={"query": UNINTERRUPTIBLE})
        took = time.monotonic() - start
        error = assert_error(r, 400, "invalid_sql")
        assert error["details"]["reason"] == "timeout", error
        # The goal is deadline + 1 s (benchmarks/sql_limits.py measures it); here a
        # second more of slack, for a shared box where scheduling alone can cost that.
        assert took <= 0.2 + 2.0, took
        assert _sandbox(app).pool.stats["killed"] >= 1, _sandbox(app).pool.stats
        # The killed worker is replaced (its start counts against a 0.2 s deadline,
        # so the first tries may time out while it boots).
        until = time.monotonic() + 60
        while client.post("/v1/sql", json={"query": "SELECT 1"}).status_code != 200:
            assert time.monotonic() < until, "the pool did not recover"
            time.sleep(0.2)


def test_json_encoding_runs_inside_the_deadline(limits_client: TestClient) -> None:
    """The reported 3,000-column constant select over 2,788 rows: stopped at the
    deadline (or the byte cap), never encoded for half a minute by the server."""
    columns = ", ".join(f"{i} AS c{i}" for i in range(3000))
    query = f"SELECT {columns} FROM (SELECT unnest(range(2788)) AS r) t"
    start = time.monotonic()
    r = limits_client.post("/v1/sql", json={"query": query})
    took = time.monotonic() - start
    assert took <= TIMEOUT_S + 1.0, took
    if r.status_code == 200:
        body = r.json()
        rows = json.dumps(body["rows"], separators=(",", ":"))
        assert body["truncated"] and len(rows) <= 256 * 1024
    else:
        assert assert_error(r, 400, "invalid_sql")["details"]["reason"] == "timeout"


def test_result_is_capped_in_bytes(limits_client: TestClient) -> None:
    query = "SELECT i, repeat('x', 1000) AS pad FROM (SELECT unnest(range(10000)) AS i) t"
    body = limits_client.post("/v1/sql", json={"query": query}).json()
    assert body["truncated"] and 0 < body["row_count"] < 10000
    assert [r[0] for r in body["rows"]] == list(range(body["row_count"]))
    arrow = limits_client.post(
        "/v1/sql", json={"query": query}, headers={"Accept": "application/vnd.apache.arrow.stream"}
    )
    assert arrow.headers["x-vidlake-truncated"] == "true"
    assert len(arrow.content) <= 256 * 1024 + 16 * 1024
    too_big = limits_client.post("/v1/sql", json={"query": "SELECT repeat('x', 300000) AS big"})
    error = assert_error(too_big, 400, "invalid_sql")
    assert error["details"]["reason"] == "result_too_large"


def test_patch_predicate_cannot_reach_the_expensive_functions(
    limits_client: TestClient, world: World
) -> None:
    """A patch's where is checked by the recipe predicate allowlist before DuckDB sees
    it, so what would run into the sandbox's memory or time limit as a query is
    refused at once; the sandbox stays behind it as the second wall."""
    before = limits_client.get("/v1/snapshots").json()["count"]
    for where in [
        "length(repeat('x', 1000000000)) > 0",
        "list_sum(range(100000000)) > 0",
        "md5(repeat(repeat('a', 10000), 30000)) = clip_id",
    ]:
        start = time.monotonic()
        r = limits_client.post(
            f"/v1/snapshots/{world.versions[0]}/patch", json={"reason": "spike", "where": where}
        )
        assert time.monotonic() - start <= TIMEOUT_S + 1.0
        error = assert_error(r, 400, "invalid_sql")
        assert error["details"]["reason"] == "predicate"
        assert "is not allowed (allowed:" in error["message"]
    assert limits_client.get("/v1/snapshots").json()["count"] == before


def _raw_post(url: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/sql HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def test_a_dropped_client_cancels_its_query(world: World) -> None:
    slow = (
        b'{"query": "SELECT sum(a * b) FROM (SELECT unnest(range(200000)) AS a) x, '
        b'(SELECT unnest(range(200000)) AS b) y"}'
    )
    app = create_app(_settings(world, sql_timeout_s=60.0), catalog=world.catalog)
    with serve(app) as url:
        pool = _sandbox(app).pool
        pool.warm(1)
        assert httpx.post(f"{url}/v1/sql", json={"query": "SELECT 1"}).status_code == 200
        sock = _raw_post(url, slow)
        deadline = time.monotonic() + 10
        while not any(_rss_mb(p) for p in pool.pids()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the query is running in a worker now
        sock.close()
        deadline = time.monotonic() + 5
        while pool.stats["cancelled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.stats["cancelled"] == 1, pool.stats


def test_health_stays_fast_while_queries_run_away(world: World) -> None:
    spin = (
        "SELECT sum(a * b) FROM (SELECT unnest(range(100000)) AS a) x, "
        "(SELECT unnest(range(100000)) AS b) y"
    )
    app = create_app(_settings(world, sql_timeout_s=3.0), catalog=world.catalog)
    with serve(app) as url:
        _sandbox(app).pool.warm(2)
        httpx.get(f"{url}/v1/health")
        threads = [
            threading.Thread(
                target=httpx.post,
                args=(f"{url}/v1/sql",),
                kwargs={"json": {"query": q}, "timeout": 30},
            )
            for q in (spin, spin, RUNAWAY[1], _wide())
        ]
        for t in threads:
            t.start()
        time.sleep(0.3)
        latencies = []
        for _ in range(15):
            start = time.monotonic()
            assert httpx.get(f"{url}/v1/health", timeout=30).status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.05)
        for t in threads:
            t.join()
    assert statistics.median(latencies) < 0.5, latencies


def _wide() -> str:
    return (
        "SELECT "
        + ", ".join(f"{i} AS c{i}" for i in range(3000))
        + " FROM (SELECT unnest(range(2788)) AS r) t"
    )


def test_interrupt_while_batches_stream_is_a_timeout(world: World) -> None:
    """A query that has started streaming batches when the deadline hits: DuckDB's
    interrupt surfaces through the Arrow reader, and must read as a timeout."""
    # A few hundred microseconds a row: the first batch streams before the deadline,
    # the 100k-row cap is far away when it hits (the byte cap is out of reach).
    query = "SELECT md5(repeat(a::VARCHAR, 20000)) AS h FROM (SELECT unnest(range(100000)) AS a) x"
    app = create_app(_settings(world, sql_result_bytes=1 << 30), catalog=world.catalog)
    with TestClient(app) as client:
        assert client.post("/v1/sql", json={"query": "SELECT 1"}).status_code == 200
        r = client.post("/v1/sql", json={"query": query})
        assert assert_error(r, 400, "invalid_sql")["details"]["reason"] == "timeout"
        assert _sandbox(app).pool.stats["recycled"] == 0  # the worker lives on


def test_a_full_pool_answers_503_by_the_deadline(world: World) -> None:
    """The one worker is held by a job with a long deadline: a query waits for a
    worker only until its own deadline, then gets 503."""
    from service.sql.worker import Job

    settings = _settings(world, sql_workers=1, sql_timeout_s=0.5)
    app = create_app(settings, catalog=world.catalog)
    spin = (
        "SELECT sum(a * b) FROM (SELECT unnest(range(100000)) AS a) x, "
        "(SELECT unnest(range(100000)) AS b) y"
    )
    hold = Job(
        sql=spin,
        allowed=frozenset(),
        views={},
        memory_limit="128MB",
        timeout_s=5.0,
        deadline=time.monotonic() + 5.0,
        max_rows=10,
        max_bytes=1 << 20,
    )
    with TestClient(app) as client:
        pool = _sandbox(app).pool
        busy = threading.Thread(target=lambda: _swallow(pool.run, hold))
        busy.start()
        until = time.monotonic() + 60
        while not pool.pids() and time.monotonic() < until:
            time.sleep(0.05)
        time.sleep(0.3)
        start = time.monotonic()
        r = client.post("/v1/sql", json={"query": "SELECT 1"})
        took = time.monotonic() - start
        busy.join()
    assert_error(r, 503, "sql_busy")
    # Its own deadline (0.5 s), not the held job's (5 s): the slack covers a loaded CI
    # box (1.53 s seen at load ~4) and still fails a query that waits for the worker.
    assert took <= 0.5 + 2.5, took


def _swallow(fn: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):  # the held job ends in a timeout; not the point
        fn(*args)


def test_a_worker_that_died_idle_is_not_used(limits_client: TestClient, limits_app: Any) -> None:
    import os
    import signal

    pool = _sandbox(limits_app).pool
    assert limits_client.post("/v1/sql", json={"query": "SELECT 1"}).status_code == 200
    for pid in pool.pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    r = limits_client.post("/v1/sql", json={"query": "SELECT 2 AS two"})
    assert r.status_code == 200 and r.json()["rows"] == [[2]], r.text


def test_workers_die_with_their_server_and_leave_no_scratch(tmp_path: Any) -> None:
    """A server killed without shutting down: its workers exit and remove their
    scratch directories by themselves."""
    import os
    import subprocess
    import sys

    script = (
        "import os, time\n"
        "from service.sql import WorkerPool\n"
        "pool = WorkerPool('128MB', 1)\n"
        "pool.warm(1)\n"
        "while not pool.pids():\n"
        "    time.sleep(0.05)\n"
        "worker = pool._all[0]\n"
        "print(worker.pid, worker.scratch, flush=True)\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    pid_text, scratch = out.stdout.split()
    until = time.monotonic() + 10
    while (os.path.exists(f"/proc/{pid_text}") or os.path.exists(scratch)) and (
        time.monotonic() < until
    ):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid_text}"), "the worker outlived its server"
    assert not os.path.exists(scratch), "the worker left its scratch directory"
