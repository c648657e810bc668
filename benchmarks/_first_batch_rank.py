"""One training rank for ``loader_peers.py``'s ``first_batch_s``: run as a fresh
interpreter (``python -m benchmarks._first_batch_rank``, from the repository root, as
torchrun starts its ranks), it imports only what a training script
imports (torch and the loader), reads the first batch through a ``StatefulLoader``
and prints one JSON line of wall-clock times (``time.time()``, to be subtracted from
the parent's start time).

Argument: one JSON object ``{"url", "kw", "workers", "context", "hand_over",
"persistent"}``.
"""

from __future__ import annotations

import time

T_MAIN = time.time()

import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402, F401 - what every training script imports first

T_TORCH = time.time()

from loader.dataset import SnapshotDataset  # noqa: E402
from loader.stateful import StatefulLoader  # noqa: E402

T_IMPORT = time.time()


def main() -> None:
    args = json.loads(sys.argv[1])
    ds = SnapshotDataset(args["url"], 1, **args["kw"])
    ds.plan  # noqa: B018 - part of the first batch's time
    t_plan = time.time()
    loader = StatefulLoader(
        ds,
        num_workers=args["workers"],
        hand_over=args["hand_over"],
        multiprocessing_context=args["context"],
        persistent_workers=args.get("persistent", False),
    )
    it = iter(loader)
    first = next(it)
    t_first = time.time()
    assert int(first["step"]) == 0
    # Hold the first batch until the workers claim the rest: when they became ready.
    while args["hand_over"] and loader.handed_over_at is None:
        time.sleep(0.01)
    t_ready = time.time()
    handed_over_at = loader.handed_over_at
    steps = [int(first["step"])] + [int(b["step"]) for b in it]
    assert steps == list(range(len(steps))), steps
    # A second iter() (a new epoch, a resume): new workers (a fork server is warm now),
    # or the same ones when persistent.
    loader.load_state_dict(ds.state_dict(next_step=0))
    t_again = time.time()
    it = iter(loader)
    next(it)
    while args["hand_over"] and loader.handed_over_at is None:
        time.sleep(0.01)
    t_ready_again = time.time()
    it.close()
    out = {
        "main": T_MAIN,
        "torch": T_TORCH,
        "import": T_IMPORT,
        "plan": t_plan,
        "first": t_first,
        "workers_ready": t_ready,
        "handed_over_at": handed_over_at,
        "workers_ready_again_s": t_ready_again - t_again,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
