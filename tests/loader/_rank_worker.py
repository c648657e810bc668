"""One training rank for the elastic loader tests (run as ``python -m``).

Reads a snapshot through ``StatefulLoader`` (DataLoader workers are separate
processes), "trains" on each batch by checking its tensors against its rows, appends
``{"step", "rows"}`` to ``<out>/rank<R>.jsonl`` with one ``write`` (a kill cannot tear
a line in two), then checkpoints the loader's ``state_dict`` atomically to
``<out>/rank<R>.state.json`` — the order a real training loop follows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from loader.dataset import SnapshotDataset, StatefulLoader


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--source", required=True)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--cache", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--state", default=None, help="a state_dict JSON file to resume from")
    p.add_argument("--delay", type=float, default=0.0, help="seconds of 'training' per step")
    args = p.parse_args(argv)

    ds = SnapshotDataset(
        args.source,
        args.version,
        rank=args.rank,
        world_size=args.world,
        cache_dir=args.cache,
        cache_budget_bytes=64 << 20,
        cache_reserve_bytes=0,
        prefetch_steps=2,
        prefetch_threads=2,
    )
    loader = StatefulLoader(ds, num_workers=args.workers)
    if args.state:
        with open(args.state) as f:
            loader.load_state_dict(json.load(f))
    log = os.open(
        os.path.join(args.out, f"rank{args.rank}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
    )
    state_path = os.path.join(args.out, f"rank{args.rank}.state.json")
    try:
        for batch in loader:
            rows = batch["rows"]
            if not torch.equal(batch["latent"].flatten(1)[:, 0], rows.float()):
                print(f"rank {args.rank}: step {batch['step']} tensors do not match rows")
                return 3
            line = json.dumps({"step": batch["step"], "rows": rows.tolist()}) + "\n"
            os.write(log, line.encode())
            time.sleep(args.delay)
            tmp = f"{state_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(loader.state_dict(), f)
            os.replace(tmp, state_path)
    finally:
        os.close(log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
