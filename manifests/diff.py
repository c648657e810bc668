"""Diffs between two snapshot versions: which clips each can serve, and what changed.

:func:`diff_versions` (behind :meth:`manifests.registry.Registry.diff`) compares the
clips two versions' plans can serve (by ``clip_id``, less the rows a patch chain
excluded), their row counts, ``plan_rows``, recipe, catalog pins, stream shares,
counts and drops. See :class:`SnapshotDiff`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from catalog.errors import InvalidInput
from manifests.format import EXCLUDED_NAME, SKIPPED_NAME
from manifests.ipc import read_columns

if TYPE_CHECKING:
    from manifests.registry import Registry

__all__ = ["SnapshotDiff", "diff_versions"]


class SnapshotDiff(BaseModel):
    """What changed from version ``a`` to version ``b`` (``model_dump()`` is JSON-ready).

    A version's clips are those its plan can serve: the clips of its index rows,
    less the rows a patch chain excluded (``excluded_rows.parquet``; for a patch
    written before that artifact, the rows of ``skipped.parquet``). ``rows`` counts
    the same rows. ``clips_added``/``clips_removed`` are sorted and cut to
    ``max_clips`` when one was given; the ``num_*`` counts are always exact.
    ``counts``, ``drops`` and ``stream_shares`` map each (dotted, flattened) key to
    ``{"a", "b", "delta"}`` (``delta`` only for numbers; ``None`` stands for a key one
    side lacks); a patch's ``stream_shares`` are those its plan serves.
    ``catalog_changes`` names every pin entry that differs (Iceberg tables, and
    embedding models as ``embeddings/<model>``) as ``{"a", "b"}``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    a: int
    b: int
    num_clips_a: int
    num_clips_b: int
    num_clips_added: int
    num_clips_removed: int
    clips_added: list[str]
    clips_removed: list[str]
    clips_truncated: bool
    rows: dict[str, int]
    plan_rows: dict[str, int | None]
    recipe_sha256: dict[str, Any]
    catalog_changed: bool
    catalog_changes: dict[str, dict[str, Any]] = Field(
        description="Pin entries that differ, {key: {a, b}}: Iceberg tables by name, "
        "embedding models as 'embeddings/<model>'"
    )
    stream_shares: dict[str, dict[str, Any]]
    counts: dict[str, dict[str, Any]]
    drops: dict[str, dict[str, Any]]


def diff_versions(
    registry: Registry, a: int, b: int, *, max_clips: int | None = None
) -> SnapshotDiff:
    """Compare two versions: clips (by ``clip_id``), rows, shares, recipe, counts.

    Args:
        a: the older (or reference) version.
        b: the newer version.
        max_clips: cut the added/removed clip lists to this many (counts stay exact).
    """
    if max_clips is not None and max_clips < 0:
        raise InvalidInput("max_clips must be >= 0", field="max_clips")
    rec_a, rec_b = registry.get(a), registry.get(b)
    clips_a, rows_a = _clip_ids(registry, a)
    clips_b, rows_b = _clip_ids(registry, b)
    added = _sorted_difference(clips_b, clips_a)
    removed = _sorted_difference(clips_a, clips_b)
    limit = max(len(added), len(removed)) if max_clips is None else max_clips
    sa, sb = rec_a.snapshot, rec_b.snapshot
    pins = _pin_changes(sa.get("catalog_snapshot_ids"), sb.get("catalog_snapshot_ids"))
    return SnapshotDiff(
        a=a,
        b=b,
        num_clips_a=len(clips_a),
        num_clips_b=len(clips_b),
        num_clips_added=len(added),
        num_clips_removed=len(removed),
        clips_added=added.slice(0, limit).to_pylist(),
        clips_removed=removed.slice(0, limit).to_pylist(),
        clips_truncated=limit < max(len(added), len(removed)),
        rows={"a": rows_a, "b": rows_b, "delta": rows_b - rows_a},
        plan_rows=_change(sa.get("plan_rows"), sb.get("plan_rows")),
        recipe_sha256={
            "a": sa.get("recipe_sha256"),
            "b": sb.get("recipe_sha256"),
            "changed": sa.get("recipe_sha256") != sb.get("recipe_sha256"),
        },
        catalog_changed=bool(pins),
        catalog_changes=pins,
        stream_shares=_mapping_changes(sa.get("stream_shares"), sb.get("stream_shares")),
        counts=_mapping_changes(sa.get("counts"), sb.get("counts")),
        drops=_mapping_changes(sa.get("drops"), sb.get("drops")),
    )


def _clip_ids(registry: Registry, version: int) -> tuple[pa.Array, int]:
    """The distinct clip ids a version can serve, and the number of its rows."""
    with registry.local_artifact(version, "index.arrow") as path:
        rows, clip_ids = read_columns(path, ["row", "clip_id"])
    excluded = _excluded_rows(registry, version)
    if excluded is not None and len(excluded):
        clip_ids = pc.filter(clip_ids, pc.invert(pc.is_in(rows, value_set=excluded)))
    return pc.unique(clip_ids), len(clip_ids)


def _excluded_rows(registry: Registry, version: int) -> pa.Array | None:
    """Manifest rows a patch chain excluded from ``version`` (None: not a patch)."""

    refs = registry.get(version).artifacts
    name = EXCLUDED_NAME if EXCLUDED_NAME in refs else SKIPPED_NAME
    if name not in refs:
        return None
    table = pq.read_table(io.BytesIO(registry.read_artifact(version, name)), columns=["row"])
    return pc.unique(table["row"].combine_chunks())


def _sorted_difference(left: pa.Array, right: pa.Array) -> pa.Array:
    """Values of ``left`` not in ``right``, sorted (both distinct)."""
    kept = pc.filter(left, pc.invert(pc.is_in(left, value_set=right)))
    return pc.take(kept, pc.sort_indices(kept))


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): value}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _change(a: Any, b: Any) -> dict[str, Any]:
    change: dict[str, Any] = {"a": a, "b": b}
    if _is_number(a) and _is_number(b):
        change["delta"] = b - a
    return change


def _pin_changes(a: Any, b: Any) -> dict[str, dict[str, Any]]:
    """``{pin key: {"a", "b"}}`` for every key whose value differs."""
    pa_ = a if isinstance(a, Mapping) else {}
    pb = b if isinstance(b, Mapping) else {}
    if pa_ == pb:
        return {}
    if not pa_ or not pb:  # one side records no pin at all
        return {"catalog_snapshot_ids": {"a": a, "b": b}}
    return {
        key: {"a": pa_.get(key), "b": pb.get(key)}
        for key in sorted({*pa_, *pb})
        if pa_.get(key) != pb.get(key)
    }


def _mapping_changes(a: Any, b: Any) -> dict[str, dict[str, Any]]:
    """``{flattened key: {"a", "b", "delta"}}`` for every key of either mapping."""
    flat_a = _flatten(a) if isinstance(a, Mapping) else {}
    flat_b = _flatten(b) if isinstance(b, Mapping) else {}
    return {key: _change(flat_a.get(key), flat_b.get(key)) for key in sorted({*flat_a, *flat_b})}
