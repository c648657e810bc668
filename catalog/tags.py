"""Iceberg tags for registered snapshot versions: ``vidlake-v{N}`` in every table.

A registered version ``N`` read each table at one Iceberg snapshot (its pin). This
module tags that snapshot ``vidlake-v{N}`` in each table, so that Spark, Trino and
DuckDB read exactly what version ``N`` read by tag, and so that Iceberg's own
snapshot expiry (ours in ``vidlake maintain`` and any engine's) keeps it.

Retention is the tag's ``max-ref-age-ms``, which Iceberg measures from the tagged
snapshot's timestamp. The caller says until when a version's tags must hold
(``keep_until_ms``): None means forever (no ``max-ref-age-ms``: the tag never
expires; a pinned version), an instant sets ``max-ref-age-ms = keep_until_ms -
snapshot timestamp`` (an unpinned version; the rule is in
``docs/decisions/017-pin-tags.md``). A tag whose instant has passed is not
created, and :func:`drop_aged_tags` removes it. The value is a pure function of its
inputs, so re-tagging (the backfill) is idempotent: a tag already right is not
committed again.

Tags of one table are one commit, retried when another writer moved the table.
Embedding (LanceDB) versions of a pin are not Iceberg tables and get no tag.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType

from catalog.backends import BACKEND_ERRORS
from catalog.errors import Conflict, InvalidInput, StorageError
from catalog.tables import TABLE_NAMES

__all__ = [
    "TAG_PREFIX",
    "TagReport",
    "VersionTags",
    "drop_aged_tags",
    "parse_version_tag",
    "tag_versions",
    "tagged_snapshot_ids",
    "version_tag",
    "version_tags",
]

log = logging.getLogger("vidlake.catalog.tags")

#: Prefix of a version's tag: ``vidlake-v{N}``.
TAG_PREFIX = "vidlake-v"
_TAG = re.compile(r"^vidlake-v([0-9]+)$")
_RETRIES = 16

Loader = Callable[[str], Table]


def version_tag(version: int) -> str:
    """The tag name of registered version ``version`` (``vidlake-v{N}``)."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidInput(f"a version is a non-negative int, got {version!r}", field="version")
    return f"{TAG_PREFIX}{version}"


def parse_version_tag(name: str) -> int | None:
    """The version a ``vidlake-v{N}`` tag names; None for any other ref."""
    match = _TAG.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class VersionTags:
    """What version ``version``'s tags must be: the snapshot it read per table (None:
    the table was empty) and until when they hold (epoch ms; None: forever)."""

    version: int
    snapshot_ids: Mapping[str, int | None]
    keep_until_ms: int | None = None


@dataclass
class TagReport:
    """What :func:`tag_versions` or :func:`drop_aged_tags` did, per table."""

    created: dict[str, list[str]] = field(default_factory=dict)
    updated: dict[str, list[str]] = field(default_factory=dict)
    removed: dict[str, list[str]] = field(default_factory=dict)
    #: ``table -> [tag]`` whose snapshot the table no longer holds (expired or erased).
    missing: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, dict[str, list[str]]]:
        return {
            "created": self.created,
            "updated": self.updated,
            "removed": self.removed,
            "missing": self.missing,
        }


def version_tags(tbl: Table) -> dict[int, SnapshotRef]:
    """``vidlake-v{N}`` tags of ``tbl``: version -> its ref."""
    out: dict[int, SnapshotRef] = {}
    for name, ref in tbl.metadata.refs.items():
        version = parse_version_tag(name)
        if version is not None and ref.snapshot_ref_type == SnapshotRefType.TAG:
            out[version] = ref
    return out


def tagged_snapshot_ids(tbl: Table, *, now_ms: int | None = None) -> set[int]:
    """Snapshot ids of ``tbl`` that a ref holds at ``now_ms`` (default: now).

    Every branch (``main`` among them) and every tag whose ``max-ref-age-ms`` has not
    passed: the snapshots a snapshot expiry must keep.
    """
    now = _now_ms() if now_ms is None else now_ms
    return {
        ref.snapshot_id
        for name, ref in tbl.metadata.refs.items()
        if ref.snapshot_ref_type == SnapshotRefType.BRANCH or not _aged(tbl, ref, now)
    }


