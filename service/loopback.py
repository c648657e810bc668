"""Open mode is loopback-only, however the app is started.

An open service (no tokens configured: every caller has every scope, ``eval``
included) must never answer another machine. ``vidlake serve`` checks its ``host``
setting, but ``uvicorn service.app:app --host 0.0.0.0`` binds whatever it is told,
so the app enforces it itself, in two places:

* **Every request** (:class:`OpenModeGuard`): in open mode a request whose client
  address (the ASGI ``client``, i.e. the socket's peer, or the forwarded client
  behind a trusted proxy) is not loopback gets a 403 and reaches no route.
* **The bound sockets** (:func:`listening_addresses`, Linux): the app's startup
  reads the process's listening TCP sockets from ``/proc``. Sockets already bound
  when the lifespan starts (uvicorn ``--workers``, gunicorn, pre-bound sockets) on a
  non-loopback address make startup fail; a plain ``uvicorn`` binds just after the
  lifespan, so a watcher looks again for a few seconds and logs an error naming the
  address (the per-request check keeps refusing other machines).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Callable
from pathlib import Path

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from catalog.errors import Forbidden, InvalidInput
from service.auth import is_loopback

__all__ = ["OpenModeGuard", "check_listening", "listening_addresses", "watch_listening"]

log = logging.getLogger("vidlake.service")

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_WATCH_S = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)


class OpenModeGuard:
    """403 for any request from a non-loopback client while the service is open.

    Args:
        app: The wrapped ASGI app.
        is_open: Whether the service runs open (no tokens), asked per request.
    """

    def __init__(self, app: ASGIApp, is_open: Callable[[], bool]) -> None:
        self.app = app
        self.is_open = is_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.is_open():
            client = scope.get("client")
            # No client: an in-process call or a Unix socket, local by construction.
            host = str(client[0]) if client else None
            if host is not None and not is_loopback(host):
                exc = Forbidden(
                    "this service runs open (no tokens configured) and answers loopback "
                    f"clients only; {host} is not loopback",
                    client=host,
                )
                response = JSONResponse({"error": exc.to_dict()}, status_code=403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _socket_inodes() -> set[str]:
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    host = ipaddress.ip_address(words)
    if isinstance(host, ipaddress.IPv6Address) and host.ipv4_mapped is not None:
        host = host.ipv4_mapped
    return str(host), int(port_hex, 16)


def listening_addresses() -> list[tuple[str, int]] | None:
    """(host, port) of every TCP socket this process listens on, or None where
    ``/proc`` cannot tell (not Linux)."""
    try:
        inodes = _socket_inodes()
        found = []
        for table in ("tcp", "tcp6"):
            path = Path("/proc/self/net") / table
            if not path.exists():
                continue
            for line in path.read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == _LISTEN and cols[9] in inodes:
                    found.append(_address(cols[1]))
        return sorted(set(found))
    except (OSError, ValueError):
        return None


def _exposed(addresses: list[tuple[str, int]] | None) -> list[tuple[str, int]]:
    return [(h, p) for h, p in addresses or [] if not is_loopback(h)]


def check_listening(is_open: bool) -> None:
    """Refuse to start an open service already listening off loopback.

    Raises:
        InvalidInput: open mode and a listening socket on a non-loopback address.
    """
    exposed = _exposed(listening_addresses()) if is_open else []
    if exposed:
        host, port = exposed[0]
        raise InvalidInput(
            f"refusing to serve an open API (no tokens) on {host}:{port}: configure "
            "tokens_file (VIDLAKE_TOKENS_FILE) or bind a loopback address",
            field="host",
            host=host,
            port=port,
        )


async def watch_listening(is_open: Callable[[], bool]) -> None:
    """After startup, log an error if an open service turns out to listen off
    loopback (the server binds after the lifespan starts)."""
    waited = 0.0
    for at in _WATCH_S:
        await asyncio.sleep(at - waited)
        waited = at
        exposed = _exposed(listening_addresses())
        if exposed and is_open():
            host, port = exposed[0]
            log.error(
                "open API (no tokens) listening on %s:%d: requests from non-loopback "
                "clients are refused with 403; configure tokens_file or bind a "
                "loopback address",
                host,
                port,
            )
            return
