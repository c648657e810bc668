"""``loader`` works on a GPU node without the service's dependencies.

A subprocess installs a meta-path finder that refuses fastapi, duckdb, pyiceberg,
lancedb, materializer and service, then imports every loader module and reads one
batch of a synthetic snapshot end to end (lazy imports on the data path count too).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCKED = ("fastapi", "duckdb", "pyiceberg", "lancedb", "materializer", "service")

_SCRIPT = textwrap.dedent(
    """
    import sys

    BLOCKED = set(sys.argv[2].split(","))

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked on a GPU node")
            return None

    sys.meta_path.insert(0, Block())

    import loader, loader.cache, loader.dataset, loader.decode, loader.mapped, loader.plan
    import loader.cache_schema, loader.owners, loader.snapshot, loader.source
    from loader import NodeCache, PlanReader, SnapshotDataset, open_plan

    # The blocker really blocks.
    try:
        import fastapi  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the blocker let fastapi through")

    from manifests.synthetic import write_snapshot

    tmp = sys.argv[1]
    snap = write_snapshot(tmp + "/store", num_steps=2, formats=("safetensors", "pt", "npy"))
    ds = SnapshotDataset(
        snap.url, 1, cache_dir=tmp + "/cache", cache_budget_bytes=1 << 24, cache_reserve_bytes=0
    )
    batch = next(iter(ds))
    assert batch["rows"].tolist() == snap.plan[0].tolist()
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("ok")
    """
)


def test_loader_imports_and_runs_without_service_dependencies(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path), ",".join(BLOCKED)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
