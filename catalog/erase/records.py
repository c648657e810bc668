"""The durable records that drive an erasure (named, create-only keys in the object store).

An erasure is a sequence of idempotent steps; what a step must not forget lives in a
create-only key under ``erasures/<erasure_id>/``, written before the step acts on it::

    erasures/<id>/request.json            who asked, when, for which asset (first write)
    erasures/<id>/plan.json               clip ids, objects by fate (owned, pack, adopted)
    erasures/<id>/packs.json              each rewritten pack: new object, moved members
    erasures/<id>/iceberg/<table>/aNNNN.json   one per rewrite attempt: the files, manifests,
                                          manifest lists and snapshots it replaces
    erasures/<id>/result.json             the audit record; its presence means "done"

:func:`put_once` is the only write: the first writer wins and every rerun reads what
it wrote, so a rerun after a crash acts on the same plan. Nothing here is ever
deleted; none of it holds erased payload (ids, SHA-256s, offsets and counts only).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pyiceberg.expressions import BooleanExpression, EqualTo, In

from catalog.errors import Conflict, IntegrityError, NotFound
from catalog.objects.base import ObjectStore

__all__ = [
    "ERASURES_PREFIX",
    "attempt_keys",
    "eq",
    "erasure_id",
    "get_record",
    "isin",
    "list_erasure_ids",
    "put_once",
    "record_key",
]

ERASURES_PREFIX = "erasures/"
# pyiceberg's predicate classes confuse mypy's signature checks; call them untyped.
_EQ: Any = EqualTo
_IN: Any = In


def erasure_id(asset_id: str) -> str:
    """The erasure of ``asset_id``: one id per asset, so every rerun resumes the same job."""
    return "er_" + hashlib.sha256(f"vidlake-erasure:{asset_id}".encode()).hexdigest()[:24]


def record_key(eid: str, name: str) -> str:
    return f"{ERASURES_PREFIX}{eid}/{name}"


def _dumps(value: Any) -> bytes:
    return (json.dumps(value, sort_keys=True, indent=2, allow_nan=False) + "\n").encode()


def get_record(store: ObjectStore, key: str) -> dict[str, Any] | None:
    """A record's JSON, or None when absent."""
    try:
        raw = store.get_key(key)
    except NotFound:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise IntegrityError(f"erasure record {key} is not JSON: {exc}", key=key) from exc
    if not isinstance(value, dict):
        raise IntegrityError(f"erasure record {key} is not an object", key=key)
    return value


def put_once(store: ObjectStore, key: str, value: dict[str, Any]) -> dict[str, Any]:
    """Create ``key`` with ``value`` unless it exists; return what the key holds."""
    try:
        store.put_key(key, _dumps(value))
    except Conflict:
        found = get_record(store, key)
        if found is None:  # pragma: no cover - a key cannot vanish
            raise
        return found
    return value


def attempt_keys(store: ObjectStore, eid: str, table: str) -> list[str]:
    """The rewrite attempts recorded for ``table``, oldest first."""
    return store.list_keys(record_key(eid, f"iceberg/{table}/"))


def expired_by(store: ObjectStore, table: str, snapshot_id: int) -> str | None:
    """The erasure that expired Iceberg snapshot ``snapshot_id`` of ``table``, if any."""
    for eid in list_erasure_ids(store):
        for key in attempt_keys(store, eid, table):
            if snapshot_id in (get_record(store, key) or {}).get("snapshots", []):
                return eid
    return None


def list_erasure_ids(store: ObjectStore) -> list[str]:
    """Every erasure that has a request record, sorted."""
    ids = {
        key[len(ERASURES_PREFIX) :].split("/", 1)[0]
        for key in store.list_keys(ERASURES_PREFIX)
        if key.endswith("/request.json")
    }
    return sorted(ids)


def eq(column: str, value: str) -> BooleanExpression:
    """``column = value`` as a pyiceberg filter."""
    expr: BooleanExpression = _EQ(column, value)
    return expr


def isin(column: str, values: list[str]) -> BooleanExpression:
    """``column IN values`` as a pyiceberg filter (never empty: no value matches "")."""
    expr: BooleanExpression = _IN(column, values or [""])
    return expr
