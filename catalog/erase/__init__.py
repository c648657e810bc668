"""Hard-takedown erasure: remove an asset's bytes from everything vidlake owns.

:func:`erase_asset` is a job of idempotent steps driven by durable records
(:mod:`catalog.erase.records`); a rerun after a crash at any point — ``kill -9``
included — completes it, and a rerun after completion returns the audit record::

    request   erasures/<id>/request.json (create-only): asset, who, why, when
    plan      erasures/<id>/plan.json: clips and objects by fate (catalog.erase.plan)
    packs     shared packs rewritten without the erased members (catalog.erase.packs)
    iceberg   per table, files rewritten + snapshots expired + old files purged
              (catalog.erase.iceberg), in the order latents, captions, scores, clips, assets
    versions  the caller's hook: registered snapshot versions get blanked artifacts
              (manifests.erasure) — the catalog does not know the registry
    vectors   LanceDB rows of the asset deleted, old versions cleaned up
    objects   latent objects only the asset used, replaced packs and owned text
              embeddings deleted (each re-checked against the catalog first)
    result    erasures/<id>/result.json: the audit record

The erasure id is a function of the asset id, so two requests for one asset are one
job. The asset needs a hard tombstone first (the tombstone and the asset's events are
kept: they are the governance record). Objects adopted by reference (TAR shards at a
publisher's URL) cannot be erased by us: they are listed in the result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import Or

from catalog.catalog import VidlakeCatalog
from catalog.erase.iceberg import TableErasure, erase_rows
from catalog.erase.packs import rewrite_packs
from catalog.erase.plan import build_plan, require_hard_tombstone
from catalog.erase.records import (
    eq,
    erasure_id,
    get_record,
    isin,
    list_erasure_ids,
    put_once,
    record_key,
)
from catalog.errors import NotFound

__all__ = [
    "ERASE_ORDER",
    "VersionsHook",
    "erase_asset",
    "erasure_id",
    "get_erasure",
    "list_erasures",
]

Progress = Callable[[str, float], None]
#: ``hook(plan, packs, expired, progress) -> summary``: rewrite registered versions.
VersionsHook = Callable[
    [Mapping[str, Any], Mapping[str, Any], Mapping[str, list[int]], Progress], Mapping[str, Any]
]
#: Tables rewritten, children first: a crash never leaves a row whose parent is gone
#: while it still exists.
ERASE_ORDER = ("latents", "captions", "scores", "clips", "assets")


def erase_asset(
    catalog: VidlakeCatalog,
    asset_id: str,
    *,
    reason: str = "hard takedown",
    requested_by: str | None = None,
    versions: VersionsHook | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Erase ``asset_id`` (see the module docstring) and return the audit record.

    Raises:
        InvalidInput: a malformed asset id, or the asset has no hard tombstone.
        NotFound: the catalog never held the asset (and no erasure of it exists).
    """
    report = progress or (lambda stage, fraction: None)
    store = catalog.objects
    eid = erasure_id(asset_id) if isinstance(asset_id, str) else ""
    done = get_record(store, record_key(eid, "result.json")) if eid else None
    if done is not None:
        return done
    require_hard_tombstone(catalog, asset_id)
    request = put_once(
        store,
        record_key(eid, "request.json"),
        {
            "erasure_id": eid,
            "asset_id": asset_id,
            "reason": reason,
            "requested_by": requested_by,
            "requested_at": _now(),
        },
    )
    report("plan", 0.0)
    plan = get_record(store, record_key(eid, "plan.json"))
    if plan is None:
        plan = put_once(store, record_key(eid, "plan.json"), build_plan(catalog, asset_id, eid))
    report("packs", 0.1)
    packs = get_record(store, record_key(eid, "packs.json"))
    if packs is None:
        rewritten = rewrite_packs(catalog, plan["objects"]["packs"], plan["clip_ids"])
        packs = put_once(store, record_key(eid, "packs.json"), {"packs": rewritten})
    tables = {}
    for i, name in enumerate(ERASE_ORDER):
        report(f"iceberg:{name}", 0.2 + 0.4 * i / len(ERASE_ORDER))
        spec = _table_spec(name, asset_id, plan["clip_ids"], packs["packs"])
        tables[name] = erase_rows(functools.partial(catalog.iceberg_table, name), spec, store, eid)
    # The key index holds the erased ids and fingerprint: emptied here (zeroed on
    # disk), rebuilt by the next ingest; other hosts' files rebuild at their next sync.
    catalog.purge_key_index()
    expired = {name: t["snapshots_expired"] for name, t in tables.items()}
    expired.update(_expiring_embedding_versions(catalog, asset_id, eid))
    report("versions", 0.6)
    version_summary = dict(versions(plan, packs["packs"], expired, report)) if versions else {}
    report("vectors", 0.8)
    vectors = _erase_vectors(catalog, asset_id, eid)
    report("objects", 0.9)
    objects = _delete_objects(catalog, plan, packs["packs"], eid)
    result = {
        **request,
        "completed_at": _now(),
        "clips": len(plan["clip_ids"]),
        "tables": tables,
        "packs_rewritten": {old: p["sha256"] for old, p in packs["packs"].items()},
        "objects": objects,
        "vectors_deleted": vectors,
        "versions": version_summary,
        "not_erased": {
            "adopted_objects": plan["objects"]["adopted"],
            "shared_text_embeddings": plan["text_embeddings"]["shared"],
            "kept_records": ["tombstones", "asset_events"],
        },
    }
    final = put_once(store, record_key(eid, "result.json"), result)
    report("done", 1.0)
    return final


