"""Elastic loading with real processes on the S3 server: ranks x DataLoader workers.

Each rank is a process (``tests/loader/_rank_worker.py``) with two DataLoader worker
processes; ranks ``2n`` and ``2n+1`` share node ``n``'s cache directory. The sample
sequence of a run is, for each step, the ranks' batches concatenated in rank order; it
must equal the plan's global batches — with any world size, and across SIGKILLs and
resumes with a different world size.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from catalog.objects import ObjectStore
from manifests.synthetic import SynthSnapshot, write_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.s3]

REPO = Path(__file__).resolve().parents[2]
STEPS = 50


def _snapshot(store: ObjectStore) -> SynthSnapshot:
    # 64 rows per bucket and 16 per step: no row repeats inside a step.
    return write_snapshot(
        store,
        num_rows=128,
        num_steps=STEPS,
        batch_size=16,
        pack=4,
        formats=("safetensors", "npy"),
        steps_per_batch=8,
    )


def _start(
    snap: SynthSnapshot, tmp: Path, out: Path, world: int, *, state: Path | None, delay: float
) -> list[subprocess.Popen[bytes]]:
    out.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = []
    for rank in range(world):
        cmd = [sys.executable, "-m", "tests.loader._rank_worker", "--source", snap.url]
        cmd += ["--cache", str(tmp / f"node{rank // 2}"), "--rank", str(rank)]
        cmd += ["--world", str(world), "--workers", "2", "--out", str(out)]
        cmd += ["--delay", str(delay)] + (["--state", str(state)] if state else [])
        with open(out / f"rank{rank}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: workers die with it
                )
            )
    return procs


def _logs(out: Path, world: int) -> list[dict[int, list[int]]]:
    """Per rank: step -> rows, from whole lines only; a step twice is an error."""
    result = []
    for rank in range(world):
        steps: dict[int, list[int]] = {}
        text = (out / f"rank{rank}.jsonl").read_text()
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            rec = json.loads(line)
            assert rec["step"] not in steps, f"rank {rank} got step {rec['step']} twice"
            steps[rec["step"]] = rec["rows"]
        result.append(steps)
    return result


def _next_steps(out: Path, world: int) -> list[int]:
    steps = []
    for rank in range(world):
        try:
            steps.append(json.loads((out / f"rank{rank}.state.json").read_text())["next_step"])
        except (FileNotFoundError, ValueError):
            steps.append(0)
    return steps


def _wait(procs: list[subprocess.Popen[bytes]], out: Path, timeout: float = 90) -> None:
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raise
        assert rc == 0, (out / f"rank{rank}.log").read_text()[-3000:]


def _kill_at(procs: list[subprocess.Popen[bytes]], out: Path, world: int, step: int) -> None:
    """SIGKILL every rank (and its workers) once all have checkpointed ``step``."""
    deadline = time.monotonic() + 90
    while min(_next_steps(out, world)) < step:
        assert time.monotonic() < deadline, "ranks made no progress"
        for rank, p in enumerate(procs):
            assert p.poll() in (None, 0), (out / f"rank{rank}.log").read_text()[-3000:]
        time.sleep(0.02)
    for p in procs:
        # A rank that finished meanwhile (a starved peer at high load) has no group left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)
    # Some rank must have been cut short, or this was no kill at all.
    assert min(_next_steps(out, world)) < STEPS, "every rank finished before the kill"


def test_ranks_partition_every_step(tmp_path: Path, s3_store: ObjectStore) -> None:
    snap = _snapshot(s3_store)
    out = tmp_path / "run"
    _wait(_start(snap, tmp_path, out, 4, state=None, delay=0.0), out)
    logs = _logs(out, 4)
    for step in range(STEPS):
        union = [row for rank in range(4) for row in logs[rank][step]]
        assert len(union) == len(set(union)) == 16
        assert union == snap.plan[step].tolist()
    for rank in range(4):
        assert _next_steps(out, 4)[rank] == STEPS


def test_kill_and_resume_with_other_world_sizes(tmp_path: Path, s3_store: ObjectStore) -> None:
    snap = _snapshot(s3_store)
    segments = [(4, 12), (2, 30), (8, None)]  # world size, kill once all passed this step
    sequence: dict[int, list[int]] = {}
    state: Path | None = None
    start = 0
    for i, (world, kill_at) in enumerate(segments):
        out = tmp_path / f"segment{i}"
        procs = _start(snap, tmp_path, out, world, state=state, delay=0.03)
        if kill_at is None:
            _wait(procs, out)
        else:
            _kill_at(procs, out, world, kill_at)
        # The job's checkpoint: the state every rank has reached (ranks checkpoint
        # together in real training; here each wrote its own, so take the oldest).
        states = [json.loads((out / f"rank{r}.state.json").read_text()) for r in range(world)]
        assert {s["plan_sha256"] for s in states} == {snap.plan_sha256}
        resume = min(states, key=lambda s: s["next_step"])
        end = resume["next_step"]
        assert kill_at is None or end >= kill_at
        logs = _logs(out, world)
        for step in range(start, end):
            assert step not in sequence
            sequence[step] = [row for rank in range(world) for row in logs[rank][step]]
        state = tmp_path / f"state{i}.json"
        state.write_text(json.dumps(resume))
        start = end
    assert start == STEPS
    # Exactly the uninterrupted sequence: nothing twice, nothing skipped, same order.
    assert sorted(sequence) == list(range(STEPS))
    assert [sequence[s] for s in range(STEPS)] == [p.tolist() for p in snap.plan]
