"""The cleanup gate: which local files are safe to delete, and if not, why not.

A file is safe to delete only when all four conditions hold:

``validated``
    it is listed in the sealed inventory (the catalog references it: encoded and
    validated) and is still the file listed there (size, mtime, inode);
``receipt``
    a verified receipt for the same store, SHA-256 and identity covers it;
``sealed``
    the restore spec the pointer names verifies, was sealed from this inventory, and a
    restore plus a representative read of it has succeeded (a proof in the bucket);
``unreferenced``
    no unpublished or in-progress snapshot needs it: no local registry version newer
    than the sealed one, and no pending inventory, references its bytes.

Nothing is deleted here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from catalog.errors import VidlakeError
from manifests.storage.inventory import Inventory, stat_identity
from manifests.storage.receipts import Receipt
from manifests.storage.restore import has_proof, load_spec

__all__ = ["CONDITIONS", "cleanup_check"]

CONDITIONS = ("validated", "receipt", "sealed", "unreferenced")


def cleanup_check(
    paths: Iterable[str | Path],
    *,
    inventory: Inventory,
    receipts: dict[str, Receipt],
    spec_file: str | Path | None,
    newer_references: Sequence[set[str]] = (),
    endpoint_url: str | None = None,
) -> list[dict[str, Any]]:
    """One verdict per path: ``{"path", "safe", "failed": [conditions], "reasons"}``.

    Args:
        paths: Local files to judge.
        inventory: The sealed inventory.
        receipts: The receipts of its upload (:func:`read_receipts`).
        spec_file: The local ``restore_spec.json`` (None: nothing is sealed).
        newer_references: SHA-256 sets of snapshots not covered by the seal
            (unpublished, in progress, or published later).
        endpoint_url: Override of the spec's endpoint.
    """
    by_path = {e.path: e for e in inventory.entries}
    sealed_reason = _sealed(inventory, spec_file, endpoint_url)
    out = []
    for raw in paths:
        path = str(Path(raw).resolve())
        reasons: dict[str, str] = {}
        entry = by_path.get(path)
        try:
            now = stat_identity(path)
        except OSError:
            now = None
        if entry is None:
            reasons["validated"] = "not in the sealed inventory (not a validated, catalogued file)"
        elif now != entry.identity:
            reasons["validated"] = "changed since it was inventoried"
        r = receipts.get(path)
        if r is None:
            reasons["receipt"] = "no verified receipt"
        elif now != r.identity or (entry is not None and entry.sha256 not in (None, r.sha256)):
            reasons["receipt"] = "the receipt is for another version of the file"
        if sealed_reason:
            reasons["sealed"] = sealed_reason
        sha = r.sha256 if r is not None else entry.sha256 if entry is not None else None
        if sha is not None and any(sha in refs for refs in newer_references):
            reasons["unreferenced"] = "referenced by a snapshot that is not sealed"
        out.append(
            {
                "path": path,
                "safe": not reasons,
                "failed": [c for c in CONDITIONS if c in reasons],
                "reasons": reasons,
            }
        )
    return out


def _sealed(inventory: Inventory, spec_file: str | Path | None, endpoint_url: str | None) -> str:
    """Why the inventory does not count as sealed and restored ('' when it does)."""
    if spec_file is None:
        return "not sealed (no restore spec given)"
    try:
        pointer, spec, store = load_spec(spec_file, endpoint_url)
    except VidlakeError as exc:
        return f"restore spec does not verify: {exc.message}"
    if spec["snapshot"] != inventory.header.get("snapshot") or spec["total"]["count"] != len(
        inventory.entries
    ):
        return "the restore spec was sealed from another inventory"
    if not has_proof(store, pointer["sha256"]):
        return "sealed, but no restore with a representative read has succeeded yet"
    return ""
