"""Patches: a new version whose plan skips some samples and keeps every step.

After a loss spike or a late takedown, training must stop seeing a cohort without
renumbering steps (checkpoints name steps). :func:`patch` rewrites ``plan.arrow``
so that each step keeps its number, phase, bucket and stream epochs, drops the
excluded manifest rows from ``rows`` (keeping the order of the rest) and adds how
many it dropped to ``skipped``. ``skipped.parquet`` lists every skipped
(step, row) with its clip and reason, cumulatively over a chain of patches, so that

    old plan rows of step s  ==  new plan rows of step s  +  skipped rows of step s

holds per step against the unpatched plan. ``excluded_rows.parquet`` lists every
manifest row the chain of patches excluded (``row, clip_id, reason``), served or not,
so a diff knows which clips a patched version can still serve. The index and manifest
are re-used as they are (same objects, same SHA-256).

``snapshot.json`` of a patch describes what the *patched* plan serves: ``plan_rows``,
``tokens``, ``stream_shares`` (share of plan rows per stream) and each phase's
``plan_rows``, ``tokens`` and ``realized`` shares are recomputed from the new plan,
never copied from the base.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from catalog.errors import Conflict, IntegrityError, InvalidInput
from manifests.format import (
    EXCLUDED_NAME,
    EXCLUDED_SCHEMA,
    PLAN_SCHEMA,
    SKIPPED_NAME,
    SKIPPED_SCHEMA,
)
from manifests.ipc import ipc_writer, iter_batches
from manifests.registry import Registry, SnapshotRecord

__all__ = [
    "filter_plan_batch",
    "patch",
]

_CLAIM_ATTEMPTS = 5
_UNKNOWN_SHOWN = 10


def patch(
    registry: Registry,
    version: int,
    *,
    exclude_clip_ids: Iterable[str] | None = None,
    exclude_asset_ids: Iterable[str] | None = None,
    exclude_rows: Iterable[int] | None = None,
    reason: str,
    by: str | None = None,
) -> SnapshotRecord:
    """Publish a patch of ``version`` that skips every sample of the excluded clips,
    assets and manifest rows (and the rows an erasure of ``version`` blanked).

    The new version's parent is the latest version when it is claimed (a patch does
    not depend on its parent, so a lost race is retried a few times before the
    :class:`Conflict` reaches the caller); ``patch_of`` is ``version``.

    Args:
        registry: where ``version`` lives and the patch is published.
        version: the version to patch (itself possibly a patch).
        exclude_clip_ids: clips whose every manifest row is skipped.
        exclude_asset_ids: assets whose every clip is skipped.
        exclude_rows: manifest row numbers to skip.
        reason: why (recorded in ``snapshot.json`` and on every skipped row).
        by: who asked.

    Raises:
        InvalidInput: no exclusion, an empty reason, or an id or row that the
            version's index does not hold (``exc.unknown`` lists a few).
        NotFound: ``version`` does not exist.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("a patch needs a non-empty reason", field="reason")
    clip_ids = _distinct_strings(exclude_clip_ids, "exclude_clip_ids")
    asset_ids = _distinct_strings(exclude_asset_ids, "exclude_asset_ids")
    rows = _distinct_rows(exclude_rows)
    if not (clip_ids or asset_ids or len(rows)):
        raise InvalidInput(
            "a patch needs at least one clip, asset or row to exclude", field="exclude"
        )
    base = registry.get(version)
    refs = base.artifacts
    if base.erasures:
        # Rows a hard-takedown erasure blanked: the patch's plan skips them outright
        # (a patch version carries no erasure mark of its own).
        rows = np.union1d(rows, np.asarray(base.erasures[-1].erased_rows, dtype=np.int64))
    with tempfile.TemporaryDirectory(prefix="vidlake-patch-") as tmp:
        work = Path(tmp)
        with registry.local_artifact(version, "index.arrow") as index_path:
            excluded, excluded_clips, excluded_streams = _resolve(
                index_path, clip_ids, asset_ids, rows
            )
            row_stream, row_tokens = _row_columns(index_path)
        plan_path = registry.artifact_path(version, "plan.arrow", work / "old")
        earlier = None
        if SKIPPED_NAME in refs:
            earlier = pq.read_table(registry.artifact_path(version, SKIPPED_NAME, work / "old"))
        stats = _rewrite_plan(
            plan_path,
            work / "plan.arrow",
            work / SKIPPED_NAME,
            excluded,
            excluded_clips,
            excluded_streams,
            reason,
            earlier,
        )
        stats.update(_served(work / "plan.arrow", row_stream, row_tokens))
        earlier_excluded = None
        if EXCLUDED_NAME in refs:
            earlier_excluded = pq.read_table(
                registry.artifact_path(version, EXCLUDED_NAME, work / "old")
            )
        _write_excluded(work / EXCLUDED_NAME, excluded, excluded_clips, reason, earlier_excluded)
        uploaded = registry.upload_artifacts(
            {
                "manifest.parquet": refs["manifest.parquet"],
                "index.arrow": refs["index.arrow"],
                "plan.arrow": work / "plan.arrow",
                SKIPPED_NAME: work / SKIPPED_NAME,
                EXCLUDED_NAME: work / EXCLUDED_NAME,
            }
        )
    snapshot = _patched_snapshot(
        base,
        stats,
        reason=reason,
        by=by,
        requested={"clip_ids": len(clip_ids), "asset_ids": len(asset_ids), "rows": len(rows)},
        manifest_rows=len(excluded),
    )
    for attempt in range(_CLAIM_ATTEMPTS):
        try:
            return registry.publish(
                uploaded, snapshot, parent=registry.next_parent(), patch_of=version
            )
        except Conflict:
            if attempt == _CLAIM_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def filter_plan_batch(
    batch: pa.RecordBatch, excluded: pa.Array
) -> tuple[pa.RecordBatch, NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Drop the manifest rows in ``excluded`` (an int64 array) from every step of a
    plan batch, vectorised over the flattened ``rows`` column.

    Returns the new batch (same steps; ``rows`` filtered in order; ``skipped`` +=
    the number dropped), the number dropped per step, and the (step, row) of every
    dropped entry in plan order.
    """
    lists = batch.column("rows")
    values = pc.list_flatten(lists)
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    drop = pc.is_in(values, value_set=excluded)
    drop_np = drop.to_numpy(zero_copy_only=False)
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    dropped = np.bincount(owner[drop_np], minlength=len(lengths)).astype(np.int64)
    kept_lengths = lengths - dropped
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(kept_lengths, out=offsets[1:])
    new_rows = pa.ListArray.from_arrays(pa.array(offsets), pc.filter(values, pc.invert(drop)))
    old_skipped = batch.column("skipped").to_numpy(zero_copy_only=False).astype(np.int64)
    skipped = old_skipped + dropped
    if skipped.size and skipped.max() > np.iinfo(np.int32).max:
        raise IntegrityError("skipped count overflows int32")
    arrays = [batch.column(name) for name in ("step", "phase", "bucket", "stream_epochs")]
    out = pa.RecordBatch.from_arrays(
        [*arrays, new_rows, pa.array(skipped.astype(np.int32), pa.int32())], schema=PLAN_SCHEMA
    )
    steps = batch.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    values_np = values.to_numpy(zero_copy_only=False).astype(np.int64)
    return out, dropped, steps[owner[drop_np]], values_np[drop_np]


def _distinct_strings(values: Iterable[str] | None, field: str) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str | bytes):
        raise InvalidInput(f"{field} must be a list of ids, not one string", field=field)
    distinct = sorted(set(values))
    if not all(isinstance(v, str) and v for v in distinct):
        raise InvalidInput(f"{field} must hold non-empty strings", field=field)
    return distinct


def _distinct_rows(values: Iterable[int] | None) -> NDArray[np.int64]:
    if values is None:
        return np.zeros(0, dtype=np.int64)
    raw = np.asarray(list(values))
    if raw.size and (raw.dtype.kind not in "iu" or raw.min() < 0):
        raise InvalidInput("exclude_rows must hold manifest row numbers >= 0", field="exclude_rows")
    return np.unique(raw.astype(np.int64))


def _resolve(
    index_path: Path, clip_ids: list[str], asset_ids: list[str], rows: NDArray[np.int64]
) -> tuple[NDArray[np.int64], pa.Array, NDArray[np.int32]]:
    """Manifest rows the exclusions name (sorted), with their clip ids and streams.

    Every requested id and row must exist in the index, so that a typo cannot
    pass for an exclusion that did nothing.
    """
    clip_set = pa.array(clip_ids, pa.string())
    asset_set = pa.array(asset_ids, pa.string())
    row_set = pa.array(rows, pa.int64())
    hit_rows, hit_clips, hit_streams, seen_clips, seen_assets = [], [], [], [], []
    num_rows = 0
    for batch in iter_batches(index_path, what="index.arrow"):
        num_rows += batch.num_rows
        by_clip = pc.is_in(batch.column("clip_id"), value_set=clip_set)
        by_asset = pc.is_in(batch.column("asset_id"), value_set=asset_set)
        mask = pc.or_(pc.or_(by_clip, by_asset), pc.is_in(batch.column("row"), value_set=row_set))
        seen_clips.append(pc.unique(pc.filter(batch.column("clip_id"), by_clip)))
        seen_assets.append(pc.unique(pc.filter(batch.column("asset_id"), by_asset)))
        # Copy out of the memory map: the file goes away before these are used.
        hit_rows.append(pc.filter(batch.column("row"), mask).to_numpy().copy())
        hit_streams.append(pc.filter(batch.column("stream"), mask).to_numpy().copy())
        hit_clips.append(
            pa.concat_arrays([pa.array([], pa.string()), pc.filter(batch.column("clip_id"), mask)])
        )
    _require_known("exclude_clip_ids", clip_set, seen_clips)
    _require_known("exclude_asset_ids", asset_set, seen_assets)
    if len(rows) and rows[-1] >= num_rows:
        unknown = rows[rows >= num_rows][:_UNKNOWN_SHOWN].tolist()
        raise InvalidInput(
            f"exclude_rows: rows {unknown} are beyond the manifest's {num_rows}",
            field="exclude_rows",
            unknown=unknown,
        )
    row_np = np.concatenate([np.zeros(0, np.int64), *hit_rows]).astype(np.int64)
    order = np.argsort(row_np, kind="stable")
    clips = pa.concat_arrays([pa.array([], pa.string()), *hit_clips]).take(pa.array(order))
    streams = np.concatenate([np.zeros(0, np.int32), *hit_streams]).astype(np.int32)[order]
    return row_np[order], clips, streams


def _require_known(field: str, requested: pa.Array, seen: list[pa.Array]) -> None:
    found = pa.concat_arrays([pa.array([], pa.string()), *seen])
    unknown = pc.filter(requested, pc.invert(pc.is_in(requested, value_set=found)))
    if len(unknown):
        shown = unknown.slice(0, _UNKNOWN_SHOWN).to_pylist()
        raise InvalidInput(
            f"{field}: {len(unknown)} ids are not in this snapshot, e.g. {shown}",
            field=field,
            unknown=shown,
            num_unknown=len(unknown),
        )


def _rewrite_plan(
    old_plan: Path,
    new_plan: Path,
    skipped_path: Path,
    excluded: NDArray[np.int64],
    excluded_clips: pa.Array,
    excluded_streams: NDArray[np.int32],
    reason: str,
    earlier: pa.Table | None,
) -> dict[str, Any]:
    """Stream the old plan through :func:`filter_plan_batch` into ``new_plan`` and
    write ``skipped.parquet``; return the totals for ``snapshot.json``."""
    skipped_parts = [] if earlier is None else [earlier.select(SKIPPED_SCHEMA.names)]
    plan_rows = skipped_now = 0
    per_stream = np.zeros(int(excluded_streams.max(initial=-1)) + 1, dtype=np.int64)
    reason_array = pa.array([reason], pa.string())
    value_set = pa.array(excluded, pa.int64())
    batches = iter_batches(old_plan, schema=PLAN_SCHEMA, what="plan.arrow")
    with ipc_writer(new_plan, PLAN_SCHEMA) as writer:
        for batch in batches:
            out, dropped, steps, rows = filter_plan_batch(batch, value_set)
            writer.write_batch(out)
            plan_rows += int(pc.sum(pc.list_value_length(out.column("rows"))).as_py() or 0)
            skipped_now += int(dropped.sum())
            where = np.searchsorted(excluded, rows)
            np.add.at(per_stream, excluded_streams[where], 1)
            skipped_parts.append(
                pa.table(
                    [
                        pa.array(steps, pa.int64()),
                        pa.array(rows, pa.int64()),
                        excluded_clips.take(pa.array(where, pa.int64())),
                        reason_array.take(pa.array(np.zeros(len(rows), np.int64))),
                    ],
                    schema=SKIPPED_SCHEMA,
                )
            )
    table = pa.concat_tables([SKIPPED_SCHEMA.empty_table(), *skipped_parts])
    # A stable sort by step keeps earlier patches' rows first and plan order within.
    table = table.take(pc.sort_indices(table, sort_keys=[("step", "ascending")]))
    pq.write_table(table, str(skipped_path))
    return {
        "plan_rows": plan_rows,
        "skipped_rows": skipped_now,
        "skipped_total": table.num_rows,
        "per_stream": per_stream,
    }


def _row_columns(index_path: Path) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Stream and tokens of every manifest row, by row number."""
    streams, tokens, rows = [], [], []
    for batch in iter_batches(index_path, what="index.arrow"):
        rows.append(batch.column("row").to_numpy().astype(np.int64))
        streams.append(batch.column("stream").to_numpy().astype(np.int64))
        tokens.append(batch.column("tokens").to_numpy().astype(np.int64))
    row = np.concatenate([np.zeros(0, np.int64), *rows])
    stream = np.zeros(len(row), np.int64)
    token = np.zeros(len(row), np.int64)
    stream[row] = np.concatenate([np.zeros(0, np.int64), *streams])
    token[row] = np.concatenate([np.zeros(0, np.int64), *tokens])
    return stream, token


def _served(
    plan: Path, row_stream: NDArray[np.int64], row_tokens: NDArray[np.int64]
) -> dict[str, Any]:
    """Samples and tokens the plan serves, per (phase, stream): one vectorised pass."""
    num_streams = int(row_stream.max(initial=-1)) + 1
    samples = np.zeros((0, num_streams), np.int64)
    tokens = np.zeros((0, num_streams), np.int64)
    for batch in iter_batches(plan, what="plan.arrow"):
        lists = batch.column("rows")
        values = pc.list_flatten(lists).to_numpy().astype(np.int64)
        lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
        phase = np.repeat(batch.column("phase").to_numpy().astype(np.int64), lengths)
        num_phases = max(samples.shape[0], int(phase.max(initial=-1)) + 1)
        samples = np.pad(samples, ((0, num_phases - samples.shape[0]), (0, 0)))
        tokens = np.pad(tokens, ((0, num_phases - tokens.shape[0]), (0, 0)))
        np.add.at(samples, (phase, row_stream[values]), 1)
        np.add.at(tokens, (phase, row_stream[values]), row_tokens[values])
    return {"served_samples": samples, "served_tokens": tokens}


def _write_excluded(
    path: Path,
    excluded: NDArray[np.int64],
    excluded_clips: pa.Array,
    reason: str,
    earlier: pa.Table | None,
) -> None:
    """Every row the patch chain excluded, each once (the first patch's reason kept)."""
    now = pa.table(
        [
            pa.array(excluded, pa.int64()),
            excluded_clips.cast(pa.string()),
            pa.array([reason] * len(excluded), pa.string()),
        ],
        schema=EXCLUDED_SCHEMA,
    )
    parts = [] if earlier is None else [earlier.select(EXCLUDED_SCHEMA.names).cast(EXCLUDED_SCHEMA)]
    table = pa.concat_tables([*parts, now])
    rows = table["row"].to_numpy()
    _, first = np.unique(rows, return_index=True)  # sorted by row, earliest entry kept
    pq.write_table(table.take(pa.array(first)), str(path))


def _shares(values: NDArray[np.int64], names: list[Any]) -> dict[str, float]:
    total = int(values.sum())
    return {
        (str(names[k]) if k < len(names) else str(k)): (int(v) / total if total else 0.0)
        for k, v in enumerate(values)
    }


def _served_figures(snapshot: dict[str, Any], stats: dict[str, Any]) -> None:
    """Overwrite the base's plan figures with what the patched plan serves."""
    names = list(snapshot.get("streams") or [])
    samples, tokens = stats["served_samples"], stats["served_tokens"]
    shares = _shares(samples.sum(axis=0), names)
    base = snapshot.get("stream_shares") or {}
    # A patch only removes rows: the base's streams, each at its served share.
    snapshot["stream_shares"] = (
        {k: shares.get(k, 0.0) for k in base} if base else {k: v for k, v in shares.items() if v}
    )
    snapshot["tokens"] = int(tokens.sum())
    phases = []
    for i, phase in enumerate(snapshot.get("phases") or []):
        phase = dict(phase)
        row_s = samples[i] if i < len(samples) else np.zeros(len(names), np.int64)
        row_t = tokens[i] if i < len(tokens) else np.zeros(len(names), np.int64)
        phase["plan_rows"] = int(row_s.sum())
        phase["tokens"] = int(row_t.sum())
        if "realized" in phase:
            served = _shares(row_t if phase.get("unit") == "tokens" else row_s, names)
            phase["realized"] = {k: served.get(k, 0.0) for k in phase["realized"]}
        phases.append(phase)
    if phases:
        snapshot["phases"] = phases


def _patched_snapshot(
    base: SnapshotRecord,
    stats: dict[str, Any],
    *,
    reason: str,
    by: str | None,
    requested: dict[str, int],
    manifest_rows: int,
) -> dict[str, Any]:
    snapshot = {k: v for k, v in base.snapshot.items() if k not in ("version", "parent")}
    names = snapshot.get("streams") or []
    per_stream = stats["per_stream"]
    by_stream = {
        (str(names[k]) if k < len(names) else str(k)): int(n) for k, n in enumerate(per_stream) if n
    }
    snapshot["plan_rows"] = stats["plan_rows"]
    _served_figures(snapshot, stats)
    counts = dict(snapshot.get("counts") or {})
    counts["skipped_plan_rows"] = stats["skipped_total"]
    snapshot["counts"] = counts
    snapshot["patch"] = {
        "reason": reason,
        "by": by,
        "excluded": {**requested, "manifest_rows": manifest_rows},
        "skipped_plan_rows": stats["skipped_rows"],
        "skipped_plan_rows_total": stats["skipped_total"],
        "skipped_by_stream": by_stream,
    }
    return snapshot
