"""What a metadata GET does per request (issue 16: its p99 was 6x a static file's)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.support import TestClient, World


def test_a_step_does_not_load_the_current_catalog_state(
    client: TestClient, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's lineage reads the state its version was cut from; loading the current
    one (every table's metadata, ~20 ms) on a cache miss made the endpoint's tail."""
    services: Any = client.app.state.services  # type: ignore[attr-defined]
    calls = []
    real = world.catalog.pin
    monkeypatch.setattr(world.catalog, "pin", lambda *a, **k: calls.append(1) or real(*a, **k))
    for step in range(3):
        services.forget_pin()  # as after an ingest, or once the cached pin is a second old
        r = client.get(f"/v1/snapshots/1/steps/{step}")
        assert r.status_code == 200 and r.json()["samples"]
    assert calls == []