def get_erasure(catalog: VidlakeCatalog, eid: str) -> dict[str, Any]:
    """An erasure's state: its audit record when done, else its request and progress.

    Raises:
        NotFound: no erasure ``eid``.
    """
    store = catalog.objects
    result = get_record(store, record_key(eid, "result.json"))
    if result is not None:
        return {"state": "done", **result}
    request = get_record(store, record_key(eid, "request.json"))
    if request is None:
        raise NotFound(f"no erasure {eid!r}", erasure_id=eid)
    return {"state": "incomplete", **request}


def list_erasures(catalog: VidlakeCatalog) -> list[dict[str, Any]]:
    """Every erasure, as :func:`get_erasure` reports it."""
    return [get_erasure(catalog, eid) for eid in list_erasure_ids(catalog.objects)]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _table_spec(
    name: str, asset_id: str, clip_ids: list[str], packs: Mapping[str, Any]
) -> TableErasure:
    ids = pa.array(clip_ids, pa.string())

    def by_clip(rows: pa.Table) -> pa.Array:
        return pc.fill_null(pc.is_in(rows["clip_id"], ids), False)

    def by_asset(rows: pa.Table) -> pa.Array:
        return pc.fill_null(pc.equal(rows["asset_id"], asset_id), False)

    if name == "assets":
        return TableErasure(name, eq("asset_id", asset_id), ["asset_id"], by_asset)
    if name == "clips":
        expr = (
            Or(eq("asset_id", asset_id), isin("clip_id", clip_ids))
            if clip_ids
            else eq("asset_id", asset_id)
        )

        def clip_or_asset(rows: pa.Table) -> pa.Array:
            return pc.or_(by_clip(rows), by_asset(rows))

        return TableErasure(name, expr, ["clip_id", "asset_id"], clip_or_asset)
    if name != "latents" or not packs:
        return TableErasure(name, isin("clip_id", clip_ids or [""]), ["clip_id"], by_clip)
    olds = pa.array(sorted(packs), pa.string())

    def touched(rows: pa.Table) -> pa.Array:
        return pc.or_(by_clip(rows), pc.fill_null(pc.is_in(rows["object_sha256"], olds), False))

    return TableErasure(
        name,
        Or(isin("clip_id", clip_ids or [""]), isin("object_sha256", sorted(packs))),
        ["clip_id", "object_sha256"],
        by_clip,
        touched=touched,
        fix=lambda rows: repoint(rows, packs),
    )


