"""One error shape for every failure the service returns.

Every error body is ``{"error": {"code", "message", "details"}}``. The mapping is done
once, here: :class:`~catalog.errors.VidlakeError` subclasses carry their own
``http_status`` and ``to_dict()``; FastAPI's request validation errors become 422
``invalid_input``; Starlette's routing errors (404, 405) keep their status with a
code named after it (a 405 names every method the path allows in ``Allow``, and an
``OPTIONS`` request is a 204 with that ``Allow``); anything else is a 500
``internal_error`` (a bug) whose message does not leak internals.

Three HTTP-only errors live here, inside the one tree (all are bad input, so they
derive from :class:`~catalog.errors.InvalidInput`):

* :class:`PayloadTooLarge` (413): a request body over ``max_body_bytes``.
* :class:`RangeNotSatisfiable` (416): a ``Range`` outside an artifact or object.
* :class:`UnsupportedMediaType` (415): a body that is neither JSON nor Arrow.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from catalog.errors import InvalidInput, VidlakeError

__all__ = [
    "PayloadTooLarge",
    "RangeNotSatisfiable",
    "UnsupportedMediaType",
    "allowed_methods",
    "error_body",
    "error_response",
    "install_error_handlers",
]

log = logging.getLogger("vidlake.service")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
    422: "invalid_input",
}


class PayloadTooLarge(InvalidInput):
    """The request body is larger than the service accepts (``limit`` bytes)."""

    code = "payload_too_large"
    http_status = 413


class RangeNotSatisfiable(InvalidInput):
    """A ``Range`` header names no byte of the resource (``size`` bytes long)."""

    code = "range_not_satisfiable"
    http_status = 416


class UnsupportedMediaType(InvalidInput):
    """A request body in a format the endpoint does not read."""

    code = "unsupported_media_type"
    http_status = 415


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of an error response."""
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(exc: VidlakeError) -> JSONResponse:
    """The HTTP response for one of vidlake's errors (status from ``exc.http_status``)."""
    headers: dict[str, str] = {}
    if exc.http_status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="vidlake"'
    if isinstance(exc, RangeNotSatisfiable):
        headers["Content-Range"] = f"bytes */{exc.details.get('size', '*')}"
    return JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status, headers=headers)


async def _vidlake_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, VidlakeError)
    if exc.http_status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
    return error_response(exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = [
        {
            "loc": [str(part) for part in err.get("loc", ())],
            "message": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors()
    ]
    first = problems[0] if problems else {"loc": [], "message": "invalid request"}
    where = ".".join(first["loc"]) or "request"
    body = error_body("invalid_input", f"{where}: {first['message']}", {"errors": problems})
    return JSONResponse(body, status_code=422)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (``OPTIONS`` included)."""
    # Each method is probed against the routes (included routers answer for theirs).
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes
        )
    ]
    return [*allowed, "OPTIONS"]


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 405:
        allow = ", ".join(allowed_methods(request))
        if request.method == "OPTIONS":  # what the path supports, not an error
            return Response(status_code=204, headers={"Allow": allow})
        message = f"{request.method} is not allowed on {request.url.path}; allowed: {allow}"
        return JSONResponse(
            error_body("method_not_allowed", message, {"allow": allow.split(", ")}),
            status_code=405,
            headers={"Allow": allow},
        )
    message = str(exc.detail) if exc.detail else ""
    if status == 400 and message == "There was an error parsing the body":
        # FastAPI's word for a body that is not UTF-8 JSON; every other JSON problem
        # is a 422, so this one is too.
        status, message = 422, "the request body is not valid UTF-8 JSON"
    code = _STATUS_CODES.get(status, "error" if status >= 500 else "bad_request")
    message = message or code.replace("_", " ")
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    return JSONResponse(error_body(code, message), status_code=status, headers=exc.headers or None)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # A 5xx is a bug: log everything, tell the client nothing about internals.
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        error_body("internal_error", "internal server error (logged)"), status_code=500
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map every error the app can raise to the one error shape."""
    app.add_exception_handler(VidlakeError, _vidlake_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
