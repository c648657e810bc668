"""Open mode is loopback-only however the app is started (issue 15, item 4): every
request from a non-loopback client is refused, and startup checks the sockets the
process listens on. Nothing here binds anything but loopback: non-loopback clients
are faked through the ASGI scope, non-loopback listeners through the /proc reader."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import httpx
import pytest

from catalog.errors import InvalidInput
from service import loopback
from service.app import create_app
from service.auth import hash_token
from tests.service.support import TestClient, World, assert_error, bearer, serve

REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: never routed


def _tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    path.write_text(f'{{"{hash_token("k")}": {{"name": "k", "scopes": ["read"]}}}}')
    return path


@pytest.mark.parametrize("path", ["/", "/v1/health", "/metrics", "/v1/snapshots", "/openapi.json"])
def test_open_mode_refuses_a_non_loopback_client(world: World, path: str) -> None:
    app = create_app(world.settings(), catalog=world.catalog)
    with TestClient(app, client=REMOTE) as remote:
        error = assert_error(remote.get(path), 403, "forbidden")
        assert error["details"]["client"] == REMOTE[0]
        assert "loopback" in error["message"]
    with TestClient(app, client=("::1", 40000)) as local:
        assert local.get(path).status_code == 200


def test_a_remote_write_in_open_mode_changes_nothing(world: World) -> None:
    app = create_app(world.settings(), catalog=world.catalog)
    before = world.catalog.pin()
    with TestClient(app, client=REMOTE) as remote:
        r = remote.post(
            "/v1/tombstones",
            json=[{"asset_id": world.train_assets[0], "reason": "x", "kind": "hard"}],
        )
        assert_error(r, 403, "forbidden")
    assert world.catalog.pin() == before


def test_with_tokens_remote_clients_are_served(world: World, tmp_path: Path) -> None:
    app = create_app(
        world.settings(host="0.0.0.0", tokens_file=_tokens(tmp_path)), catalog=world.catalog
    )
    with TestClient(app, client=REMOTE) as remote:
        assert_error(remote.get("/v1/snapshots"), 401, "unauthorized")
        assert remote.get("/v1/snapshots", headers=bearer("k")).status_code == 200


def test_a_real_uvicorn_on_loopback_serves_and_sees_its_socket(world: World) -> None:
    app = create_app(world.settings(), catalog=world.catalog)
    with serve(app) as url:
        port = int(url.rsplit(":", 1)[1])
        assert httpx.get(f"{url}/v1/snapshots", timeout=30).status_code == 200
        listening = loopback.listening_addresses()
        assert listening is not None and ("127.0.0.1", port) in listening
        loopback.check_listening(is_open=True)  # loopback only: fine


def test_proc_addresses_parse() -> None:
    assert loopback._address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert loopback._address("00000000:20A1") == ("0.0.0.0", 8353)
    assert loopback._address("00000000000000000000000001000000:0050") == ("::1", 80)
    assert loopback._address("00000000000000000000000000000000:0050") == ("::", 80)
    mapped = "0000000000000000FFFF00000100007F:0050"  # ::ffff:127.0.0.1
    assert loopback._address(mapped) == ("127.0.0.1", 80)


def test_listening_addresses_sees_only_this_process(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert ("127.0.0.1", port) not in (loopback.listening_addresses() or [])
        sock.listen()
        assert ("127.0.0.1", port) in (loopback.listening_addresses() or [])


def test_startup_refuses_an_open_api_already_listening_off_loopback(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loopback, "listening_addresses", lambda: [("0.0.0.0", 8321)])
    with pytest.raises(InvalidInput) as info:
        loopback.check_listening(is_open=True)
    assert info.value.details["host"] == "0.0.0.0" and "tokens" in info.value.message
    loopback.check_listening(is_open=False)  # tokens configured: any bind is fine
    app = create_app(world.settings(), catalog=world.catalog)
    with pytest.raises(InvalidInput), TestClient(app):
        pass  # the lifespan refuses to start
    app = create_app(world.settings(tokens_file=_tokens(tmp_path)), catalog=world.catalog)
    with TestClient(app) as c:
        assert_error(c.get("/v1/snapshots"), 401)


def test_a_late_non_loopback_bind_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = iter([[("127.0.0.1", 1)], [("0.0.0.0", 8321)]])
    monkeypatch.setattr(loopback, "listening_addresses", lambda: next(calls, []))
    monkeypatch.setattr(loopback, "_WATCH_S", (0.0, 0.01, 0.02))
    with caplog.at_level(logging.ERROR, logger="vidlake.service"):
        asyncio.run(loopback.watch_listening(lambda: True))
    assert any("0.0.0.0:8321" in r.getMessage() for r in caplog.records)