def repoint(rows: pa.Table, packs: Mapping[str, Any]) -> pa.Table:
    """Latent rows with members of rewritten packs pointed at the new objects."""
    moved = {
        (old, o): (p["sha256"], p["size"], new)
        for old, p in packs.items()
        for o, _n, new in p["moves"]
    }
    shas = rows["object_sha256"].to_pylist()
    offsets = rows["offset"].to_pylist()
    sizes = rows["object_size"].to_pylist()
    for i, (sha, off) in enumerate(zip(shas, offsets, strict=True)):
        hit = moved.get((sha, off))
        if hit is not None:
            shas[i], sizes[i], offsets[i] = hit
    out = rows
    for name, values in (("object_sha256", shas), ("offset", offsets), ("object_size", sizes)):
        col = out.schema.get_field_index(name)
        out = out.set_column(
            col, out.schema.field(col), pa.array(values, out.schema.field(col).type)
        )
    return out


def _vector_tables(catalog: VidlakeCatalog, asset_id: str, eid: str) -> dict[str, int]:
    """The LanceDB tables that hold the asset's vectors (rows per table), recorded
    create-only before anything is deleted, so that every rerun sees the same set."""
    from catalog.erase.vectors import asset_vector_counts

    key = record_key(eid, "vectors.json")
    found = get_record(catalog.objects, key)
    if found is None:
        counts = asset_vector_counts(catalog.config.lance, asset_id)
        found = put_once(catalog.objects, key, {"tables": counts})
    return {str(k): int(v) for k, v in found["tables"].items()}


def _expiring_embedding_versions(
    catalog: VidlakeCatalog, asset_id: str, eid: str
) -> dict[str, list[int]]:
    """Pin keys (``embeddings/<model>``) of the models whose table holds the asset,
    each with every version the vector step removes (all but the one it writes).
    Recorded create-only before the vector step, so that a rerun after it does not
    count the rewritten version (or one a later cut pinned) as expired."""
    from catalog.embeddings import EmbeddingIndex, list_models, table_name_for
    from catalog.pins import embedding_key

    key = record_key(eid, "embedding_versions.json")
    found = get_record(catalog.objects, key)
    if found is None:
        tables = _vector_tables(catalog, asset_id, eid)
        expiring = {}
        for model in list_models(catalog.config.lance):
            if model in tables or table_name_for(model) in tables:
                latest = EmbeddingIndex(catalog.config.lance, model).version or 0
                expiring[embedding_key(model)] = list(range(latest + 1))
        found = put_once(catalog.objects, key, {"expiring": expiring})
    return {str(k): [int(v) for v in vs] for k, vs in found["expiring"].items()}


def _erase_vectors(catalog: VidlakeCatalog, asset_id: str, eid: str) -> dict[str, int]:
    """Delete the asset's vectors from the tables that hold them, and clean them up."""
    from catalog.erase.vectors import erase_asset_vectors

    tables = _vector_tables(catalog, asset_id, eid)
    erase_asset_vectors(catalog.config.lance, asset_id, sorted(tables))
    return tables


def _delete_objects(
    catalog: VidlakeCatalog, plan: Mapping[str, Any], packs: Mapping[str, Any], eid: str
) -> dict[str, Any]:
    """Delete what no catalog row names any more; report what was deleted and kept."""
    store = catalog.objects
    latents = [*plan["objects"]["owned"], *packs]
    embeds = list(plan["text_embeddings"]["owned"])
    still = _named(catalog, "latents", "object_sha256", latents)
    still |= _named(catalog, "captions", "text_embedding_sha256", embeds)
    reason = f"erasure {eid} of asset {plan['asset_id']}"
    deleted = []
    aborted = 0
    for sha in [*latents, *embeds]:
        if sha not in still:
            store.delete(sha, reason=reason)
            aborted += store.abort_uploads(sha)
            deleted.append(sha)
    return {
        "deleted": sorted(deleted),
        "kept_still_referenced": sorted(still),
        "uploads_aborted": aborted,
    }


def _named(catalog: VidlakeCatalog, table: str, column: str, shas: list[str]) -> set[str]:
    if not shas:
        return set()
    rows = catalog.scan(table, columns=[column], row_filter=isin(column, shas), include_eval=True)
    return {s for s in rows[column].to_pylist() if s is not None}
