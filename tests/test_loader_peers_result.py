"""benchmarks/loader_peers.py: the CPU-side verify ratio beside the wall-clock one."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from benchmarks import loader_peers as lp

SAMPLE = (lp.SIZES["8mb"][0] // lp.FRAME) * lp.FRAME


def _result(monkeypatch: pytest.MonkeyPatch, cpu_s: float, verify_rate: float) -> dict[str, Any]:
    # A fixed floor: 1 GB/s a thread, 2 threads (no hashing in the test).
    monkeypatch.setattr(lp, "_hash_floor", lambda nbytes, threads: threads * 1e9)
    rates = {
        "8mb": {
            "raw": 100.0,
            "into_batch": 100.0,
            "vidlake": 100.0,
            "vidlake_verify": verify_rate,
            "cpu_raw": 0.001,
            "cpu_vidlake": 0.001,
            "cpu_vidlake_verify": cpu_s,
        }
    }
    args = argparse.Namespace(quick=False, resume_step=1)
    return lp._result(rates, 2, {}, {}, {}, args)


def test_cpu_ratio_is_the_hash_share_of_a_verified_samples_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hash_s = SAMPLE / 1e9  # the floor's seconds for one sample on one thread
    out = _result(monkeypatch, cpu_s=hash_s * 1.25, verify_rate=50.0)
    assert out["verify_x_hash_floor_cpu"] == pytest.approx(0.8, abs=1e-3)
    # The goal's figure is untouched: the wall-clock rate over the floor.
    assert out["verify_x_hash_floor"] == pytest.approx(50.0 * SAMPLE / 2e9, abs=1e-3)


def test_cpu_ratio_is_the_wall_ratio_when_both_threads_are_always_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu_s = 0.006
    out = _result(monkeypatch, cpu_s=cpu_s, verify_rate=2 / cpu_s)  # 2 samples per cpu_s
    assert out["verify_x_hash_floor"] == pytest.approx(out["verify_x_hash_floor_cpu"], abs=2e-3)
