"""Registered versions carry ``vidlake-v{N}`` tags: a cut, a patch, a pin, an unpin,
and the backfill that repairs versions published without them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from catalog.tags import TAG_PREFIX
from manifests.tags import DEFAULT_RETENTION_MS, sync_version_tags, wanted_tags
from service.app import create_app
from tests.service.support import TestClient, World, build_world, world_recipe


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("world"), snapshots=2)


@pytest.fixture(scope="module")
def client(world: World) -> Iterator[TestClient]:
    with TestClient(create_app(world.settings(), catalog=world.catalog)) as c:
        yield c


def _refs(world: World, table: str) -> dict[str, tuple[int, int | None]]:
    refs = world.catalog.iceberg_table(table).metadata.refs
    return {
        n: (r.snapshot_id, r.max_ref_age_ms) for n, r in refs.items() if n.startswith(TAG_PREFIX)
    }


def _pinned_ids(world: World, version: int) -> dict[str, int]:
    ids = world.registry.get(version).snapshot["catalog_snapshot_ids"]
    return {t: s for t, s in ids.items() if s is not None and not t.startswith("embeddings/")}


def test_the_backfill_tags_versions_published_without_tags(world: World) -> None:
    assert _refs(world, "clips") == {}  # published straight into the registry
    report = sync_version_tags(world.catalog, world.registry)
    tables = _pinned_ids(world, 1)
    assert set(report.created) == set(tables) and report.missing == {}
    for table, sid in tables.items():
        tags = _refs(world, table)
        assert tags["vidlake-v1"][0] == sid and tags["vidlake-v2"][0] == sid
        assert tags["vidlake-v1"][1] is not None  # unpinned: ages
    created = datetime.fromisoformat(world.registry.entry(1).created_at).timestamp() * 1000
    snap = world.catalog.iceberg_table("clips").metadata.snapshot_by_id(tables["clips"])
    assert snap is not None
    age = _refs(world, "clips")["vidlake-v1"][1]
    assert age == int(created) + DEFAULT_RETENTION_MS - snap.timestamp_ms
    again = sync_version_tags(world.catalog, world.registry)  # idempotent
    assert again.created == {} and again.updated == {}


def test_pinning_makes_tags_permanent_and_unpinning_ages_them(
    world: World, client: TestClient
) -> None:
    assert client.post("/v1/snapshots/1/pin", json={"reason": "prod"}).status_code == 200
    assert _refs(world, "clips")["vidlake-v1"][1] is None
    assert [w.keep_until_ms for w in wanted_tags(world.registry, [1])] == [None]
    assert client.delete("/v1/snapshots/1/pin").status_code == 200
    age = _refs(world, "clips")["vidlake-v1"][1]
    unpinned = world.registry.pin_history(1)[-1].at
    keep_until = int(datetime.fromisoformat(unpinned).timestamp() * 1000) + DEFAULT_RETENTION_MS
    snap_ts = world.catalog.iceberg_table("clips").metadata.snapshot_by_id(
        _pinned_ids(world, 1)["clips"]
    )
    assert snap_ts is not None and age == keep_until - snap_ts.timestamp_ms


def test_a_cut_and_a_patch_tag_their_versions(world: World, client: TestClient) -> None:
    from materializer.cut import cut_snapshot
    from materializer.recipe import load_recipe

    world.catalog.add_captions(
        [
            {"clip_id": c, "caption_version": "1", "kind": "dense", "text": "new"}
            for c in world.clips
        ]
    )
    record = cut_snapshot(world.catalog, world.registry, load_recipe(world_recipe("t", seed=3)))
    tables = _pinned_ids(world, record.version)
    assert tables["captions"] != _pinned_ids(world, 1)["captions"]
    for table, sid in tables.items():
        assert _refs(world, table)[f"vidlake-v{record.version}"][0] == sid
    clip = world.train_clips[0]
    patched = client.post(
        f"/v1/snapshots/{record.version}/patch",
        json={"reason": "takedown", "exclude_clip_ids": [clip]},
    )
    assert patched.status_code == 201, patched.text
    version = patched.json()["version"]
    assert _refs(world, "captions")[f"vidlake-v{version}"][0] == tables["captions"]


def test_a_tagging_failure_never_fails_the_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from catalog.catalog import VidlakeCatalog
    from catalog.errors import StorageError
    from materializer.cut import cut_snapshot
    from materializer.recipe import load_recipe

    world = build_world(tmp_path / "w", snapshots=0)

    def broken(self: VidlakeCatalog, *args: object, **kwargs: object) -> None:
        raise StorageError("catalog unreachable")

    monkeypatch.setattr(VidlakeCatalog, "tag_versions", broken)
    record = cut_snapshot(world.catalog, world.registry, load_recipe(world_recipe("t", seed=1)))
    assert world.registry.versions() == [record.version]
    assert "the backfill repairs it" in caplog.text
    monkeypatch.undo()
    sync_version_tags(world.catalog, world.registry)  # the crash window, repaired
    assert f"vidlake-v{record.version}" in _refs(world, "clips")


def test_a_version_pinning_a_table_the_catalog_lacks_still_gets_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.service.support import write_fake_cut

    world = build_world(tmp_path / "w", snapshots=0)
    paths, snapshot = write_fake_cut(world, tmp_path / "cut", seed=0)
    snapshot["catalog_snapshot_ids"]["retired_table"] = 1
    record = world.registry.publish(paths, snapshot, parent=world.registry.next_parent())
    report = sync_version_tags(world.catalog, world.registry)
    assert report.created["clips"] == [f"vidlake-v{record.version}"]
    assert "retired_table" in caplog.text
