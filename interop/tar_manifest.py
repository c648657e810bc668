"""The source manifest of a TAR-shard dataset: its format, parsed and checked.

``manifest.json`` (or the immutable ``manifests/vNNNNNN.json`` of a pinned revision)
lists every shard with its exact size and SHA-256, its split, its sample ids and the size
and SHA-256 of each member (``docs/interop.md`` has the format).
:func:`parse_manifest` checks all of it before anything is read from a shard, and
raises :class:`InvalidInput` (``field="manifest"``) naming the first problem;
:mod:`interop.tar_import` adopts what it lists and :mod:`interop.tar_export` writes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from catalog.errors import InvalidInput
from catalog.hashing import is_sha256, sha256_bytes
from interop.sources import RangeSource

__all__ = [
    "EVAL_SPLITS",
    "TRAIN_SPLITS",
    "ShardEntry",
    "SourceManifest",
    "bad_manifest",
    "parse_manifest",
    "read_manifest",
]

_REVISION = re.compile(r"^v[0-9]{6}$")
_SAMPLE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@=+-]{0,254}$")
TRAIN_SPLITS = ("train",)
EVAL_SPLITS = ("val", "valid", "validation", "eval", "test")


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it."""

    path: str
    size: int
    sha256: str
    split: str
    sample_ids: tuple[str, ...]
    members: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class SourceManifest:
    """A parsed source manifest (see the module docstring)."""

    revision: str | None
    parent: str | None
    shards: tuple[ShardEntry, ...]
    exclude_sample_ids: frozenset[str]
    sha256: str


def bad_manifest(message: str, **details: Any) -> InvalidInput:
    """The error for a source manifest (or a shard it lists) that is not as it says."""
    return InvalidInput(message, field="manifest", **details)


def parse_manifest(data: bytes) -> SourceManifest:
    """Parse and check a source manifest; InvalidInput names the first problem."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise bad_manifest(f"manifest is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("shards"), list):
        raise bad_manifest("manifest must be an object with a 'shards' list")
    shards, seen, paths = [], set[str](), set[str]()
    for i, s in enumerate(doc["shards"]):
        where = f"shards[{i}]"
        if not isinstance(s, dict):
            raise bad_manifest(f"{where} is not an object")
        path, size, sha = s.get("path"), s.get("size"), s.get("sha256")
        if not isinstance(path, str) or not path or path in paths:
            raise bad_manifest(f"{where}.path is missing or repeated", shard=path)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise bad_manifest(f"{where}.size must be the exact size in bytes", shard=path)
        if not is_sha256(sha):
            raise bad_manifest(f"{where}.sha256 must be 64 lowercase hex", shard=path)
        split = str(s.get("split", "train")).lower()
        if split not in TRAIN_SPLITS + EVAL_SPLITS:
            allowed = TRAIN_SPLITS + EVAL_SPLITS
            raise bad_manifest(f"{where}.split {split!r} is not one of {allowed}")
        ids = s.get("sample_ids")
        if not isinstance(ids, list) or not all(
            isinstance(x, str) and _SAMPLE_ID.match(x) for x in ids
        ):
            raise bad_manifest(f"{where}.sample_ids must be a list of sample ids", shard=path)
        repeated = seen.intersection(ids)
        if repeated or len(set(ids)) != len(ids):
            twice = sorted(repeated)[:5]
            raise bad_manifest(f"{where}: sample ids listed twice: {twice}", shard=path)
        seen.update(ids)
        paths.add(path)
        members = s.get("members") or {}
        if not isinstance(members, dict):
            raise bad_manifest(f"{where}.members must be an object", shard=path)
        shards.append(ShardEntry(path, size, str(sha), split, tuple(ids), members))
    excl = doc.get("exclude_sample_ids") or []
    if not isinstance(excl, list) or not all(isinstance(x, str) for x in excl):
        raise bad_manifest("exclude_sample_ids must be a list of strings")
    revision = doc.get("revision")
    rev = None if revision is None else _revision(revision)
    parent = doc.get("parent")
    return SourceManifest(
        rev,
        None if parent is None else _revision(parent),
        tuple(shards),
        frozenset(excl),
        sha256_bytes(data),
    )


def _revision(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"v{value:06d}"
    if isinstance(value, str) and _REVISION.match(value):
        return value
    raise bad_manifest(f"revision {value!r} is not vNNNNNN")


def read_manifest(src: RangeSource, revision: str | int | None) -> SourceManifest:
    """The manifest at ``revision`` (``manifests/vNNNNNN.json``), else ``manifest.json``."""
    if revision is None:
        return parse_manifest(src.read("manifest.json"))
    rev = _revision(revision)
    manifest = parse_manifest(src.read(f"manifests/{rev}.json"))
    if manifest.revision not in (None, rev):
        raise bad_manifest(f"manifests/{rev}.json says it is revision {manifest.revision}")
    return manifest
