"""The snapshot registry on both object-store backends: publication, immutability,
the parent check, verification, pins, diffs, and publishers racing in processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import ChecksumMismatch, Conflict, InvalidInput, NotFound
from catalog.hashing import sha256_bytes, sha256_file
from catalog.objects import ObjectStore
from catalog.objects.local import LocalObjectStore
from catalog.objects.s3 import S3ObjectStore
from manifests import Registry, SnapshotRecord, canonical_json
from manifests.format import ARTIFACT_NAMES, registry_key
from tests.fixtures.s3 import s3_client
from tests.manifests._cutter import make_cut, sha

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(store: ObjectStore) -> Registry:
    return Registry(store)


def clips(lo: int, hi: int) -> list[str]:
    return [f"clip-{i:04d}" for i in range(lo, hi)]


def tamper(store: ObjectStore, sha256: str) -> None:
    """Flip one byte of a stored object behind the store's back (same size)."""
    data = bytearray(store.get(sha256))
    data[len(data) // 2] ^= 0xFF
    if isinstance(store, LocalObjectStore):
        path = store.object_path(sha256)
        path.chmod(0o644)
        path.write_bytes(bytes(data))
    else:
        assert isinstance(store, S3ObjectStore)
        client = s3_client(str(store.endpoint_url))
        client.put_object(Bucket=store.bucket, Key=store.key_of(sha256), Body=bytes(data))


def object_count(store: ObjectStore) -> int:
    return sum(1 for _ in store.iter_objects())


def test_publish_get_list_latest_round_trip(registry: Registry, tmp_path: Path) -> None:
    assert registry.versions() == []
    assert registry.next_parent() is None
    assert registry.latest() is None
    assert registry.list() == []

    paths1, meta1 = make_cut(tmp_path / "a", clips(0, 10), seed=1)
    paths2, meta2 = make_cut(tmp_path / "b", clips(5, 15), seed=2)
    one = registry.publish(paths1, meta1, parent=None)
    two = registry.publish(paths2, meta2, parent=registry.next_parent())

    assert (one.version, one.parent, two.version, two.parent) == (1, None, 2, 1)
    assert registry.versions() == [1, 2]
    assert [r.version for r in registry.list()] == [1, 2]
    latest = registry.latest()
    assert latest is not None and latest == two
    got = registry.get(1)
    assert got == one
    # snapshot.json is the caller's metadata plus what publish() sets, nothing else.
    assert {k: v for k, v in got.snapshot.items() if k in meta1} == meta1
    assert got.snapshot["version"] == 1 and got.snapshot["parent"] is None
    assert got.snapshot["patch_of"] is None
    assert got.entry.recipe_sha256 == meta1["recipe_sha256"]
    # Every artifact is recorded by SHA-256 and size and downloads verified, byte-equal.
    for name in ARTIFACT_NAMES:
        ref = got.artifacts[name]
        assert (ref.sha256, ref.size) == sha256_file(paths1[name])
        dest = registry.artifact_path(1, name, tmp_path / "dl")
        assert dest.read_bytes() == paths1[name].read_bytes()
        assert registry.open_artifact(1, name).read() == paths1[name].read_bytes()
    # snapshot.json is canonical JSON and hashes to the entry's SHA-256.
    body = registry.read_artifact(1, "snapshot.json")
    assert body == canonical_json(got.snapshot) and body.endswith(b"}\n")
    assert sha256_bytes(body) == got.entry.snapshot_sha256 == got.artifacts["snapshot.json"].sha256
    assert json.loads(body) == got.snapshot
    assert list(json.loads(registry.store.get_key(registry_key(2)))) == sorted(
        [
            "version",
            "parent",
            "snapshot_sha256",
            "snapshot_size",
            "recipe_sha256",
            "patch_of",
            "created_at",
        ]
    )
    with pytest.raises(NotFound):
        registry.get(3)
    with pytest.raises(NotFound):
        registry.artifact_path(1, "nope.bin", tmp_path / "dl")


def test_artifacts_do_not_depend_on_the_version(registry: Registry, tmp_path: Path) -> None:
    paths, meta = make_cut(tmp_path / "a", clips(0, 8), seed=3)
    one = registry.publish(paths, meta, parent=None)
    two = registry.publish(paths, meta, parent=1)
    names = set(ARTIFACT_NAMES)
    assert {n: r for n, r in one.artifacts.items() if n in names} == {
        n: r for n, r in two.artifacts.items() if n in names
    }
    differs = {
        k
        for k in one.snapshot.keys() | two.snapshot.keys()
        if one.snapshot.get(k) != two.snapshot.get(k)
    }
    assert differs == {"version", "parent"}


def test_a_version_key_is_immutable(registry: Registry, tmp_path: Path) -> None:
    paths, meta = make_cut(tmp_path / "a", clips(0, 6), seed=4)
    original = registry.publish(paths, meta, parent=None)
    raw = registry.store.get_key(registry_key(1))
    with pytest.raises(Conflict):
        registry.store.put_key(registry_key(1), b'{"version": 1}')
    # Re-publishing version 1 is refused, before anything is uploaded.
    other_paths, other_meta = make_cut(tmp_path / "b", clips(10, 16), seed=5)
    before = object_count(registry.store)
    with pytest.raises(Conflict) as info:
        registry.publish(other_paths, other_meta, parent=None)
    assert (info.value.details["version"], info.value.details["latest"]) == (1, 1)
    assert object_count(registry.store) == before
    assert registry.store.get_key(registry_key(1)) == raw
    assert registry.get(1) == original
    assert registry.versions() == [1]


def test_a_stale_parent_is_a_conflict(registry: Registry, tmp_path: Path) -> None:
    paths, meta = make_cut(tmp_path / "a", clips(0, 6), seed=6)
    registry.publish(paths, meta, parent=None)
    registry.publish(paths, meta, parent=1)
    for stale in (None, 1, 5):
        with pytest.raises(Conflict) as info:
            registry.publish(paths, meta, parent=stale)
        assert info.value.details["latest"] == 2
        assert info.value.details["version"] == (1 if stale is None else stale + 1)
    assert registry.versions() == [1, 2]


def test_losing_the_claim_is_a_conflict_and_loses_nothing(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent check passes for both, then the other publisher claims first."""
    mine, rival = Registry(store), Registry(store)
    paths_a, meta_a = make_cut(tmp_path / "a", clips(0, 6), seed=7)
    paths_b, meta_b = make_cut(tmp_path / "b", clips(6, 12), seed=8)
    real_put_key = store.put_key
    winner: list[SnapshotRecord] = []

    def put_key_after_rival(key: str, data: bytes) -> None:
        if not winner:
            monkeypatch.setattr(store, "put_key", real_put_key)
            winner.append(rival.publish(paths_b, meta_b, parent=None))
        real_put_key(key, data)

    monkeypatch.setattr(store, "put_key", put_key_after_rival)
    with pytest.raises(Conflict) as info:
        mine.publish(paths_a, meta_a, parent=None)
    assert (info.value.details["version"], info.value.details["latest"]) == (1, 1)
    assert mine.versions() == [1]
    assert mine.get(1) == winner[0]
    # The loser retries on the new parent and gets the next version.
    again = mine.publish(paths_a, meta_a, parent=mine.next_parent())
    assert (again.version, again.parent) == (2, 1)


def test_bad_input_changes_nothing(registry: Registry, tmp_path: Path) -> None:
    paths, meta = make_cut(tmp_path / "a", clips(0, 6), seed=9)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({k: v for k, v in paths.items() if k != "plan.arrow"}, meta),
        ({**paths, "plan.arrow": tmp_path / "missing.arrow"}, meta),
        ({**paths, "../evil": paths["plan.arrow"]}, meta),
        ({**paths, "snapshot.json": paths["plan.arrow"]}, meta),
        (dict(paths), {k: v for k, v in meta.items() if k != "seed"}),
        (dict(paths), {**meta, "recipe_sha256": "not-a-sha"}),
        (dict(paths), {**meta, "seed": float("nan")}),
    ]
    for artifacts, snapshot in cases:
        with pytest.raises(InvalidInput):
            registry.publish(artifacts, snapshot, parent=None)
    with pytest.raises(NotFound):
        registry.publish(paths, meta, parent=None, patch_of=7)
    assert registry.versions() == []
    assert object_count(registry.store) == 0


def test_a_tampered_snapshot_json_fails_verification(registry: Registry, tmp_path: Path) -> None:
    paths, meta = make_cut(tmp_path / "a", clips(0, 6), seed=10)
    record = registry.publish(paths, meta, parent=None)
    tamper(registry.store, record.entry.snapshot_sha256)
    with pytest.raises(ChecksumMismatch):
        registry.get(1)
    with pytest.raises(ChecksumMismatch):
        registry.list()


def test_a_tampered_artifact_fails_on_download(registry: Registry, tmp_path: Path) -> None:
    paths, meta = make_cut(tmp_path / "a", clips(0, 6), seed=11)
    record = registry.publish(paths, meta, parent=None)
    tamper(registry.store, record.artifacts["plan.arrow"].sha256)
    dest_dir = tmp_path / "dl"
    with pytest.raises(ChecksumMismatch):
        registry.artifact_path(1, "plan.arrow", dest_dir)
    assert not (dest_dir / "plan.arrow").exists()
    with pytest.raises(ChecksumMismatch):
        registry.open_artifact(1, "plan.arrow")
    # The other artifacts are untouched and still verify.
    assert registry.artifact_path(1, "index.arrow", dest_dir).is_file()


def test_pins_protect_the_objects_of_pinned_versions(registry: Registry, tmp_path: Path) -> None:
    paths1, meta1 = make_cut(tmp_path / "a", clips(0, 6), seed=12)
    paths2, meta2 = make_cut(tmp_path / "b", clips(100, 104), seed=13)
    one = registry.publish(paths1, meta1, parent=None)
    two = registry.publish(paths2, meta2, parent=1)
    assert registry.pins() == [] and registry.protected_objects() == set()

    pin = registry.pin(1, reason="run 42 trains on it", by="alice")
    assert (pin.version, pin.reason, pin.by) == (1, "run 42 trains on it", "alice")
    assert [p.version for p in registry.pins()] == [1]
    expected = {ref.sha256 for ref in one.artifacts.values()}
    expected |= {sha(f"latent-{c}") for c in clips(0, 6)}
    expected |= {sha(f"te-{c}-{k}") for c in clips(0, 6) for k in (0, 1)}
    assert registry.protected_objects() == expected

    registry.pin(2, reason="eval baseline")
    protected = registry.protected_objects()
    assert expected < protected
    assert {ref.sha256 for ref in two.artifacts.values()} <= protected

    assert registry.unpin(1, by="alice") is True
    assert registry.unpin(1) is False  # not pinned any more: nothing written
    assert [p.version for p in registry.pins()] == [2]
    assert not ({sha(f"latent-{c}") for c in clips(0, 6)} & registry.protected_objects())
    registry.pin(1, reason="again", by="bob")
    history = registry.pin_history(1)
    assert [(e.seq, e.action, e.by) for e in history] == [
        (1, "pin", "alice"),
        (2, "unpin", "alice"),
        (3, "pin", "bob"),
    ]
    assert [p.version for p in registry.pins()] == [1, 2]
    with pytest.raises(NotFound):
        registry.pin(9, reason="x")
    with pytest.raises(InvalidInput):
        registry.pin(1, reason="  ")


def test_diff(registry: Registry, tmp_path: Path) -> None:
    paths1, meta1 = make_cut(
        tmp_path / "a", clips(0, 10), seed=14, stream_shares={"main": 0.75, "aux": 0.25}
    )
    # Version 2: clips 5..14, one clip twice (two rungs), a new stream share.
    ids2 = [*clips(5, 15), "clip-0005"]
    paths2, meta2 = make_cut(
        tmp_path / "b", ids2, seed=15, stream_shares={"main": 0.5, "aux": 0.3, "new": 0.2}
    )
    registry.publish(paths1, meta1, parent=None)
    registry.publish(paths2, meta2, parent=1)

    diff = registry.diff(1, 2)
    assert diff.clips_added == clips(10, 15)
    assert diff.clips_removed == clips(0, 5)
    assert (diff.num_clips_a, diff.num_clips_b) == (10, 10)
    assert (diff.num_clips_added, diff.num_clips_removed) == (5, 5)
    assert diff.rows == {"a": 10, "b": 11, "delta": 1}
    assert diff.stream_shares["main"] == {"a": 0.75, "b": 0.5, "delta": -0.25}
    assert diff.stream_shares["new"] == {"a": None, "b": 0.2}
    assert diff.recipe_sha256["changed"] is True
    assert diff.catalog_changed is True
    assert diff.counts["clips"] == {"a": 10, "b": 11, "delta": 1}
    assert json.loads(json.dumps(diff.model_dump()))["clips_added"] == clips(10, 15)

    short = registry.diff(1, 2, max_clips=2)
    assert short.clips_added == clips(10, 12) and short.clips_truncated
    assert short.num_clips_added == 5
    same = registry.diff(2, 2)
    assert same.clips_added == same.clips_removed == [] and not same.recipe_sha256["changed"]


def _race(store: ObjectStore, tmp_path: Path, workers: int = 4, attempts: int = 3) -> None:
    go = tmp_path / "go"
    procs = []
    for w in range(workers):
        config = {
            "url": store.url,
            "endpoint_url": getattr(store, "endpoint_url", None),
            "worker": w,
            "workdir": str(tmp_path / f"w{w}"),
            "go_file": str(go),
            "attempts": attempts,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.manifests._cutter", json.dumps(config)],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    time.sleep(0.5)  # let them import and build their cuts; they wait for the go file
    go.touch()
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outcomes += [json.loads(line) for line in out.splitlines()]
    assert len(outcomes) == workers * attempts
    won = [o for o in outcomes if o["outcome"] == "ok"]
    lost = [o for o in outcomes if o["outcome"] == "conflict"]
    # A conflict names the version it wanted, already taken when it was refused.
    assert all(o["latest"] >= o["version"] for o in lost)
    # Distinct versions, 1..k with no gap, each entry naming version - 1 as its parent.
    registry = Registry(store)
    versions = sorted(o["version"] for o in won)
    assert versions == list(range(1, len(won) + 1)) == registry.versions()
    for o in won:
        record = registry.get(o["version"])  # verifies snapshot.json
        assert record.parent == (None if o["version"] == 1 else o["version"] - 1)
        assert record.parent == o["parent"]
        assert record.snapshot["seed"] == o["seed"]
        assert record.entry.snapshot_sha256 == o["snapshot_sha256"]


def test_four_processes_publishing_at_once(store: ObjectStore, tmp_path: Path) -> None:
    _race(store, tmp_path)
