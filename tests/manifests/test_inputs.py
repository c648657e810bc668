"""The inputs key of a cut (manifests/inputs.py): what makes two cuts the same cut."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.errors import ChecksumMismatch
from manifests.inputs import cut_inputs_sha256, find_published, snapshot_inputs_sha256

R1, R2 = "1" * 64, "2" * 64
PIN = {"assets": 5, "clips": None, "scores": 9}


def test_each_input_changes_the_key_and_nothing_else_does() -> None:
    key = cut_inputs_sha256(R1, PIN, "1.0")
    assert key == cut_inputs_sha256(R1, dict(reversed(list(PIN.items()))), "1.0")  # order
    assert len({key, cut_inputs_sha256(R2, PIN, "1.0")}) == 2
    assert len({key, cut_inputs_sha256(R1, {**PIN, "scores": 10}, "1.0")}) == 2
    assert len({key, cut_inputs_sha256(R1, {**PIN, "lance:clip-v1": 3}, "1.0")}) == 2
    assert len({key, cut_inputs_sha256(R1, PIN, "1.1")}) == 2


def _snapshot(**extra: Any) -> dict[str, Any]:
    return {"recipe_sha256": R1, "catalog_snapshot_ids": PIN, "code_version": "1.0", **extra}


def test_recorded_derived_and_patch_keys() -> None:
    key = cut_inputs_sha256(R1, PIN, "1.0")
    assert snapshot_inputs_sha256(_snapshot()) == key  # an older version: derived
    assert snapshot_inputs_sha256(_snapshot(inputs_sha256="f" * 64)) == "f" * 64  # recorded
    # A patch is its base plus exclusions, never a cut of the inputs.
    assert snapshot_inputs_sha256(_snapshot(inputs_sha256=key, patch_of=1)) is None
    assert snapshot_inputs_sha256({"recipe_sha256": R1}) is None


class _Record:
    def __init__(self, version: int, snapshot: dict[str, Any]) -> None:
        self.version, self.snapshot = version, snapshot


def test_find_published_takes_the_newest_match() -> None:
    key = cut_inputs_sha256(R1, PIN, "1.0")
    records = {
        1: _Record(1, _snapshot(inputs_sha256=key)),
        2: _Record(2, _snapshot(inputs_sha256="0" * 64)),
        3: _Record(3, _snapshot(inputs_sha256=key)),
        4: _Record(4, _snapshot(inputs_sha256=key, patch_of=3)),
    }
    found = find_published([2, 4, 1, 3], records.__getitem__, key)  # type: ignore[arg-type]
    assert found is not None and found.version == 3
    assert find_published([2], records.__getitem__, key) is None  # type: ignore[arg-type]


def test_an_unreadable_version_is_skipped_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    key = cut_inputs_sha256(R1, PIN, "1.0")

    def record(version: int) -> _Record:
        if version == 2:
            raise ChecksumMismatch("snapshot.json of version 2 is corrupt", version=2)
        return _Record(version, _snapshot(inputs_sha256=key))

    found = find_published([1, 2], record, key)  # type: ignore[arg-type]
    assert found is not None and found.version == 1
    assert "version 2 skipped" in caplog.text
