"""Pins: an append-only log of create-only events that keeps versions from the GC.

Each pin or unpin of version ``N`` is one create-only key
``pins/v{N:06d}/e{seq:06d}.json`` (:class:`manifests.registry.PinEvent`); the event
with the highest sequence number decides whether ``N`` is pinned. Sequence numbers,
claimed by create-only writes, give the log one total order that no clock skew
between hosts can reorder. :class:`manifests.registry.Registry` exposes these as
``pin``, ``unpin``, ``pins`` and ``pin_history``.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from catalog.errors import Conflict, IntegrityError, InvalidInput
from catalog.objects import ObjectStore
from manifests.registry import Pin, PinEvent, canonical_json

if TYPE_CHECKING:
    from manifests.registry import Registry

__all__ = ["pin_history", "pin_version", "pinned_versions", "unpin_version"]

log = logging.getLogger("vidlake.manifests.pins")

_PINS_PREFIX = "pins/"
_PIN_KEY = re.compile(r"^pins/v(\d{6,})/e(\d{6,})\.json$")
_PIN_RETRIES = 32


def pin_version(registry: Registry, version: int, reason: str, by: str | None) -> Pin:
    """Pin ``version`` so a garbage collector keeps every object it references."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("a pin needs a non-empty reason", field="reason")
    registry.entry(version)  # NotFound if absent
    event = _append_pin_event(registry.store, version, "pin", reason, by)
    return Pin(version=version, reason=event.reason, by=event.by, at=event.at)


def unpin_version(registry: Registry, version: int, *, by: str | None, reason: str | None) -> bool:
    """Unpin ``version``; False (and nothing written) when it was not pinned."""
    registry.entry(version)
    current = _last_pin_event(registry.store, version)
    if current is None or current.action != "pin":
        return False
    _append_pin_event(registry.store, version, "unpin", reason, by)
    return True


def pinned_versions(store: ObjectStore) -> list[Pin]:
    """The versions pinned now, ascending."""
    last: dict[int, tuple[int, str]] = {}
    for key in store.list_keys(_PINS_PREFIX):
        match = _PIN_KEY.match(key)
        if match:
            version, seq = int(match.group(1)), int(match.group(2))
            if version not in last or seq > last[version][0]:
                last[version] = (seq, key)
    pinned = []
    for version in sorted(last):
        event = _read_pin_event(store, last[version][1])
        if event.action == "pin":
            pinned.append(Pin(version=version, reason=event.reason, by=event.by, at=event.at))
    return pinned


def pin_history(store: ObjectStore, version: int) -> list[PinEvent]:
    """Every pin and unpin of ``version``, oldest first."""
    return [_read_pin_event(store, k) for k in _pin_keys(store, version)]


def _pin_keys(store: ObjectStore, version: int) -> list[str]:
    keyed = []
    for key in store.list_keys(f"{_PINS_PREFIX}v{version:06d}/"):
        match = _PIN_KEY.match(key)
        if match and int(match.group(1)) == version:
            keyed.append((int(match.group(2)), key))
    return [key for _, key in sorted(keyed)]


def _last_pin_event(store: ObjectStore, version: int) -> PinEvent | None:
    keys = _pin_keys(store, version)
    return _read_pin_event(store, keys[-1]) if keys else None


def _read_pin_event(store: ObjectStore, key: str) -> PinEvent:
    try:
        return PinEvent.model_validate_json(store.get_key(key))
    except ValidationError as exc:
        raise IntegrityError(f"pin event {key} is malformed: {exc}", key=key) from exc


def _append_pin_event(
    store: ObjectStore,
    version: int,
    action: Literal["pin", "unpin"],
    reason: str | None,
    by: str | None,
) -> PinEvent:
    # Sequence numbers, claimed by create-only keys, give the log one total order
    # that no clock skew between hosts can reorder.
    for _ in range(_PIN_RETRIES):
        keys = _pin_keys(store, version)
        seq = int(_PIN_KEY.match(keys[-1]).group(2)) + 1 if keys else 1  # type: ignore[union-attr]
        event = PinEvent(
            version=version,
            seq=seq,
            action=action,
            reason=reason,
            by=by,
            at=datetime.now(UTC).isoformat(timespec="microseconds"),
        )
        key = f"{_PINS_PREFIX}v{version:06d}/e{seq:06d}.json"
        try:
            store.put_key(key, canonical_json(event.model_dump()))
        except Conflict:
            continue
        log.info("%s version %d by %s: %s", action, version, by, reason)
        return event
    raise Conflict(
        f"could not append a pin event to version {version}: too much contention",
        version=version,
    )
