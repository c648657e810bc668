"""The SQL sandbox's hard limits under runaway queries; prints one JSON line.

Starts ``uvicorn service.app:app`` on loopback in a subprocess over an empty embedded
catalog, with a **512 MB** memory limit, a **3 s** deadline and 4 sandbox workers
(lower than the service defaults of 1 GB / 10 s, so that the run fits in about a
minute on two cores; both are in the JSON), then:

* sends each runaway query of issue 15 (and the 3,000-column constant select) alone,
  measuring the time to answer and the peak RSS of the server plus its worker
  processes (sampled every 5 ms from ``/proc``) against the RSS just before;
* keeps 4 runaway queries in flight for ``--load-s`` seconds while polling
  ``GET /v1/health`` at 20 Hz.

In-run baselines: ``GET /v1/health`` p99 of the idle server, and while 4 plain CPU
burners run at the workers' nice level for ``--load-s`` seconds (the floor on a
shared box: what any 4 busy processes cost the server). Output keys:
``queries`` (per query: status, reason, ``answer_s``, ``rss_growth_mb``),
``max_rss_over_limit_mb`` (the worst RSS growth minus the memory limit; ≤ 256 is the
goal), ``max_overrun_s`` (the worst answer time minus the deadline; ≤ 1 is the goal),
``health_p99_ms`` under load (< 200 is the goal), ``health_idle_p99_ms``,
``health_cpu_floor_p99_ms``, ``server_cpu_s`` (the server process's CPU seconds in
each of the two phases), and
``loadavg_1m`` (before, after: the box's load, for reading the latencies).

    python benchmarks/sql_limits.py
    python benchmarks/sql_limits.py --memory-limit 1GB --deadline 10   # the defaults
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WIDE = (
    "SELECT "
    + ", ".join(f"{i} AS c{i}" for i in range(3000))
    + " FROM (SELECT unnest(range(2788)) AS r) t"
)
RUNAWAY = {
    "repeat_1e9": "SELECT length(repeat('x', 1000000000))",
    "list_sum_5e7": "SELECT list_sum(range(50000000))",
    "list_sum_1e8": "SELECT list_sum(range(100000000))",
    "unnest_2e9": "SELECT count(*) FROM unnest(range(2000000000))",
    "wide_3000_cols": WIDE,
    "cross_join_spin": (
        "SELECT sum(a * b) FROM (SELECT unnest(range(1000000)) AS a) x, "
        "(SELECT unnest(range(1000000)) AS b) y"
    ),
}


def _mb(text: str) -> float:
    from service.sql.pool import parse_bytes

    return parse_bytes(text) / 2**20


def start_server(home: Path, memory_limit: str, deadline: float, workers: int) -> tuple[Any, str]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "VIDLAKE_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "VIDLAKE_SQL_MEMORY_LIMIT": memory_limit,
        "VIDLAKE_SQL_TIMEOUT_S": str(deadline),
        "VIDLAKE_SQL_WORKERS": str(workers),
    }
    command = [sys.executable, "-m", "uvicorn", "service.app:app", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(command, env=env, cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    until = time.monotonic() + 60
    while time.monotonic() < until:
        try:
            if httpx.get(f"{url}/v1/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not come up")


def _tree_rss_mb(pid: int) -> float:
    """RSS of ``pid`` plus its direct children (the sandbox workers)."""
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
    return total / 2**20


class Sampler:
    """Peak RSS of the server tree while running."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss_mb(self.pid))
            time.sleep(0.005)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_query(url: str, pid: int, sql: str) -> dict[str, Any]:
    import httpx

    httpx.post(f"{url}/v1/sql", json={"query": "SELECT 1"}, timeout=60)
    time.sleep(1.5)  # replacements of recycled workers finish starting
    before = _tree_rss_mb(pid)
    with Sampler(pid) as sampler:
        start = time.monotonic()
        r = httpx.post(f"{url}/v1/sql", json={"query": sql}, timeout=120)
        took = time.monotonic() - start
    reason = None
    if r.status_code != 200:
        reason = r.json()["error"]["details"].get("reason")
    return {
        "status": r.status_code,
        "reason": reason,
        "answer_s": round(took, 3),
        "rss_before_mb": round(before, 1),
        "rss_peak_mb": round(sampler.peak, 1),
        "rss_growth_mb": round(sampler.peak - before, 1),
    }


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000


def health_latencies(url: str, seconds: float) -> list[float]:
    import httpx

    out = []
    with httpx.Client(timeout=30) as client:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            start = time.monotonic()
            client.get(f"{url}/v1/health")
            out.append(time.monotonic() - start)
            time.sleep(0.05)
    return out


def under_load(url: str, seconds: float) -> tuple[list[float], int]:
    """Health latencies while 4 clients keep runaway queries in flight."""
    import httpx

    stop = threading.Event()
    answered = [0]
    mix = [RUNAWAY["cross_join_spin"], RUNAWAY["list_sum_1e8"], WIDE, RUNAWAY["repeat_1e9"]]

    def client(sql: str) -> None:
        while not stop.is_set():
            httpx.post(f"{url}/v1/sql", json={"query": sql}, timeout=120)
            answered[0] += 1

    threads = [threading.Thread(target=client, args=(q,), daemon=True) for q in mix]
    for t in threads:
        t.start()
    time.sleep(0.5)
    latencies = health_latencies(url, seconds)
    stop.set()
    for t in threads:
        t.join()
    return latencies, answered[0]


def under_burners(url: str, seconds: float, count: int) -> list[float]:
    """Health latencies while ``count`` plain CPU burners run at the workers' nice
    level: the floor that runaway queries are compared with on a shared box."""
    from service.sql.worker import NICE

    burn = f"import os\nos.nice({NICE})\nwhile True:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(count)]
    try:
        time.sleep(0.5)
        return health_latencies(url, seconds)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="512MB")
    parser.add_argument("--deadline", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--load-s", type=float, default=8.0)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="vidlake-sql-bench-") as tmp:
        proc, url = start_server(Path(tmp), args.memory_limit, args.deadline, args.workers)
        try:
            idle = health_latencies(url, 2.0)
            queries = {name: one_query(url, proc.pid, sql) for name, sql in RUNAWAY.items()}
            cpu0 = _cpu_s(proc.pid)
            loaded, answered = under_load(url, args.load_s)
            cpu1 = _cpu_s(proc.pid)
            floor = under_burners(url, args.load_s, 4)
            cpu2 = _cpu_s(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    limit_mb = _mb(args.memory_limit)
    over = max(q["rss_growth_mb"] for q in queries.values()) - limit_mb
    overrun = max(q["answer_s"] for q in queries.values()) - args.deadline
    health = _p99(loaded)
    print(
        json.dumps(
            {
                "benchmark": "sql_limits",
                "memory_limit": args.memory_limit,
                "deadline_s": args.deadline,
                "workers": args.workers,
                "queries": queries,
                "max_rss_over_limit_mb": round(over, 1),
                "max_overrun_s": round(overrun, 3),
                "health_p99_ms": round(health, 2),
                "health_idle_p99_ms": round(_p99(idle), 2),
                "health_cpu_floor_p99_ms": round(_p99(floor), 2),
                "health_samples": len(loaded),
                "server_cpu_s": {
                    "under_load": round(cpu1 - cpu0, 2),
                    "floor": round(cpu2 - cpu1, 2),
                },
                "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "runaway_answers_under_load": answered,
                "goal_rss_le_limit_plus_256mb": over <= 256,
                "goal_answer_le_deadline_plus_1s": overrun <= 1.0,
                "goal_health_p99_lt_200ms": health < 200,
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
