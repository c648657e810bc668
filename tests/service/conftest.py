"""Fixtures of the service tests: a seeded catalog per module and clients on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.app import create_app
from tests.service.support import TestClient, World, build_world, write_tokens


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def client(world: World) -> Iterator[TestClient]:
    """An open (token-less, loopback) client over the module's world."""
    with TestClient(create_app(world.settings(), catalog=world.catalog)) as c:
        yield c


@pytest.fixture(scope="module")
def authed(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A client of an app that requires the tokens of ``support.TOKENS``."""
    tokens = write_tokens(tmp_path_factory.mktemp("auth") / "tokens.json")
    with TestClient(create_app(world.settings(tokens_file=tokens), catalog=world.catalog)) as c:
        yield c
