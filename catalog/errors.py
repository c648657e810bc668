"""vidlake's exception tree.

Every error vidlake raises on purpose derives from :class:`VidlakeError`; context rides
in ``details`` (and as attributes), never only in the message. ``code``, ``message`` and
``details`` are reserved: a detail of that name (or of any other attribute of the class,
such as ``http_status``) stays in ``details`` only, so ``StorageError("…",
code="AccessDenied")`` still answers ``storage_error``. The message is positional-only.
The service maps the tree to HTTP once, in one handler (``code`` is the machine-readable
name it puts in the error body)::

    VidlakeError
    ├── NotFound                404  an object, table, version, job or clip is absent
    ├── Conflict                409  a conditional write lost (a version, a key) or a
    │                                 caller's view is stale
    ├── InvalidInput            422  bad user input; nothing was changed
    │   ├── InvalidRecipe            a recipe field fails validation (``path`` names it)
    │   ├── InvalidBatch             an ingest batch has a bad row (``row``, ``field``)
    │   └── InvalidSQL          400  a read-only query is not allowed or does not parse
    ├── Forbidden               403  a token lacks the scope (eval material included)
    ├── Unauthorized            401  no or unknown token
    ├── IntegrityError          500  stored bytes disagree with their address or record
    │   └── ChecksumMismatch         SHA-256 or size of bytes differs from expected
    ├── CacheError              507  the node cache cannot honour a request
    │   └── CacheFull                budget, reserve or leases leave no room
    ├── StorageError            502  the object store or catalog backend failed
    └── NotInstalled            500  an optional dependency is missing (says what to install)

This module imports nothing beyond the standard library, so that the loader can use it
on a GPU node without the service's dependencies.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CacheError",
    "CacheFull",
    "ChecksumMismatch",
    "Conflict",
    "Forbidden",
    "IntegrityError",
    "InvalidBatch",
    "InvalidInput",
    "InvalidRecipe",
    "InvalidSQL",
    "NotFound",
    "NotInstalled",
    "StorageError",
    "Unauthorized",
    "VidlakeError",
]


#: Names a detail never takes over as an attribute (the error body's own fields).
_RESERVED = frozenset({"code", "message", "details"})


class VidlakeError(Exception):
    """Root of every error vidlake raises on purpose."""

    code = "error"
    http_status = 500

    def __init__(self, message: str, /, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details
        for key, value in details.items():
            if key not in _RESERVED and not hasattr(type(self), key):
                setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        """The service's error body: ``{"code", "message", "details"}``."""
        return {"code": self.code, "message": self.message, "details": _jsonable(self.details)}


class NotFound(VidlakeError):
    code = "not_found"
    http_status = 404


class Conflict(VidlakeError):
    code = "conflict"
    http_status = 409


class InvalidInput(VidlakeError):
    code = "invalid_input"
    http_status = 422


class InvalidRecipe(InvalidInput):
    code = "invalid_recipe"


class InvalidBatch(InvalidInput):
    code = "invalid_batch"


class InvalidSQL(InvalidInput):
    code = "invalid_sql"
    http_status = 400


class Forbidden(VidlakeError):
    code = "forbidden"
    http_status = 403


class Unauthorized(VidlakeError):
    code = "unauthorized"
    http_status = 401


class IntegrityError(VidlakeError):
    code = "integrity_error"
    http_status = 500


class ChecksumMismatch(IntegrityError):
    code = "checksum_mismatch"


class CacheError(VidlakeError):
    code = "cache_error"
    http_status = 507


class CacheFull(CacheError):
    code = "cache_full"


class StorageError(VidlakeError):
    code = "storage_error"
    http_status = 502


class NotInstalled(VidlakeError):
    code = "not_installed"
    http_status = 500


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
