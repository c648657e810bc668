"""How long ``vidlake`` takes to answer; prints one JSON line.

Starts ``vidlake serve`` on loopback over an empty embedded catalog in a temporary
home, then runs each command ``--runs`` times as a fresh process (what a user types)
and reports the median and worst wall time in seconds:

* ``help``: ``vidlake --help``; ``sql_help``: ``vidlake sql --help``;
* ``snapshots_url`` / ``sql_url``: ``snapshots`` and ``sql "SELECT 1"`` with ``--url``
  (the light commands: the HTTP client only);
* ``snapshots_embedded`` / ``sql_embedded``: the same without ``--url`` (they open the
  catalog in-process, so they import pyiceberg, DuckDB and pyarrow: slower by design).

The goal is < 0.5 s for the first four (``goal_met``). ``interpreter_s`` is a bare
``python -c pass`` on the same box, the floor every command pays.

    python benchmarks/cli_startup.py
    python benchmarks/cli_startup.py --runs 10
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VIDLAKE = [sys.executable, "-c", "from service.cli import main; main()"]
GOAL_S = 0.5
LIGHT = ("help", "sql_help", "snapshots_url", "sql_url")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("vidlake serve exited before answering")
        try:
            urllib.request.urlopen(f"{url}/v1/health", timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("vidlake serve did not answer within 60 s")


def _time(argv: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, cwd=REPO, capture_output=True, check=True, timeout=120)
        walls.append(time.perf_counter() - start)
    return {"median_s": round(statistics.median(walls), 3), "max_s": round(max(walls), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="Runs per command (median).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vidlake-startup-") as home:
        env = {**os.environ, "VIDLAKE_HOME": home, "PYTHONPATH": str(REPO), "COLUMNS": "120"}
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [*VIDLAKE, "serve", "--port", str(port)],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_healthy(url, server)
            commands = {
                "help": ["--help"],
                "sql_help": ["sql", "--help"],
                "snapshots_url": ["snapshots", "--url", url],
                "sql_url": ["sql", "SELECT 1", "--url", url],
                "snapshots_embedded": ["snapshots"],
                "sql_embedded": ["sql", "SELECT 1"],
            }
            result: dict[str, object] = {
                "interpreter_s": _time([sys.executable, "-c", "pass"], env, args.runs)["median_s"]
            }
            for name, argv in commands.items():
                result[name] = _time([*VIDLAKE, *argv], env, args.runs)
        finally:
            server.terminate()
            server.wait(timeout=30)
    timings = [result[name] for name in LIGHT]
    result["goal_s"] = GOAL_S
    result["goal_met"] = all(t["median_s"] < GOAL_S for t in timings)  # type: ignore[index]
    result["runs"] = args.runs
    print(json.dumps(result))


if __name__ == "__main__":
    main()
