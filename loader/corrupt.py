"""The corrupt-member policy: what a rank does when a latent member fails its SHA-256.

A row is **corrupt** when the source's own bytes of its member do not hash to the
member's SHA-256: either the member is in the shared record of failed members
(``refs/failed-members/`` in the store, :mod:`catalog.objects.refs`), or a read fails
verification and a second, direct read from the source (bypassing the node cache)
fails too. The verdict is thus a property of the stored bytes and of a record that
only grows, never of which rank, world size, worker or resume happened to read the
row: every process that is handed that row at that step decides the same way, and
the other ranks never hold it, so nothing has to reach them before their collective.
A failure the direct read does not confirm is local (a damaged cache file, a flaky
read) and is raised as before: it says nothing about the data. Through a service the
report is confirmed by the service's own read of the member (``POST
/v1/corrupt-members``); a 409 there (it verifies) is local as well.

``on_corrupt="skip"`` (the default) drops a corrupt row from its step's batch (the
batch keeps every other row; ``batch["corrupt"]`` counts the drops, the dataset's
``stats()["corrupt_skipped"]`` sums them) and never hands its bytes to a decoder.
``on_corrupt="fail"`` raises :class:`ChecksumMismatch` naming the clip and object.
Either way a newly confirmed failure is recorded (create-only) so that
``vidlake import tar-shards-verify`` quarantines its sample in the catalog and later
cuts leave it out (``docs/decisions/022-corrupt-member-policy.md``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from catalog.errors import ChecksumMismatch, Conflict, IntegrityError, InvalidInput, VidlakeError

__all__ = [
    "ON_CORRUPT",
    "Corrupt",
    "OnCorrupt",
    "check_policy",
    "confirm_and_record",
    "drop_recorded",
    "named_error",
]

log = logging.getLogger(__name__)

OnCorrupt = Literal["skip", "fail"]
ON_CORRUPT: tuple[OnCorrupt, ...] = ("skip", "fail")


@dataclass(frozen=True)
class Corrupt:
    """What a fetch thread returns for a row dropped as corrupt."""

    clip_id: str
    member_sha256: str


def check_policy(on_corrupt: str) -> OnCorrupt:
    """``on_corrupt`` if it is a known policy, else InvalidInput naming the choices."""
    for policy in ON_CORRUPT:
        if on_corrupt == policy:
            return policy
    raise InvalidInput(
        f"on_corrupt must be one of {list(ON_CORRUPT)}, got {on_corrupt!r}", field="on_corrupt"
    )


def confirm_and_record(src: Any, rec: dict[str, Any], version: int, err: VidlakeError) -> bool:
    """True when the source's own bytes of ``rec``'s member fail a direct, verified read
    (then the failure is recorded in the source's shared record, once); False when they
    verify, i.e. the failure was local to this node."""
    obj, off, n, member = rec["object_sha256"], rec["offset"], rec["length"], rec["member_sha256"]
    try:
        src.read_member(obj, off, n, member)
    except ChecksumMismatch:
        pass
    else:
        return False
    record = {
        "member_sha256": member,
        "object_sha256": obj,
        "offset": off,
        "length": n,
        "clip_id": rec["clip_id"],
        "snapshot": version,
        "error": err.message,
        "at": datetime.now(UTC).isoformat(),
    }
    try:
        created = src.record_failed_member(record)
    except Conflict:  # a service read the member and it verifies: the fault was ours
        return False
    except VidlakeError as exc:  # a read-only store: the skip still holds, say so
        log.warning("could not record corrupt member %s: %s", member, exc.message)
        created = False
    log.warning(
        "corrupt latent member %s of clip %s (object %s@%d+%d)%s",
        member,
        rec["clip_id"],
        obj,
        off,
        n,
        " recorded for quarantine" if created else "",
    )
    return True


def drop_recorded(
    rows: NDArray[np.int64],
    cols: dict[str, list[Any]],
    failed: frozenset[str],
    step: int,
    policy: OnCorrupt,
) -> tuple[NDArray[np.int64], dict[str, list[Any]], int]:
    """Rows whose member is in the shared failed-member record: dropped unread
    (``skip``) or raised (``fail``); returns (rows, cols, dropped), ``cols`` being one
    list a column, one value a row (every column is cut alike)."""
    if not failed:
        return rows, cols, 0
    bad = np.array([m in failed for m in cols["member_sha256"]], bool)
    if not bad.any():
        return rows, cols, 0
    if policy == "fail":
        i = int(np.flatnonzero(bad)[0])
        rec = {c: cols[c][i] for c in ("clip_id", "object_sha256")}
        member = cols["member_sha256"][i]
        raise ChecksumMismatch(
            f"step {step}: clip {rec['clip_id']} (object {rec['object_sha256']}): member "
            f"{member} is recorded as corrupt",
            sha256=member,
            step=step,
            **rec,
        )
    keep = np.flatnonzero(~bad).tolist()
    kept = {name: [values[i] for i in keep] for name, values in cols.items()}
    return rows[~bad], kept, int(bad.sum())


def named_error(rec: dict[str, Any], exc: VidlakeError) -> IntegrityError:
    """``exc`` as an IntegrityError (or its own subclass) naming the row's clip and object."""
    kind = type(exc) if isinstance(exc, IntegrityError) else IntegrityError
    where = f"{rec['object_sha256']}@{rec['offset']}+{rec['length']}"
    err = kind(
        f"clip {rec['clip_id']} (object {where}): {exc.message}",
        **{
            **exc.details,
            "clip_id": rec["clip_id"],
            "object_sha256": rec["object_sha256"],
            "offset": rec["offset"],
            "length": rec["length"],
        },
    )
    err.__cause__ = exc
    return err
