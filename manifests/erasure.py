"""Erasure marks: registered versions rewritten after a hard takedown.

A version is immutable, but a hard takedown must not leave the erased asset's caption
text or ids in its artifacts. So each version that held the asset (or a member of a
pack the erasure rewrote, or whose catalog pin the erasure expired) gets a
create-only **erasure mark** next to its registry entry::

    manifests/v{N:06d}.erasure-{k:04d}.json     k = 1, 2, … (one per erasure)

The mark names the version's artifacts *after* the erasure (``index.arrow`` and
``manifest.parquet`` rewritten with the erased rows blanked: the row numbers, stream,
bucket, phase and frame count stay so that ``plan.arrow`` — row numbers only — and
every resume cursor remain valid; latent members moved by a pack rewrite repointed),
the sorted manifest rows erased so far (cumulative over marks), the erasure id, and
the catalog pins the erasure expired. Readers follow the mark with the highest ``k``:
:meth:`manifests.registry.Registry.get` applies it, the loader reads it
(:func:`manifests.format.erasure_prefix`) and skips the erased rows, counting them.

:func:`erase_versions` is the registry step of :func:`catalog.erase.erase_asset`;
it is idempotent (a version already marked by this erasure is skipped) and, once every
mark is written, deletes the replaced artifact objects that no version still names.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from catalog.errors import Conflict
from manifests.format import erasure_key
from manifests.ipc import read_table, write_table
from manifests.registry import ArtifactRef, ErasureMark, Registry, canonical_json

__all__ = ["KEEP_COLUMNS", "blank_rows", "erase_versions"]

Progress = Callable[[str, float], None]
#: Columns an erased row keeps: what the plan's structure and the loader's step
#: assembly need; everything else (ids, captions, objects, scores) is blanked.
KEEP_COLUMNS = frozenset({"row", "stream", "bucket", "phase", "num_frames"})
_REWRITTEN = ("index.arrow", "manifest.parquet")
_MARK_ATTEMPTS = 16


def erase_versions(
    registry: Registry,
    plan: Mapping[str, Any],
    packs: Mapping[str, Any],
    expired: Mapping[str, list[int]],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Mark every version the erasure touches; delete replaced artifacts.

    Args:
        registry: the registry (its store holds the artifacts).
        plan: the erasure plan (``erasure_id``, ``asset_id``, ``clip_ids``).
        packs: old pack SHA-256 → ``{"sha256", "size", "moves"}`` (catalog.erase.packs).
        expired: Iceberg snapshot ids the erasure expired, per table.

    Returns:
        ``{"marked": {version: {"rows_erased", "rows_repointed", "expired_pins"}},
        "artifacts_deleted": [...]}``.
    """
    eid = str(plan["erasure_id"])
    marked: dict[str, Any] = {}
    versions = registry.versions()
    for i, version in enumerate(versions):
        if progress is not None:
            progress("versions", 0.6 + 0.2 * i / max(1, len(versions)))
        mark = _mark_version(registry, version, plan, packs, expired)
        if mark is not None:
            marked[str(version)] = {
                "seq": mark.seq,
                "rows_erased": mark.rows_erased,
                "rows_repointed": mark.rows_repointed,
                "expired_pins": mark.expired_pins,
            }
    return {"marked": marked, "artifacts_deleted": _delete_replaced(registry, eid)}


def _mark_version(
    registry: Registry,
    version: int,
    plan: Mapping[str, Any],
    packs: Mapping[str, Any],
    expired: Mapping[str, list[int]],
) -> ErasureMark | None:
    eid = str(plan["erasure_id"])
    for _ in range(_MARK_ATTEMPTS):
        marks = registry.erasures(version)
        own = [m for m in marks if m.erasure_id == eid]
        if own:
            return own[-1]
        record = registry.get(version)
        pins = {
            t: int(sid)
            for t, sid in (record.snapshot.get("catalog_snapshot_ids") or {}).items()
            if sid is not None and int(sid) in set(expired.get(t, []))
        }
        with tempfile.TemporaryDirectory(prefix="vidlake-erase-") as tmp:
            work = Path(tmp)
            with registry.local_artifact(version, "index.arrow") as path:
                index = read_table(path, what="index.arrow")
            erased, moved = _affected(index, plan, packs)
            previous = marks[-1] if marks else None
            if not erased.any() and not moved.any() and not pins:
                return None
            artifacts = dict(record.artifacts)
            artifacts.pop("snapshot.json", None)
            replaced: dict[str, str] = {}
            if erased.any() or moved.any():
                new_index = work / "index.arrow"
                _write_ipc(index, blank_rows(_repoint(index, moved, packs), erased), new_index)
                manifest = pq.read_table(
                    registry.artifact_path(version, "manifest.parquet", work / "m")
                )
                m_erased, m_moved = _affected(manifest, plan, packs)
                new_manifest = work / "manifest.parquet"
                pq.write_table(
                    blank_rows(_repoint(manifest, m_moved, packs), m_erased),
                    new_manifest,
                    compression="zstd",
                    write_statistics=True,
                )
                refs = registry.upload_artifacts(
                    {**artifacts, "index.arrow": new_index, "manifest.parquet": new_manifest}
                )
                for name in _REWRITTEN:
                    if refs[name].sha256 != artifacts[name].sha256:
                        replaced[name] = artifacts[name].sha256
                artifacts = refs
            rows = set(previous.erased_rows if previous else [])
            rows |= set(np.flatnonzero(erased).tolist())
            mark = ErasureMark(
                version=version,
                seq=(previous.seq if previous else 0) + 1,
                erasure_id=eid,
                asset_id=str(plan["asset_id"]),
                artifacts={
                    n: ArtifactRef(sha256=r.sha256, size=r.size) for n, r in artifacts.items()
                },
                replaced=replaced,
                erased_rows=sorted(rows),
                rows_erased=int(erased.sum()),
                rows_repointed=int(moved.sum()),
                expired_pins=pins,
                created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            )
        try:
            registry.store.put_key(
                erasure_key(version, mark.seq), canonical_json(mark.model_dump())
            )
        except Conflict:
            continue  # another erasure marked this version first: build on its mark
        return mark
    raise Conflict(f"could not mark version {version}: marks kept changing", version=version)


