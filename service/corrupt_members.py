"""Corrupt latent members reported by loaders that read through the service.

A training rank that reads a snapshot from a service (``http://…``) cannot write the
store's shared record of failed members (``refs/failed-members/``,
:mod:`catalog.objects.refs`), so it reports a member here. The service never takes the
report on trust: it reads the member's range itself (a stored object or a TAR shard
adopted by reference) and records it only when those bytes fail their SHA-256; a
member that verifies is a :class:`~catalog.errors.Conflict` (the fault was the
reader's: its cache or its network). ``GET`` lists the record, which is what every
rank's skip rule reads (:mod:`loader.corrupt`). An eval-only object is as absent here
as on ``GET /v1/objects`` to a caller without the ``eval`` scope.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from catalog.errors import Conflict, InvalidInput, NotFound
from catalog.hashing import sha256_bytes
from catalog.objects.refs import RefStore, list_failed_members, record_member_failure
from service.auth import Principal
from service.deps import Services

__all__ = ["MAX_MEMBER_BYTES", "CorruptMemberReport", "list_members", "report_member"]

#: The largest member the service re-reads to confirm a report.
MAX_MEMBER_BYTES = 1 << 30
_SHA = r"^[0-9a-f]{64}$"


class CorruptMemberReport(BaseModel):
    """A member whose bytes failed their SHA-256 when a loader read them."""

    member_sha256: str = Field(pattern=_SHA)
    object_sha256: str = Field(pattern=_SHA)
    offset: int = Field(ge=0)
    length: int = Field(ge=1, le=MAX_MEMBER_BYTES)
    clip_id: str | None = Field(None, max_length=256)
    snapshot: int | None = Field(None, ge=1)
    error: str | None = Field(None, max_length=2000)


def list_members(services: Services) -> dict[str, Any]:
    """``{"members": [sha256, …]}``: every member recorded as corrupt (sorted)."""
    return {"members": list_failed_members(services.catalog.objects)}


def report_member(
    services: Services, principal: Principal, report: CorruptMemberReport
) -> dict[str, Any]:
    """Confirm ``report`` by reading the member here; record it when it fails.

    Returns:
        ``{"member_sha256", "recorded": True if this call created the record}``.

    Raises:
        NotFound: no such object (or one hidden from this caller).
        InvalidInput: the range passes the end of the object.
        Conflict: the member's bytes verify here; nothing is recorded.
    """
    obj = report.object_sha256
    missing = NotFound(f"no object {obj}", sha256=obj)
    if not principal.sees_eval and services.eval_objects.hidden(obj, services.pin()):
        raise missing
    store = RefStore(services.catalog.objects)
    info = store.head(obj)
    if info is None:
        raise missing
    if report.offset + report.length > info.size:
        raise InvalidInput(
            f"range [{report.offset}, +{report.length}) passes the end of {obj} "
            f"({info.size} bytes)",
            sha256=obj,
        )
    actual = sha256_bytes(store.get_range(obj, report.offset, report.length))
    if actual == report.member_sha256:
        raise Conflict(
            f"member {report.member_sha256} of {obj} verifies at the service: the corruption "
            "is the reader's (its cache or its network), not the stored bytes",
            sha256=report.member_sha256,
        )
    record = {
        **report.model_dump(),
        "actual_sha256": actual,
        "reported_by": principal.name,
        "at": datetime.now(UTC).isoformat(),
    }
    created = record_member_failure(services.catalog.objects, record)
    return {"member_sha256": report.member_sha256, "recorded": created}
