"""What the loader trusts in ``snapshot.json`` and in a version's erasure mark.

:func:`parse_snapshot` checks a ``snapshot.json`` against :mod:`manifests.format`
(required keys, format version, the version it names, the plan and index artifacts);
:func:`erasure_mark` fetches and checks the latest erasure mark of a version, and
:func:`effective_snapshot` applies it (its artifacts replace the index and manifest;
the plan never changes). Any violation is an :class:`~catalog.errors.IntegrityError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from catalog.errors import IntegrityError
from catalog.hashing import require_sha256
from loader.source import SnapshotSource
from manifests.format import FORMAT_VERSION, INDEX_NAME, PLAN_NAME, SNAPSHOT_REQUIRED_KEYS

__all__ = [
    "LOADER_ARTIFACTS",
    "effective_snapshot",
    "erasure_mark",
    "local_snapshot",
    "parse_snapshot",
]

#: The artifacts a loader reads.
LOADER_ARTIFACTS = (PLAN_NAME, INDEX_NAME)


def parse_snapshot(data: bytes, version: int) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise IntegrityError(f"snapshot.json of version {version} is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise IntegrityError(f"snapshot.json of version {version} is not an object")
    missing = sorted(SNAPSHOT_REQUIRED_KEYS - doc.keys())
    if missing:
        raise IntegrityError(f"snapshot.json of version {version} lacks {missing}", missing=missing)
    if int(doc["format"]) != FORMAT_VERSION:
        raise IntegrityError(
            f"snapshot {version} has format {doc['format']}; this loader reads {FORMAT_VERSION}",
            format=doc["format"],
        )
    if int(doc["version"]) != version:
        raise IntegrityError(f"asked for version {version}, snapshot.json says {doc['version']}")
    for name in LOADER_ARTIFACTS:
        entry = doc["artifacts"].get(name)
        if not isinstance(entry, dict) or "sha256" not in entry or "size" not in entry:
            raise IntegrityError(f"snapshot.json of version {version} does not list {name}")
        require_sha256(entry["sha256"], f"artifacts.{name}.sha256")
    return doc


def erasure_mark(source: SnapshotSource, version: int) -> dict[str, Any] | None:
    """The version's latest erasure mark, checked for what the loader relies on."""
    data = source.erasure_bytes(version)
    if data is None:
        return None
    try:
        mark = json.loads(data)
        artifacts = mark["artifacts"]
        rows = mark["erased_rows"]
        for name in LOADER_ARTIFACTS:
            require_sha256(artifacts[name]["sha256"], f"erasure artifacts.{name}.sha256")
            int(artifacts[name]["size"])
        if not isinstance(rows, list) or not all(isinstance(r, int) for r in rows):
            raise TypeError("erased_rows is not a list of ints")
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"erasure mark of version {version} is malformed: {exc}") from exc
    if int(mark.get("version", -1)) != version:
        raise IntegrityError(f"erasure mark for version {version} names {mark.get('version')}")
    return dict(mark)


def effective_snapshot(doc: dict[str, Any], mark: dict[str, Any] | None) -> dict[str, Any]:
    """``snapshot.json`` with the artifacts an erasure mark names (the plan never changes)."""
    if mark is None:
        return doc
    if mark["artifacts"]["plan.arrow"]["sha256"] != doc["artifacts"]["plan.arrow"]["sha256"]:
        raise IntegrityError(
            f"erasure mark {mark.get('erasure_id')} of version {doc['version']} names another "
            "plan.arrow; an erasure never rewrites the plan"
        )
    return {**doc, "artifacts": {**doc["artifacts"], **mark["artifacts"]}}


def local_snapshot(path: Path, version: int) -> tuple[bytes, dict[str, Any]] | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return data, parse_snapshot(data, version)
