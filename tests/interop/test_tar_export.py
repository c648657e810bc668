"""Export of a snapshot as TAR shards, and the round trip export → import → cut."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import ChecksumMismatch, Conflict
from interop.tar_export import export_tar_shards
from interop.tar_import import import_tar_shards, verify_shards
from manifests.registry import Registry
from materializer.cut import cut_snapshot
from tests.fixtures.s3 import s3_client
from tests.interop._tar_data import make_dataset
from tests.interop.test_tar_import import _recipe

SALT = "cd" * 16


def _catalog(root: Path) -> VidlakeCatalog:
    return VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt=SALT))


def _ipc(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as f:
        return pa.ipc.open_file(f).read_all()


def _sequence(registry: Registry, version: int, tmp: Path) -> tuple[list[str], list[list[int]]]:
    """The snapshot's sample ids by manifest row, and the plan's rows per step."""
    index = _ipc(registry.artifact_path(version, "index.arrow", tmp))
    plan = _ipc(registry.artifact_path(version, "plan.arrow", tmp))
    return index["clip_id"].to_pylist(), plan["rows"].to_pylist()


@pytest.fixture(scope="module")
def source_lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[VidlakeCatalog, Registry, int]:
    root = tmp_path_factory.mktemp("src")
    data = make_dataset(root / "ds", per_shard=6, corrupt=False)
    catalog = _catalog(root / "lake")
    import_tar_shards(catalog, data.root)
    registry = Registry(catalog.objects)
    record = cut_snapshot(catalog, registry, _recipe(steps=10))
    return catalog, registry, record.version


def test_export_writes_bucket_pure_shards_in_plan_order_with_a_verifiable_manifest(
    source_lake: tuple[VidlakeCatalog, Registry, int], tmp_path: Path
) -> None:
    catalog, registry, version = source_lake
    out = tmp_path / "out"
    report = export_tar_shards(catalog, registry, version, out, samples_per_shard=3)
    doc = json.loads((out / "manifest.json").read_text())
    assert (out / "manifests" / "v000001.json").read_bytes() == (out / "manifest.json").read_bytes()
    assert doc["vidlake_snapshot"] == version and len(doc["shards"]) == report.shards
    index = _ipc(registry.artifact_path(version, "index.arrow", tmp_path))
    bucket_of = dict(zip(index["clip_id"].to_pylist(), index["bucket"].to_pylist(), strict=True))
    written: list[str] = []
    for shard in doc["shards"]:
        raw = (out / shard["path"]).read_bytes()
        assert len(raw) == shard["size"] and hashlib.sha256(raw).hexdigest() == shard["sha256"]
        with tarfile.open(out / shard["path"]) as tar:
            names = tar.getnames()
            assert names == [f"{s}{e}" for s in shard["sample_ids"] for e in (".pt", ".json")]
            for name in names:
                data = tar.extractfile(name).read()  # type: ignore[union-attr]
                assert hashlib.sha256(data).hexdigest() == shard["members"][name]["sha256"]
        clips = [s.rsplit("-", 1)[0] for s in shard["sample_ids"]]
        assert len({bucket_of[c] for c in clips}) == 1, "a shard mixes buckets"
        written += clips
    assert sorted(written) == sorted(index["clip_id"].to_pylist())
    # Plan order: within each bucket, samples appear in the order the plan serves them.
    plan = _ipc(registry.artifact_path(version, "plan.arrow", tmp_path))
    first: list[str] = []
    for rows in plan["rows"].to_pylist():
        for r in rows:
            c = index["clip_id"][r].as_py()
            if c not in first:
                first.append(c)
    for shard in doc["shards"]:
        clips = [s.rsplit("-", 1)[0] for s in shard["sample_ids"]]
        ranks = [first.index(c) for c in clips if c in first]
        assert ranks == sorted(ranks)
    # Nothing is overwritten.
    with pytest.raises(Conflict):
        export_tar_shards(catalog, registry, version, out, samples_per_shard=3)


def test_round_trip_export_import_cut_gives_the_same_sample_sequence(
    source_lake: tuple[VidlakeCatalog, Registry, int], tmp_path: Path
) -> None:
    catalog, registry, version = source_lake
    out = tmp_path / "rt"
    export_tar_shards(catalog, registry, version, out, samples_per_shard=4)
    other = _catalog(tmp_path / "lake2")
    report = import_tar_shards(other, out)
    assert (
        report.imported == _ipc(registry.artifact_path(version, "index.arrow", tmp_path)).num_rows
    )
    reg2 = Registry(other.objects)
    v2 = cut_snapshot(other, reg2, _recipe(steps=10)).version
    a = _sequence(registry, version, tmp_path / "a")
    b = _sequence(reg2, v2, tmp_path / "b")
    assert a[0] and a == b


@pytest.mark.s3
def test_export_to_s3_then_import_from_s3(
    source_lake: tuple[VidlakeCatalog, Registry, int], tmp_path: Path, s3_server: str,
    s3_bucket: str,
) -> None:  # fmt: skip
    catalog, registry, version = source_lake
    report = export_tar_shards(catalog, registry, version, f"s3://{s3_bucket}/exp")
    client: Any = s3_client(s3_server)
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert {"exp/manifest.json", "exp/manifests/v000001.json"} <= keys
    other = _catalog(tmp_path / "lake3")
    assert import_tar_shards(other, f"s3://{s3_bucket}/exp").imported == report.samples
    with pytest.raises(Conflict):
        export_tar_shards(catalog, registry, version, f"s3://{s3_bucket}/exp")


@pytest.mark.s3
def test_export_and_import_on_s3_use_the_configured_endpoint(
    tmp_path: Path, s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # boto3's own default endpoint is dead: only the catalog's configured one works.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")

    def lake(name: str) -> VidlakeCatalog:
        config = CatalogConfig.embedded(
            tmp_path / name, eval_salt=SALT, s3_endpoint_url=s3_server, s3_path_style=True
        )
        return VidlakeCatalog.open(config)

    catalog = lake("a")
    import_tar_shards(catalog, make_dataset(tmp_path / "ds", per_shard=3, corrupt=False).root)
    registry = Registry(catalog.objects)
    version = cut_snapshot(catalog, registry, _recipe(steps=6)).version
    report = export_tar_shards(catalog, registry, version, f"s3://{s3_bucket}/cfg")
    other = lake("b")
    assert import_tar_shards(other, f"s3://{s3_bucket}/cfg").imported == report.samples
    assert verify_shards(other)["failed"] == []


def test_export_refuses_a_corrupt_member(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "ds", per_shard=3, corrupt=True)
    catalog = _catalog(tmp_path / "lake")
    import_tar_shards(catalog, data.root)
    registry = Registry(catalog.objects)
    version = cut_snapshot(catalog, registry, _recipe(steps=6)).version
    index = _ipc(registry.artifact_path(version, "index.arrow", tmp_path))
    if data.corrupt_sha256 not in index["member_sha256"].to_pylist():
        pytest.skip("the cut left the corrupted sample out")
    with pytest.raises(ChecksumMismatch):
        export_tar_shards(catalog, registry, version, tmp_path / "out")
