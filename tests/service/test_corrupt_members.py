"""``GET|POST /v1/corrupt-members`` (issue 18, item 5): loaders that read through the
service report corrupt members; the service records one only when its own read of the
member fails, and every rank's skip rule reads the record (``loader.corrupt``)."""

from __future__ import annotations

import hashlib

import pytest

from catalog.errors import Conflict, InvalidInput, NotFound
from catalog.objects.refs import list_failed_members
from loader.source import HttpSource
from service.app import create_app
from service.client_local import LocalClient
from tests.service.support import TestClient, World, assert_error, serve

DATA = bytes(range(256)) * 8


def _report(world: World, member: str, offset: int = 100, length: int = 200) -> dict[str, object]:
    obj = world.catalog.objects.put_bytes(DATA).info.sha256
    return {"member_sha256": member, "object_sha256": obj, "offset": offset, "length": length}


def test_a_report_is_recorded_only_when_the_service_read_fails(
    client: TestClient, world: World
) -> None:
    assert client.get("/v1/corrupt-members").json() == {"members": []}
    good = hashlib.sha256(DATA[100:300]).hexdigest()
    # The member verifies here: the reader's fault, nothing is recorded.
    assert_error(client.post("/v1/corrupt-members", json=_report(world, good)), 409)
    assert list_failed_members(world.catalog.objects) == []
    bad = "ab" * 32  # the stored bytes of that range do not hash to it
    first = client.post("/v1/corrupt-members", json=_report(world, bad))
    assert first.status_code == 200 and first.json() == {"member_sha256": bad, "recorded": True}
    again = client.post("/v1/corrupt-members", json=_report(world, bad))
    assert again.json()["recorded"] is False
    assert client.get("/v1/corrupt-members").json() == {"members": [bad]}
    # Bad input: a clear 4xx, nothing recorded.
    assert_error(client.post("/v1/corrupt-members", json=_report(world, "cd" * 32, 0, 10**6)), 422)
    missing = {**_report(world, "cd" * 32), "object_sha256": "ef" * 32}
    assert_error(client.post("/v1/corrupt-members", json=missing), 404)
    assert_error(client.post("/v1/corrupt-members", json={"member_sha256": "x"}), 422)
    assert list_failed_members(world.catalog.objects) == [bad]


def test_the_loader_and_the_clients_speak_it(world: World) -> None:
    bad = "12" * 32
    with serve(create_app(world.settings(), catalog=world.catalog)) as url:
        src = HttpSource(url)
        assert src.record_failed_member(_report(world, bad)) is True
        assert bad in src.failed_members()
        good = hashlib.sha256(DATA[100:300]).hexdigest()
        with pytest.raises(Conflict):
            src.record_failed_member(_report(world, good))
    local = LocalClient(world.settings())
    try:
        assert bad in local.corrupt_members()["members"]
        with pytest.raises(Conflict):
            local.report_corrupt_member(_report(world, good))
        with pytest.raises(InvalidInput):
            local.report_corrupt_member({"member_sha256": bad})
        with pytest.raises(NotFound):
            local.report_corrupt_member({**_report(world, bad), "object_sha256": "ef" * 32})
    finally:
        local.close()