def tag_versions(
    load: Loader, wanted: list[VersionTags], *, now_ms: int | None = None
) -> TagReport:
    """Make each version's tags what ``wanted`` says (one commit per table changed).

    Raises:
        InvalidInput: A version names a table the catalog does not have.
        Conflict: A table kept moving under every retry.
        StorageError: The backend failed (tables committed before it keep their tags).
    """
    now = _now_ms() if now_ms is None else now_ms
    report = TagReport()
    for want in wanted:
        version_tag(want.version)  # InvalidInput before any commit
        unknown = set(want.snapshot_ids) - set(TABLE_NAMES)
        if unknown:
            raise InvalidInput(f"version {want.version} pins unknown tables {sorted(unknown)}")
    for table in TABLE_NAMES:
        targets = {
            version_tag(w.version): (sid, w.keep_until_ms)
            for w in wanted
            if (sid := w.snapshot_ids.get(table)) is not None
        }
        if targets:
            _commit(load, table, functools.partial(_plan_tags, targets=targets, now=now), report)
    return report


def drop_aged_tags(load: Loader, *, now_ms: int | None = None) -> TagReport:
    """Remove every ``vidlake-v{N}`` tag whose ``max-ref-age-ms`` has passed at ``now_ms``."""
    now = _now_ms() if now_ms is None else now_ms
    report = TagReport()
    for table in TABLE_NAMES:
        _commit(load, table, lambda tbl: _plan_drops(tbl, now), report)
    return report


# -- planning --------------------------------------------------------------------------
_Plan = tuple[dict[str, tuple[int, int | None]], list[str], dict[str, str]]


def _plan_tags(tbl: Table, targets: Mapping[str, tuple[int, int | None]], now: int) -> _Plan:
    """(tags to set: name -> (snapshot, max age), tags to remove, notes name -> kind)."""
    meta = tbl.metadata
    sets: dict[str, tuple[int, int | None]] = {}
    notes: dict[str, str] = {}
    for name, (sid, keep_until) in sorted(targets.items()):
        snap = meta.snapshot_by_id(sid)
        if snap is None:
            notes[name] = "missing"
            continue
        age = None
        if keep_until is not None:
            if keep_until <= now or keep_until <= snap.timestamp_ms:
                continue  # already past its retention: never (re)created
            age = keep_until - snap.timestamp_ms
        ref = meta.refs.get(name)
        if ref is not None and ref.snapshot_id == sid and ref.max_ref_age_ms == age:
            continue
        sets[name] = (sid, age)
        notes[name] = "created" if ref is None else "updated"
    return sets, [], notes


def _plan_drops(tbl: Table, now: int) -> _Plan:
    drops = [
        name
        for name, ref in sorted(tbl.metadata.refs.items())
        if parse_version_tag(name) is not None
        and ref.snapshot_ref_type == SnapshotRefType.TAG
        and _aged(tbl, ref, now)
    ]
    return {}, drops, dict.fromkeys(drops, "removed")


def _commit(load: Loader, table: str, plan: Callable[[Table], _Plan], report: TagReport) -> None:
    for _ in range(_RETRIES):
        tbl = load(table)
        sets, drops, notes = plan(tbl)
        if sets or drops:
            manage = tbl.manage_snapshots()
            for name in drops:
                manage.remove_tag(name)
            for name, (sid, age) in sets.items():
                manage.create_tag(sid, name, max_ref_age_ms=age)
            try:
                manage.commit()
            except CommitFailedException:
                continue
            except BACKEND_ERRORS as exc:
                raise StorageError(f"committing the tags of {table} failed: {exc}") from exc
        for name, kind in notes.items():
            getattr(report, kind).setdefault(table, []).append(name)
        if sets or drops:
            log.info("tags of %s: %s", table, notes)
        return
    raise Conflict(f"could not commit the tags of {table}: the table kept moving", table=table)


def _aged(tbl: Table, ref: SnapshotRef, now: int) -> bool:
    if ref.max_ref_age_ms is None:
        return False
    snap = tbl.metadata.snapshot_by_id(ref.snapshot_id)
    return snap is None or now - snap.timestamp_ms > ref.max_ref_age_ms


def _now_ms() -> int:
    return int(time.time() * 1000)
