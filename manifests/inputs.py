"""What makes two cuts the same cut: the SHA-256 of their inputs.

A snapshot is a pure function of (recipe, resolved catalog pin, code version): the
recipe's SHA-256 covers its seed and every rule; the pin's dict form names every table
state (and whatever else :class:`catalog.pins.Pin` pins, e.g. embedding versions);
the code version names the cutter. Two cuts with the same *inputs key* produce
byte-identical artifacts, so a service asked for a cut whose key matches a published
version can answer with that version instead of publishing a duplicate.

``snapshot.json`` records the key as ``inputs_sha256``. Versions published before it
was recorded get it derived from their ``recipe_sha256``, ``catalog_snapshot_ids`` and
``code_version``, which is the same function of the same facts. Patches are never
matches: they are their base plus exclusions, not a cut of the inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from catalog.errors import IntegrityError, NotFound
from catalog.hashing import sha256_bytes
from manifests.registry import SnapshotRecord, canonical_json

__all__ = ["INPUTS_KEY", "cut_inputs_sha256", "find_published", "snapshot_inputs_sha256"]

log = logging.getLogger("vidlake.manifests")

#: The ``snapshot.json`` key that records a cut's inputs key.
INPUTS_KEY = "inputs_sha256"


def cut_inputs_sha256(recipe_sha256: str, pin: Mapping[str, Any], code_version: str) -> str:
    """The inputs key: SHA-256 of the canonical JSON of the three inputs.

    Args:
        recipe_sha256: The recipe's SHA-256 (``Recipe.sha256()``).
        pin: The *resolved* pin's dict form (``Pin.to_dict()``: snapshot ids, never
            ``latest``).
        code_version: The cutter's code version.
    """
    doc = {"code_version": code_version, "pin": dict(pin), "recipe_sha256": recipe_sha256}
    return sha256_bytes(canonical_json(doc))


def snapshot_inputs_sha256(snapshot: Mapping[str, Any]) -> str | None:
    """A published ``snapshot.json``'s inputs key (recorded, else derived); None for a
    patch or a document that lacks the facts."""
    if snapshot.get("patch_of") is not None or snapshot.get("patch") is not None:
        return None
    recorded = snapshot.get(INPUTS_KEY)
    if isinstance(recorded, str):
        return recorded
    recipe, pin, code = (
        snapshot.get(k) for k in ("recipe_sha256", "catalog_snapshot_ids", "code_version")
    )
    if not isinstance(recipe, str) or not isinstance(pin, Mapping) or not isinstance(code, str):
        return None
    return cut_inputs_sha256(recipe, pin, code)


def find_published(
    versions: Iterable[int], record: Callable[[int], SnapshotRecord], key: str
) -> SnapshotRecord | None:
    """The newest published version whose inputs key is ``key``, or None.

    A version that cannot be read (gone, or failing its checks) is skipped with a
    warning: it cannot answer for the inputs, and it must not block new cuts.

    Args:
        versions: Published version numbers (any order).
        record: Reads a version's verified record (a caching reader, ideally).
        key: The inputs key to look for.
    """
    for version in sorted(versions, reverse=True):
        try:
            found = record(version)
        except (NotFound, IntegrityError) as exc:
            log.warning("version %d skipped in the inputs lookup: %s", version, exc)
            continue
        if snapshot_inputs_sha256(found.snapshot) == key:
            return found
    return None
