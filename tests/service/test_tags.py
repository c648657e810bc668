"""``GET /v1/tags``, ``POST /v1/tags/backfill`` and ``vidlake tags …`` (both clients)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.app import create_app
from tests.service.support import TestClient, World, assert_error, bearer, build_world, write_tokens

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("world"), snapshots=2)


def _vidlake(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"VIDLAKE_HOME": str(home), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


def test_backfill_needs_admin_and_tags_every_version(world: World, tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.json")
    with TestClient(create_app(world.settings(tokens_file=tokens), catalog=world.catalog)) as c:
        assert c.get("/v1/tags", headers=bearer("tok-read")).json()["tables"]["clips"] == {}
        assert_error(c.post("/v1/tags/backfill", headers=bearer("tok-read")), 403)
        assert world.catalog.version_tags("clips") == {}  # the refusal changed nothing
        done = c.post("/v1/tags/backfill", headers=bearer("tok-admin"))
        assert done.status_code == 200, done.text
        body = done.json()
        assert body["versions"] == 2 and body["created"]["clips"] == ["vidlake-v1", "vidlake-v2"]
        sid = world.registry.get(1).snapshot["catalog_snapshot_ids"]["clips"]
        listed = c.get("/v1/tags", headers=bearer("tok-read")).json()["tables"]
        assert listed["clips"] == {"1": sid, "2": sid}
        again = c.post("/v1/tags/backfill", headers=bearer("tok-admin")).json()
        assert again["created"] == {} and again["updated"] == {}


def test_the_cli_lists_and_backfills_in_process(world: World) -> None:
    publish = _vidlake(world.home, "tags", "backfill", "--json")
    assert publish.returncode == 0, publish.stderr
    assert json.loads(publish.stdout)["versions"] == 2
    listed = _vidlake(world.home, "tags", "list")
    assert listed.returncode == 0, listed.stderr
    assert "clips" in listed.stdout and "v1@" in listed.stdout and "v2@" in listed.stdout


def test_the_http_client_answers_as_the_local_one(tmp_path: Path) -> None:
    from catalog.errors import Forbidden
    from service.client import HttpClient
    from service.client_local import LocalClient
    from tests.service.support import serve

    world = build_world(tmp_path / "w", snapshots=1)
    tokens = write_tokens(tmp_path / "tokens.json")
    app = create_app(world.settings(tokens_file=tokens), catalog=world.catalog)
    with serve(app) as url:
        admin, reader = HttpClient(url, "tok-admin"), HttpClient(url, "tok-read")
        with pytest.raises(Forbidden):
            reader.backfill_tags()
        made = admin.backfill_tags()
        assert made["versions"] == 1 and made["created"]["clips"] == ["vidlake-v1"]
        listed = reader.tags()
        admin.close()
        reader.close()
    local = LocalClient(world.settings())
    try:
        assert local.tags() == listed
        assert local.backfill_tags()["created"] == {}
    finally:
        local.close()
