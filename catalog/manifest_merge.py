"""Manifest merging on the fast append: the manifest list stays short as a table ages.

A fast append keeps every manifest of its parent and adds one, so the manifest list a
commit reads and writes again grows by one entry per commit: at 16M clips in ~165
commits that was ~22 ms of a 10k-clip batch (cProfile, 6 Dec 2026), and it grows for
ever. Iceberg's merge append (``commit.manifest-merge.enabled``) bin-packs the
manifests into bins of ``commit.manifest.target-size-bytes`` (8 MiB) and rewrites the
bin of the new manifest once it holds ``commit.manifest.min-count-to-merge`` of them:
every manifest under 8 MiB (~20k entries here) is rewritten again every min-count
commits, which costs seconds in pyiceberg's Python Avro codec. So the rule here is a
size-tiered one under the same three properties (decision 052):

- a manifest's tier is ``floor(log_F(files))``, F the fan-in
  (``commit.manifest.min-count-to-merge``, default :data:`MIN_COUNT_DEFAULT`, at
  least 2); one of ``target-size-bytes`` or more is full and never merged again;
- the newest manifests of a spec, none full and none above tier t, are merged into
  one when F of them are of tier t (the lower ones go along), or when two or more
  reach the target size; a merge may complete the next tier's run (merged again in
  the same commit, as a counter carries).

After n one-file commits the list holds the sum of n's digits in base F manifests
(plus full ones), and each entry is rewritten about ``log_F(files)`` times.

What a merged manifest holds is Iceberg's merge: the entries of this commit stay
ADDED; every live entry of an older manifest is carried as EXISTING with its own
snapshot id and sequence numbers, so time travel, incremental append scans (which
read ADDED entries of the snapshots asked for) and sequence-number rules see what they
saw before; deleted entries of older snapshots are dropped (the manifests of their own
snapshots keep them). Delete manifests are listed as they are. Old snapshots keep their
own manifest lists and manifests: nothing is rewritten in place, a failed commit
removes the merged manifests with the rest of its files, and a crash leaves them
orphans that ``vidlake maintain`` removes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyiceberg.manifest import (
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import TableProperties
from pyiceberg.utils.properties import property_as_bool, property_as_int

from catalog.iceberg_files import existing_entry

__all__ = ["MIN_COUNT_DEFAULT", "merge", "merge_count", "policy"]

#: The fan-in F: manifests of one tier merged into one of the next.
MIN_COUNT_DEFAULT = 8

#: Writes the given entries as one manifest of the given spec id; returns it.
WriteManifest = Callable[[int, list[ManifestEntry]], ManifestFile]
#: Reads a manifest's entries, deleted ones included.
ReadEntries = Callable[[ManifestFile], list[ManifestEntry]]


def policy(properties: Mapping[str, str]) -> tuple[bool, int, int]:
    """``(enabled, fan_in, target_bytes)`` of a table's properties.

    Raises:
        ValueError: A property is set to something that is not a boolean or a
            positive integer.
    """
    props = dict(properties)
    enabled = property_as_bool(props, TableProperties.MANIFEST_MERGE_ENABLED, True)
    min_count = property_as_int(props, TableProperties.MANIFEST_MIN_MERGE_COUNT, MIN_COUNT_DEFAULT)
    target = property_as_int(
        props,
        TableProperties.MANIFEST_TARGET_SIZE_BYTES,
        TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT,
    )
    if min_count is None or min_count < 1 or target is None or target < 1:
        raise ValueError(
            f"{TableProperties.MANIFEST_MIN_MERGE_COUNT} and "
            f"{TableProperties.MANIFEST_TARGET_SIZE_BYTES} must be positive integers"
        )
    return enabled, max(2, min_count), target  # a fan-in of 1 would merge nothing


def merge(
    manifests: list[ManifestFile],
    snapshot_id: int,
    properties: Mapping[str, str],
    read: ReadEntries,
    write: WriteManifest,
) -> list[ManifestFile]:
    """The manifest list of a commit: ``manifests`` (its own new manifest first, then
    its parent's, newest first), with runs of the newest merged by the tier rule.

    Args:
        manifests: The commit's new manifest, then the parent's manifests in order.
        snapshot_id: The committing snapshot (its entries stay ADDED).
        properties: The table's properties (the ``commit.manifest*`` policy).
        read: Reads a manifest's entries (sequence numbers inherited).
        write: Writes one merged manifest (and records its path for cleanup).

    Returns:
        The manifests to list: each spec's data manifests (in the order of the specs'
        first appearance), then the delete manifests as they were.
    """
    enabled, fan_in, target = policy(properties)
    if not enabled or len(manifests) < 2:
        return manifests
    by_spec: dict[int, list[ManifestFile]] = {}
    for m in manifests:
        if m.content == ManifestContent.DATA:
            by_spec.setdefault(m.partition_spec_id, []).append(m)
    out: list[ManifestFile] = []
    for spec_id, group in by_spec.items():
        while k := merge_count(group, fan_in, target):
            merged = write(spec_id, _entries(group[:k], snapshot_id, read))
            group = [merged, *group[k:]]  # may complete a run of the next tier
        out.extend(group)
    return out + [m for m in manifests if m.content != ManifestContent.DATA]


def merge_count(group: list[ManifestFile], fan_in: int, target: int) -> int:
    """How many of the newest manifests of one spec to merge now (0: none).

    A manifest's tier is ``floor(log_fan_in(files))``; one of ``target`` bytes or more
    is full and never merged. For each tier from the lowest, the run is the newest
    manifests, none full, none of a higher tier: merge it when it holds ``fan_in`` of
    that tier (the lower ones go along) or, holding two or more, ``target`` bytes.
    """
    tiers = [None if m.manifest_length >= target else _tier(_files(m), fan_in) for m in group]
    for top in sorted({t for t in tiers if t is not None}):
        k = at_top = size = 0
        while k < len(group) and (tier := tiers[k]) is not None and tier <= top:
            at_top += tier == top
            size += group[k].manifest_length
            k += 1
        if at_top >= fan_in or (k >= 2 and size >= target):
            return k
    return 0


def _files(m: ManifestFile) -> int:
    counts = (m.added_files_count, m.existing_files_count, m.deleted_files_count)
    return max(1, sum(c or 0 for c in counts))


def _tier(files: int, fan_in: int) -> int:
    tier = 0
    while files >= fan_in:
        files //= fan_in
        tier += 1
    return tier


def _entries(group: list[ManifestFile], snapshot_id: int, read: ReadEntries) -> list[ManifestEntry]:
    """The entries of a merged manifest: this commit's as they are, older live ones
    as EXISTING (snapshot id and sequence numbers kept), older deletions dropped."""
    out: list[ManifestEntry] = []
    for manifest in group:
        for e in read(manifest):
            if e.snapshot_id == snapshot_id and e.status == ManifestEntryStatus.ADDED:
                out.append(e)  # this commit's own (sequence numbers still to inherit)
            elif e.status != ManifestEntryStatus.DELETED:
                out.append(existing_entry(e))
    return out