def _affected(
    table: pa.Table, plan: Mapping[str, Any], packs: Mapping[str, Any]
) -> tuple[np.ndarray[Any, np.dtype[np.bool_]], np.ndarray[Any, np.dtype[np.bool_]]]:
    """(rows of the erased asset, other rows whose latent sits in a rewritten pack)."""
    n = table.num_rows
    erased = np.zeros(n, dtype=bool)
    if "asset_id" in table.column_names:
        erased |= pc.fill_null(pc.equal(table["asset_id"], str(plan["asset_id"])), False).to_numpy(
            zero_copy_only=False
        )
    if "clip_id" in table.column_names and plan["clip_ids"]:
        ids = pa.array(list(plan["clip_ids"]), pa.string())
        erased |= pc.fill_null(pc.is_in(table["clip_id"], ids), False).to_numpy(
            zero_copy_only=False
        )
    moved = np.zeros(n, dtype=bool)
    if packs and "object_sha256" in table.column_names:
        olds = pa.array(sorted(packs), pa.string())
        moved = pc.fill_null(pc.is_in(table["object_sha256"], olds), False).to_numpy(
            zero_copy_only=False
        )
        moved &= ~erased
    return erased, moved


def _repoint(
    table: pa.Table, moved: np.ndarray[Any, np.dtype[np.bool_]], packs: Mapping[str, Any]
) -> pa.Table:
    if not moved.any():
        return table
    where = {
        (old, o): (p["sha256"], p["size"], new)
        for old, p in packs.items()
        for o, _, new in p["moves"]
    }
    shas = table["object_sha256"].to_pylist()
    offsets = table["offset"].to_pylist()
    sizes = table["object_size"].to_pylist() if "object_size" in table.column_names else None
    for i in np.flatnonzero(moved).tolist():
        new_sha, new_size, new_off = where[(shas[i], offsets[i])]
        shas[i], offsets[i] = new_sha, new_off
        if sizes is not None:
            sizes[i] = new_size
    out = _set(table, "object_sha256", shas)
    out = _set(out, "offset", offsets)
    return _set(out, "object_size", sizes) if sizes is not None else out


def _set(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    i = table.schema.get_field_index(name)
    field = table.schema.field(i)
    return table.set_column(i, field, pa.array(values, field.type))


def blank_rows(table: pa.Table, erased: np.ndarray[Any, np.dtype[np.bool_]]) -> pa.Table:
    """``table`` with every column but :data:`KEEP_COLUMNS` blanked where ``erased``:
    null in a nullable column, else the type's empty value ("", 0, [], false)."""
    if not erased.any():
        return table
    mask = pa.array(erased)
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name in KEEP_COLUMNS:
            columns.append(column)
            continue
        blank = pa.scalar(None, field.type) if field.nullable else _empty(field.type)
        columns.append(pc.if_else(mask, blank, column.combine_chunks()))
    return pa.Table.from_arrays(columns, schema=table.schema)


def _empty(typ: pa.DataType) -> pa.Scalar:
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pa.scalar("", typ)
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return pa.scalar(b"", typ)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return pa.scalar([], typ)
    if pa.types.is_boolean(typ):
        return pa.scalar(False, typ)
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return pa.scalar(0, typ)
    return pa.scalar(None, typ)  # a nested type without an obvious empty value


def _write_ipc(original: pa.Table, table: pa.Table, path: Path) -> None:
    """Write ``table`` as an uncompressed IPC file with ``original``'s batch layout, so
    that readers locating rows by batch stride find them where they were."""
    sizes = [b.num_rows for b in original.to_batches()]
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    batches = (
        table.slice(int(start), size).combine_chunks().to_batches()[0]
        if size
        else table.schema.empty_table().to_batches()[0]
        for start, size in zip(starts, sizes, strict=False)
    )
    write_table(path, batches, table.schema)


def _delete_replaced(registry: Registry, eid: str) -> list[str]:
    """Delete the artifacts this erasure replaced that no version still names."""
    replaced: set[str] = set()
    named: set[str] = set()
    for version in registry.versions():
        named |= {ref.sha256 for ref in registry.get(version).artifacts.values()}
        for mark in registry.erasures(version):
            if mark.erasure_id == eid:
                replaced |= set(mark.replaced.values())
    gone = sorted(replaced - named)
    for sha in gone:
        registry.store.delete(sha, reason=f"erasure {eid}: artifact replaced by a blanked copy")
    return gone
