"""The errors a :class:`~service.client.Client` raises and the job wait both share.

An error answer ``{"error": {"code", "message", "details"}}`` (or a failed job's
recorded error) becomes the :class:`~catalog.errors.VidlakeError` subclass its code
names (:func:`error_from_body`), so that a caller catches the same class whether it
holds an :class:`~service.client.HttpClient` or a
:class:`~service.client_local.LocalClient`. Nothing here imports a server dependency.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from catalog import errors as _errors
from catalog.errors import VidlakeError

__all__ = [
    "HashMismatch",
    "Progress",
    "RemoteError",
    "Unreachable",
    "error_from_body",
    "job_ended",
    "job_result",
    "wait_for_job",
]

#: ``progress(stage, fraction)`` of a job being waited for.
Progress = Callable[[str, float], None]
#: Seconds between two polls of a job being waited for.
POLL_S = 0.25


class Unreachable(VidlakeError):
    """The server cannot be reached (refused, unresolvable, timed out)."""

    code = "unreachable"
    http_status = 503


class RemoteError(VidlakeError):
    """The server, or a job it ran, failed with an error this client does not know by
    its code (``code`` and ``http_status`` are then the server's)."""

    code = "remote_error"
    http_status = 500


class HashMismatch(_errors.InvalidInput):
    """Uploaded bytes hash to another SHA-256 than the one they were sent under
    (nothing was stored)."""

    code = "hash_mismatch"


# -- errors -----------------------------------------------------------------------------
def _known_errors() -> dict[str, type[VidlakeError]]:
    found: dict[str, type[VidlakeError]] = {}
    pending: list[type[VidlakeError]] = [VidlakeError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


_BY_STATUS: dict[int, type[VidlakeError]] = {
    400: _errors.InvalidInput,
    401: _errors.Unauthorized,
    403: _errors.Forbidden,
    404: _errors.NotFound,
    409: _errors.Conflict,
    502: _errors.StorageError,
}
_RESERVED = frozenset({"code", "message", "details", "http_status"})


def error_from_body(status: int | None, body: Any, fallback: str) -> VidlakeError:
    """The error an answer's ``{"error": {"code", "message", "details"}}`` names.

    The class is the one that has ``code`` (else one by ``status``: 4xx a client
    error, else :class:`RemoteError`); the instance keeps the server's ``code`` and
    status, so that ``to_dict()`` repeats the server's body.

    Args:
        status: The HTTP status, or None for a job's recorded error.
        body: The parsed answer (any shape; a non-conforming one gives ``fallback``).
        fallback: The message when the body carries none.
    """
    error = body.get("error", body) if isinstance(body, Mapping) else {}
    error = error if isinstance(error, Mapping) else {}
    code = str(error.get("code") or "")
    message = str(error.get("message") or fallback)
    found = error.get("details")
    details: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    cls = _known_errors().get(code)
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status, _errors.InvalidInput if 400 <= status < 500 else None)
    exc = (cls or RemoteError)(message, **{k: v for k, v in details.items() if k not in _RESERVED})
    exc.details = dict(details)
    if code:
        exc.code = code
    if status is not None:
        exc.http_status = status
    return exc


# -- jobs -------------------------------------------------------------------------------
def wait_for_job(
    get: Callable[[str], Mapping[str, Any]], job_id: str, progress: Progress | None = None
) -> Any:
    """Poll job ``job_id`` with ``get`` until it ends; its result.

    Raises:
        VidlakeError: the job failed: the subclass its recorded error names.
    """
    while not job_ended(state := get(job_id), progress):
        time.sleep(POLL_S)
    return job_result(state)


def job_ended(state: Mapping[str, Any], progress: Progress | None) -> bool:
    """Report a polled job ``state``'s stage to ``progress``; whether the job ended."""
    if state.get("stage") and progress is not None:
        progress(str(state["stage"]), float(state.get("progress") or 0.0))
    return state["state"] in ("succeeded", "failed")


def job_result(state: Mapping[str, Any]) -> Any:
    """An ended job's result.

    Raises:
        VidlakeError: the job failed: the subclass its recorded error names.
    """
    if state["state"] == "failed":
        raise error_from_body(None, state.get("error") or {}, "job failed")
    return state["result"]
