"""``vidlake erase`` / ``vidlake tombstone --kind hard --erase`` / ``vidlake erasures``
in embedded mode: a real lake under a temporary home."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.config import CatalogConfig
from catalog.erase import erasure_id
from tests.catalog.test_erase import NO_HITS, Lake, _markers, scan_files
from tests.service.test_cli import _vidlake


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    root = tmp_path_factory.mktemp("erase-cli")
    return Lake(root, CatalogConfig.embedded(root, eval_salt="00" * 16), tombstone=False)


def test_erase_needs_a_hard_tombstone_and_says_so_in_one_line(lake: Lake) -> None:
    run = _vidlake(lake.root, "erase", lake.asset)
    assert run.returncode == 2, run.stderr
    assert "hard tombstone" in run.stderr and len(run.stderr.strip().splitlines()) <= 2
    soft = _vidlake(lake.root, "tombstone", lake.asset, "--reason", "x", "--erase")
    assert soft.returncode == 2 and "--kind hard" in soft.stderr


def test_tombstone_hard_erase_then_list_and_show(lake: Lake) -> None:
    run = _vidlake(
        lake.root,
        "tombstone",
        lake.asset,
        "--reason",
        "court order",
        "--kind",
        "hard",
        "--erase",
        "--by",
        "legal",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    done = json.loads(run.stdout)
    assert done["state"] == "done" and done["erasure_id"] == erasure_id(lake.asset)
    assert done["requested_by"] == "legal"
    assert scan_files(lake.root, _markers(lake)) == NO_HITS
    listed = json.loads(_vidlake(lake.root, "erasures", "--json").stdout)
    assert [e["erasure_id"] for e in listed["data"]] == [erasure_id(lake.asset)]
    shown = json.loads(_vidlake(lake.root, "show", str(lake.version), "--json").stdout)
    assert shown["contains_erased_data"] is True
    assert shown["erasure_ids"] == [erasure_id(lake.asset)]
    again = _vidlake(lake.root, "erase", lake.asset, "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == done


def test_erase_help_says_what_it_does() -> None:
    run = _vidlake(Path("/nonexistent"), "erase", "--help")
    assert run.returncode == 0 and "Idempotent" in run.stdout
