"""Sealing: prove an inventory is entirely in the bucket, then record how to restore it.

:func:`seal` refuses unless every inventory entry has a verified receipt for the same
store, SHA-256 (where the inventory knows it), size and identity, and every object
in the bucket still verifies *by content* (:meth:`S3ObjectStore.verify`: a full read
and hash, or the endpoint's SHA-256 only where the endpoint has proven it checks
checksums itself) with the receipted size. It then copies the registry entries to their
named keys in the bucket (create-only; an identical existing key is fine), and writes
the *restore spec* — the catalog namespace's properties, every Iceberg table's
metadata location and SHA-256, every catalog file, the registry entries, object counts
and bytes — as a create-only named key, reads it back and checks its SHA-256. The
small local ``restore_spec.json`` (bucket, prefix, key, size, SHA-256, ETag, and the
endpoint, path style and region the seal actually used — resolved from the client, so an
endpoint that came from ``AWS_ENDPOINT_URL`` is recorded too; never credentials) is all a
restore needs besides credentials.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from catalog.atomic import write_bytes
from catalog.errors import ChecksumMismatch, Conflict, InvalidInput, NotFound
from catalog.hashing import sha256_bytes
from catalog.objects.s3 import S3ObjectStore
from manifests.registry import canonical_json
from manifests.storage.inventory import Inventory
from manifests.storage.receipts import Receipt, read_receipts

__all__ = [
    "SPEC_FORMAT",
    "SPEC_PREFIX",
    "connection_record",
    "coverage_gaps",
    "seal",
    "write_json_atomic",
]

SPEC_FORMAT = 1
SPEC_PREFIX = "restore-specs/"


def coverage_gaps(
    inventory: Inventory, receipts: dict[str, Receipt], store_url: str
) -> list[dict[str, str]]:
    """Entries without a verified receipt that matches them (empty: fully covered)."""
    gaps: list[dict[str, str]] = []
    for e in inventory.entries:
        r = receipts.get(e.path)
        why = None
        if r is None:
            why = "no receipt"
        elif r.store != store_url:
            why = f"receipt is for {r.store}"
        elif e.sha256 is not None and r.sha256 != e.sha256:
            why = "receipt SHA-256 differs"
        elif r.size != e.size or r.identity != e.identity:
            why = "receipt is for another version of the file"
        if why:
            gaps.append({"path": e.path, "kind": e.kind, "reason": why})
    return gaps


def seal(
    inventory: Inventory,
    receipts_path: str | Path,
    store: S3ObjectStore,
    out_dir: str | Path,
) -> dict[str, Any]:
    """Seal ``inventory`` in ``store``; return the local pointer (also written to
    ``out_dir/restore_spec.json``).

    Raises:
        InvalidInput: coverage is incomplete (``exc.gaps``); nothing was written.
        NotFound: a receipted object is gone from the bucket (``exc.problems``).
        ChecksumMismatch: a receipted object's stored bytes are not its content
            (``exc.problems``: ``sha256``, ``path``, ``reason``); nothing was written.
        Conflict: a registry key in the bucket holds other bytes.
        ChecksumMismatch: the spec read back is not what was written.
    """
    receipts = read_receipts(receipts_path)
    gaps = coverage_gaps(inventory, receipts, store.url)
    if gaps:
        raise InvalidInput(
            f"cannot seal: {len(gaps)} of {len(inventory.entries)} inventory entries lack a "
            f"matching verified receipt (first: {gaps[0]['path']}: {gaps[0]['reason']})",
            gaps=gaps,
        )
    mine = [receipts[e.path] for e in inventory.entries]
    _verify_stored(store, mine)
    header = inventory.header
    by_path = {r.path: r for r in mine}
    files = {"warehouse": [], "lance": []}  # type: dict[str, list[dict[str, Any]]]
    registry: list[dict[str, Any]] = []
    for e in inventory.entries:
        r = by_path[e.path]
        if e.kind in files:
            files[e.kind].append({"name": e.name, "sha256": r.sha256, "size": r.size})
        elif e.kind == "registry":
            assert e.name is not None
            registry.append({"key": e.name, "sha256": r.sha256, "size": r.size})
            _put_same(store, e.name, store.get(r.sha256))
    warehouse = header["warehouse"].rstrip("/") + "/"
    by_name = {f["name"]: f for f in files["warehouse"]}
    tables = {}
    for table, location in header["tables"].items():
        rel = location.removeprefix(warehouse)
        if rel == location or rel not in by_name:
            raise InvalidInput(
                f"table {table}'s metadata {location} is not among the inventory's files",
                table=table,
            )
        tables[table] = {"metadata_location": location, **by_name[rel]}
    objects: dict[str, dict[str, int]] = {}
    for e in inventory.entries:
        c = objects.setdefault(e.kind, {"count": 0, "bytes": 0})
        c["count"] += 1
        c["bytes"] += e.size
    now = datetime.now(UTC)
    spec = {
        "vidlake_restore_spec": SPEC_FORMAT,
        "created_at": now.isoformat(),
        "store": store.url,
        "snapshot": header["snapshot"],
        "namespace": header["namespace"],
        "namespace_properties": header["namespace_properties"],
        "source_warehouse": header["warehouse"],
        "tables": tables,
        "files": files,
        "registry": registry,
        "objects": objects,
        "total": {"count": len(mine), "bytes": sum(r.size for r in mine)},
    }
    body = canonical_json(spec)
    sha = sha256_bytes(body)
    key = f"{SPEC_PREFIX}{now.strftime('%Y%m%dT%H%M%S%fZ')}-{sha[:16]}.json"
    store.put_key(key, body)
    back = store.get_key(key)
    if back != body:
        raise ChecksumMismatch(f"restore spec {key} read back differs", key=key, sha256=sha)
    pointer = {
        "bucket": store.bucket,
        "prefix": store.prefix,
        "key": key,
        "size": len(body),
        "sha256": sha,
        "etag": store.key_etag(key),
        **connection_record(store),
        "snapshot": header["snapshot"],
        "created_at": spec["created_at"],
    }
    write_json_atomic(Path(out_dir) / "restore_spec.json", pointer)
    return pointer


def connection_record(store: S3ObjectStore) -> dict[str, Any]:
    """How ``store`` reaches its bucket, as its client resolved it: ``endpoint_url``,
    ``path_style`` and ``region_name``. An unset endpoint or region is whatever boto3
    chose (``AWS_ENDPOINT_URL``, ``AWS_REGION``, the config file), so the record names the
    endpoint actually used and a restore needs no environment. No credential is read."""
    meta = store.client.meta
    style = (meta.config.s3 or {}).get("addressing_style")
    return {
        "endpoint_url": store.endpoint_url or meta.endpoint_url,
        "path_style": store.path_style if store.path_style is not None else style == "path",
        "region_name": store.region_name or meta.region_name,
    }


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON, atomically (:mod:`catalog.atomic`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode())


def _verify_stored(store: S3ObjectStore, receipts: list[Receipt]) -> None:
    """Every receipted object is in the bucket and its bytes are its content (a
    receipt says it was so once; a seal must say it is so now). An endpoint failure
    (StorageError) propagates: it proves nothing either way."""

    def check(r: Receipt) -> dict[str, str] | None:
        def problem(reason: str, detail: str) -> dict[str, str]:
            return {"sha256": r.sha256, "path": r.path, "reason": reason, "detail": detail}

        try:
            info = store.verify(r.sha256)
        except NotFound:
            return problem("missing", "not in the bucket")
        except ChecksumMismatch as exc:
            return problem("corrupt", exc.message)
        if info.size != r.size:
            return problem("size", f"has {info.size} bytes, not {r.size}")
        return None

    # Reads are network-bound; the hashing threads release the GIL.
    with ThreadPoolExecutor(max_workers=16) as pool:
        problems = [p for p in pool.map(check, receipts) if p]
    if not problems:
        return
    first = f"{problems[0]['sha256']} ({problems[0]['path']}): {problems[0]['detail']}"
    if all(p["reason"] == "missing" for p in problems):
        raise NotFound(
            f"cannot seal: {len(problems)} receipted objects are not in the bucket: {first}",
            problems=problems,
        )
    raise ChecksumMismatch(
        f"cannot seal: {len(problems)} receipted objects do not verify by content: {first}",
        problems=problems,
    )


def _put_same(store: S3ObjectStore, key: str, data: bytes) -> None:
    """Create ``key``; an existing key must hold exactly ``data``."""
    try:
        store.put_key(key, data)
    except Conflict:
        try:
            existing = store.get_key(key)
        except NotFound:  # pragma: no cover - deleted between the two calls
            store.put_key(key, data)
            return
        if existing != data:
            raise Conflict(f"{key} in {store.url} holds other bytes", key=key) from None
