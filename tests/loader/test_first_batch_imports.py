"""A fresh rank's first batch loads only what it needs (issue 16's ``first_batch_s``).

A subprocess does what a training script does: ``import torch``, then the loader, and
reads one batch through ``StatefulLoader``. It must not import ``pyarrow.compute``
(~0.15 s of CPU), ``pyarrow.parquet`` or the service's dependencies, and importing
the loader freezes the objects already there (torch's) out of the cyclic GC's sight.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from loader.dataset import SnapshotDataset
from manifests.synthetic import write_snapshot

REPO = Path(__file__).resolve().parents[2]

NOT_LOADED = (
    "pyarrow.compute",
    "pyarrow.parquet",
    "pyarrow.dataset",
    "pandas",
    "duckdb",
    "pyiceberg",
    "lancedb",
    "fastapi",
    "materializer",
    "service",
)

_RANK = textwrap.dedent(
    """
    import gc, json, sys

    import torch  # noqa: F401 - what a training script imports first

    frozen_before = gc.get_freeze_count()
    from loader.dataset import SnapshotDataset
    from loader.stateful import StatefulLoader

    args = json.loads(sys.argv[1])
    ds = SnapshotDataset(args["url"], 1, **args["kw"])
    batch = next(iter(StatefulLoader(ds)))
    print(json.dumps({
        "rows": batch["rows"].tolist(),
        "loaded": sorted(sys.modules),
        "frozen": [frozen_before, gc.get_freeze_count()],
    }))
    """
)


def test_first_batch_of_a_fresh_rank_loads_only_what_it_needs(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=2, batch_size=8)
    kw = {"cache_dir": str(tmp_path / "node"), "cache_budget_bytes": 1 << 26}
    kw["cache_reserve_bytes"] = 0
    next(iter(SnapshotDataset(snap.url, 1, **kw)))  # a warm cache, as on a resumed node
    proc = subprocess.run(
        [sys.executable, "-c", _RANK, json.dumps({"url": snap.url, "kw": kw})],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rows"] == snap.plan[0].tolist()
    leaked = [m for m in out["loaded"] if any(m == n or m.startswith(n + ".") for n in NOT_LOADED)]
    assert not leaked, leaked
    before, after = out["frozen"]
    assert before == 0 and after > 10_000  # torch's objects, frozen by the loader's import
