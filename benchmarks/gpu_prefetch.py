"""How much of the host-to-device copy the prefetch ring (loader/device.py) hides.

A training loop that gets a batch as CPU tensors and moves it with ``.to("cuda")``
pays the whole copy on every step; the ring copies batch ``i+k`` on a side stream
while step ``i`` computes. Three loops over the same ``--steps`` batches of ``--mb``
MB, measured in one run:

- ``serial_s``: ``batch.to(device)`` (pageable memory, as a plain loop does), then a
  simulated compute step that reads the batch;
- ``compute_only_s``: the compute steps alone, on batches already on the device (the
  floor: every copy hidden);
- ``ring_s``: :func:`loader.device.prefetch_to_device` with ``--depth``, then the same
  compute step.

The compute step is a reduction of the batch plus ``torch.cuda._sleep`` calibrated to
``--compute-ratio`` times one batch's pinned copy time (default 1.5, so a perfect ring
hides every copy). ``hidden_fraction = (serial_s - ring_s) / (serial_s -
compute_only_s)``: 1.0 means the copies cost nothing, 0 that the ring hid nothing.
Prints one JSON line; without CUDA it prints ``{"benchmark": "gpu_prefetch",
"skipped": reason}`` and exits 0, so CI never needs a GPU. ``--quick``: 16 MB x 8 steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loader.device import prefetch_to_device


def _batches(src: list[torch.Tensor], steps: int) -> Iterator[dict[str, Any]]:
    for i in range(steps):
        yield {"latent": src[i % len(src)], "step": i}


def _copy_s(t: torch.Tensor, dev: torch.device) -> float:
    """One pinned, synchronous copy of ``t`` (median of 5)."""
    pinned = t.pin_memory()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pinned.to(dev, non_blocking=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[2]


def _compute_fn(seconds: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A GPU step of about ``seconds`` that reads its input (sleep cycles calibrated)."""
    cycles = 1_000_000
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    per_cycle = (time.perf_counter() - t0) / cycles
    n = max(1, int(seconds / per_cycle))

    def step(x: torch.Tensor) -> torch.Tensor:
        out = x.float().sum()
        torch.cuda._sleep(n)
        return out

    return step


def _timed(batches: Iterator[dict[str, Any]], move: Callable[[Any], Any], step: Any) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for batch in batches:
        step(move(batch)["latent"])
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(mb: int, steps: int, depth: int, compute_ratio: float) -> dict[str, Any]:
    dev = torch.device("cuda")
    src = [torch.full((mb << 20,), i, dtype=torch.uint8) for i in range(4)]
    copy_s = _copy_s(src[0], dev)
    step = _compute_fn(copy_s * compute_ratio)
    on_dev = [t.to(dev) for t in src]
    step(on_dev[0])  # warm the kernels and the allocator
    serial = _timed(_batches(src, steps), lambda b: {"latent": b["latent"].to(dev)}, step)
    floor = _timed(_batches(on_dev, steps), lambda b: b, step)
    ring = _timed(prefetch_to_device(_batches(src, steps), depth, dev), lambda b: b, step)
    exposed = serial - floor
    hidden = (serial - ring) / exposed if exposed > 0 else 1.0
    return {
        "benchmark": "gpu_prefetch",
        "device": torch.cuda.get_device_name(dev),
        "mb": mb,
        "steps": steps,
        "depth": depth,
        "compute_ratio": compute_ratio,
        "copy_ms": round(copy_s * 1e3, 3),
        "h2d_gb_s": round(mb / 1024 / copy_s, 2),
        "serial_s": round(serial, 4),
        "compute_only_s": round(floor, 4),
        "ring_s": round(ring, 4),
        "hidden_fraction": round(max(0.0, min(1.0, hidden)), 3),
        "ring_vs_floor": round(ring / floor, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=64, help="MB per batch")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2, help="prefetch_to_device")
    parser.add_argument("--compute-ratio", type=float, default=1.5)
    parser.add_argument("--quick", action="store_true", help="16 MB x 8 steps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        reason = f"CUDA is not available (torch {torch.__version__})"
        print(json.dumps({"benchmark": "gpu_prefetch", "skipped": reason}))
        return
    mb, steps = (16, 8) if args.quick else (args.mb, args.steps)
    print(json.dumps(run(mb, steps, args.depth, args.compute_ratio)))


if __name__ == "__main__":
    main()
