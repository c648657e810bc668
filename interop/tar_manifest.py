"""The source manifest of a TAR-shard dataset: its format, parsed and checked.

``manifest.json`` (or the immutable ``manifests/vNNNNNN.json`` of a pinned revision)
lists every shard with its exact size and SHA-256 and, optionally, its split, its sample
ids and the size and SHA-256 of each member (``docs/interop.md`` has the format). A
publisher's own manifest is read as published: without per-shard ``sample_ids`` the
ids come from the TAR headers; without a per-shard ``split`` a manifest-level ``split``
rule (:mod:`interop.tar_split`) decides per sample; ``version`` stands for
``revision``; ``schema``, ``model_revisions`` and each shard's ``revision`` are kept.
:func:`parse_manifest` checks all of it before anything is read from a shard, and
raises :class:`InvalidInput` (``field="manifest"``) naming the first problem;
:mod:`interop.tar_import` adopts what it lists and :mod:`interop.tar_export` writes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.errors import InvalidInput
from catalog.hashing import is_sha256, sha256_bytes
from interop.sources import RangeSource
from interop.tar_split import SplitRule, parse_split_rule

__all__ = [
    "EVAL_SPLITS",
    "TRAIN_SPLITS",
    "ShardEntry",
    "SourceManifest",
    "bad_manifest",
    "check_sample_ids",
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
    split: str | None  #: None: the manifest's split rule decides per sample
    sample_ids: tuple[str, ...] | None  #: None: the TAR headers list them
    members: Mapping[str, Mapping[str, Any]]
    revision: str | None = None  #: the publisher's revision of this shard
    num_samples: int | None = None  #: the publisher's count, checked against the TAR


@dataclass(frozen=True)
class SourceManifest:
    """A parsed source manifest (see the module docstring)."""

    revision: str | None
    parent: str | None
    shards: tuple[ShardEntry, ...]
    exclude_sample_ids: frozenset[str]
    sha256: str
    schema: str | None = None
    model_revisions: Mapping[str, str] = field(default_factory=dict)
    split_rule: SplitRule | None = None


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
        split = _split(s.get("split"), where, doc.get("split") is not None)
        ids = s.get("sample_ids")
        if ids is not None:
            check_sample_ids(ids, where, path, seen)
        paths.add(path)
        members = s.get("members") or {}
        if not isinstance(members, dict):
            raise bad_manifest(f"{where}.members must be an object", shard=path)
        rev = s.get("revision")
        shard_rev = None if rev is None else _shard_revision(rev, where)
        count = s.get("num_samples")
        if count is not None and (
            not isinstance(count, int) or isinstance(count, bool) or count < 0
        ):
            raise bad_manifest(f"{where}.num_samples must be a count, not {count!r}", shard=path)
        listed = None if ids is None else tuple(ids)
        entry = ShardEntry(path, size, str(sha), split, listed, members, shard_rev, count)
        shards.append(entry)
    excl = doc.get("exclude_sample_ids") or []
    if not isinstance(excl, list) or not all(isinstance(x, str) for x in excl):
        raise bad_manifest("exclude_sample_ids must be a list of strings")
    revision = doc.get("revision", doc.get("version"))
    rev = None if revision is None else _revision(revision)
    parent = doc.get("parent")
    rule = None if doc.get("split") is None else parse_split_rule(doc["split"])
    if rule is None and any(e.split is None for e in shards):
        raise bad_manifest("a shard has no split and the manifest gives no split rule")
    return SourceManifest(
        rev,
        None if parent is None else _revision(parent),
        tuple(shards),
        frozenset(excl),
        sha256_bytes(data),
        _schema(doc.get("schema")),
        _model_revisions(doc.get("model_revisions")),
        rule,
    )


def _split(value: Any, where: str, has_rule: bool) -> str | None:
    """A shard's split; None when absent and the manifest's rule decides (else train)."""
    if value is None:
        return None if has_rule else "train"
    split = str(value).lower()
    if split not in TRAIN_SPLITS + EVAL_SPLITS:
        raise bad_manifest(f"{where}.split {split!r} is not one of {TRAIN_SPLITS + EVAL_SPLITS}")
    return split


def check_sample_ids(ids: Any, where: str, path: str, seen: set[str]) -> None:
    """Ids are valid and not listed twice (within the list, or in ``seen``); adds them."""
    if not isinstance(ids, list) or not all(
        isinstance(x, str) and _SAMPLE_ID.match(x) for x in ids
    ):
        raise bad_manifest(f"{where}.sample_ids must be a list of sample ids", shard=path)
    repeated = seen.intersection(ids)
    if repeated or len(set(ids)) != len(ids):
        twice = sorted(repeated or {x for x in ids if ids.count(x) > 1})[:5]
        raise bad_manifest(f"{where}: sample ids listed twice: {twice}", shard=path)
    seen.update(ids)


def _shard_revision(value: Any, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"v{value:06d}"
    if isinstance(value, str) and value.strip() and len(value) <= 128:
        return value
    raise bad_manifest(f"{where}.revision {value!r} is not a revision")


def _schema(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and 0 < len(value) <= 256):
        return value
    raise bad_manifest(f"schema {value!r} must be the schema's name")


def _model_revisions(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()
    ):
        raise bad_manifest("model_revisions must map each model's role to its revision")
    return dict(sorted(value.items()))


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
