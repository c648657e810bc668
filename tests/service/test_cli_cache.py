"""``vidlake cache --dir``: the directory a SnapshotDataset was given, and nothing new."""

from __future__ import annotations

import json
from pathlib import Path

from loader.cache import NodeCache
from tests.service.test_cli import _vidlake


def test_stats_reads_the_cache_dir_a_dataset_was_given(tmp_path: Path) -> None:
    cache_dir = tmp_path / "node"  # what SnapshotDataset(cache_dir=...) was given
    with NodeCache(cache_dir / "latents", 4096):
        pass
    run = _vidlake(tmp_path / "home", "cache", "stats", "--dir", str(cache_dir))
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout)
    assert stats["budget_bytes"] == 4096 and stats["root"] == str(cache_dir / "latents")
    assert sorted(p.name for p in cache_dir.iterdir()) == ["latents"]

    root = _vidlake(tmp_path / "home", "cache", "stats", "--dir", str(cache_dir / "latents"))
    assert root.returncode == 0, root.stderr


def test_a_directory_without_a_cache_is_not_found_and_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in ("stats", "verify", "gc"):
        run = _vidlake(tmp_path / "home", "cache", command, "--dir", str(empty))
        assert run.returncode == 2, run.stderr
        assert "no node cache in" in run.stderr and "Traceback" not in run.stderr
    assert list(empty.iterdir()) == []
