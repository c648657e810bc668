"""Hard-takedown erasure: after it, no byte of the asset's caption, latent or vector
remains anywhere under the lake's root (object store, warehouse, LanceDB, registry)."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.erase import erase_asset, erasure_id, get_erasure
from catalog.errors import InvalidInput, NotFound
from manifests.erasure import erase_versions
from manifests.registry import Registry
from materializer.cut import cut_snapshot
from materializer.recipe import load_recipe
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo

CAPTION_MARKER = "ZQXV-ERASE-CAPTION-MARKER"


class Lake:
    """A small packed corpus with one asset carrying planted markers."""

    def __init__(self, root: Path, config: CatalogConfig, *, tombstone: bool = True) -> None:
        self.root = root
        self.bucket: str | None = None
        self.endpoint = ""
        self.catalog = VidlakeCatalog.open(config)
        self.registry = Registry(self.catalog.objects)
        generate_corpus(self.catalog, assets=60, seed=5, latents="packed")
        recipe = load_recipe(small_corpus_demo())  # 60 assets: repeats allowed
        first = cut_snapshot(self.catalog, self.registry, recipe)
        index = _index(self.registry, first.version)
        # The asset of the first row: a train asset the demo recipe selects.
        self.asset = index["asset_id"][0].as_py()
        self.clips = sorted(
            self.catalog.scan("clips", row_filter=f"asset_id = '{self.asset}'")[
                "clip_id"
            ].to_pylist()
        )
        self.catalog.add_captions(
            [
                {
                    "clip_id": c,
                    "caption_version": "3",
                    "kind": k,
                    "text": f"{CAPTION_MARKER} {k} {c}",
                }
                for c in self.clips
                for k in ("dense", "short")
            ]
        )
        self.version = cut_snapshot(self.catalog, self.registry, recipe).version
        self.latent_marker, self.pack = _latent_marker(self.catalog, self.clips)
        self.vector_marker = _vector_marker(self.catalog, self.clips[0])
        if tombstone:
            self.catalog.add_tombstones(
                [{"asset_id": self.asset, "reason": "test", "kind": "hard"}]
            )
        # Write the clip keys the index holds back (catalog/key_index_pending.py), so
        # that its file holds the erased clip's key, as after any close.
        self.catalog._keys.close()

    def erase(self, **kw: Any) -> dict[str, Any]:
        def versions(plan: Any, packs: Any, expired: Any, progress: Any) -> dict[str, Any]:
            return erase_versions(self.registry, plan, packs, expired, progress)

        return erase_asset(self.catalog, self.asset, versions=versions, **kw)


def _index(registry: Registry, version: int) -> pa.Table:
    with registry.local_artifact(version, "index.arrow") as path, pa.memory_map(str(path)) as f:
        return pa.ipc.open_file(f).read_all()


def _latent_marker(catalog: VidlakeCatalog, clips: list[str]) -> tuple[bytes, str]:
    """32 bytes from the middle of one of the asset's latent members (random bf16 noise:
    unique), checked to lie in a pack shared with other assets."""
    rows = catalog.scan("latents", row_filter=f"clip_id = '{clips[0]}'")
    sha, off, n = (rows[c][0].as_py() for c in ("object_sha256", "offset", "length"))
    others = catalog.scan("latents", row_filter=f"object_sha256 = '{sha}'")
    assert set(others["clip_id"].to_pylist()) - set(clips), "the test needs a shared pack"
    return catalog.objects.get_range(sha, off + n // 2, 32), sha


def _vector_marker(catalog: VidlakeCatalog, clip: str) -> bytes:
    index = catalog.embeddings("siglip-demo-v1")
    _, vectors = index.vectors([clip])
    return np.ascontiguousarray(vectors[0][:8], dtype=np.float32).tobytes()


def scan_files(root: Path, markers: dict[str, bytes]) -> dict[str, list[str]]:
    """Which files under ``root`` contain each marker, raw bytes."""
    hits: dict[str, list[str]] = {name: [] for name in markers}
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = Path(dirpath) / f
            data = path.read_bytes()
            for name, marker in markers.items():
                if marker in data:
                    hits[name].append(str(path.relative_to(root)))
    return hits


def scan_bucket(endpoint: str, bucket: str, markers: dict[str, bytes]) -> dict[str, list[str]]:
    """Which objects of ``bucket`` (every version, and any unfinished multipart upload's
    parts: none may exist) contain each marker, raw bytes."""
    from tests.fixtures.s3 import s3_client

    client = s3_client(endpoint)
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    hits: dict[str, list[str]] = {name: [] for name in markers}
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for item in page.get("Versions", []):
            body = client.get_object(Bucket=bucket, Key=item["Key"], VersionId=item["VersionId"])
            data = body["Body"].read()
            for name, marker in markers.items():
                if marker in data:
                    hits[name].append(item["Key"])
    return hits


def lake_hits(lake: Lake) -> dict[str, list[str]]:
    """Every file under the root and, on S3, every object of the bucket, scanned."""
    markers = _markers(lake)
    hits = scan_files(lake.root, markers)
    if lake.bucket is not None:
        for name, found in scan_bucket(lake.endpoint, lake.bucket, markers).items():
            hits[name] += [f"s3://{lake.bucket}/{k}" for k in found]
    return hits


NO_HITS = {"caption": [], "latent": [], "vector": [], "asset_key": [], "clip_key": []}


@pytest.fixture(scope="module", params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    root = tmp_path_factory.mktemp("erase")
    if request.param == "local":
        return Lake(root, CatalogConfig.embedded(root, eval_salt="00" * 16))
    from tests.fixtures.s3 import s3_client

    endpoint = request.getfixturevalue("s3_server")
    bucket = f"erase-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    config = CatalogConfig.embedded(
        root,
        eval_salt="00" * 16,
        warehouse=f"s3://{bucket}/warehouse",
        objects=f"s3://{bucket}/objects",
        s3_endpoint_url=endpoint,
        s3_path_style=True,
    )
    lake = Lake(root, config)
    lake.bucket, lake.endpoint = bucket, endpoint
    return lake


def _markers(lake: Lake) -> dict[str, bytes]:
    return {
        "caption": CAPTION_MARKER.encode(),
        "latent": lake.latent_marker,
        "vector": lake.vector_marker,
        # The key index stores hex ids as their bytes: the erased asset's and clip's.
        "asset_key": bytes.fromhex(lake.asset),
        "clip_key": bytes.fromhex(lake.clips[0]),
    }


def test_markers_are_everywhere_before_the_erase(lake: Lake) -> None:
    hits = lake_hits(lake)
    assert any("objects" in h for h in hits["caption"])  # the registered index holds it
    assert any("warehouse" in h for h in hits["caption"])
    assert hits["latent"] and hits["vector"], hits
    assert hits["asset_key"] and hits["clip_key"], hits  # in the key index file


def test_erase_leaves_no_marker_and_keeps_everything_else(lake: Lake) -> None:
    before = {n: lake.catalog.scan(n, include_eval=True).num_rows for n in ("assets", "clips")}
    survivors = lake.catalog.scan("latents", row_filter=f"object_sha256 = '{lake.pack}'")
    survivors = survivors.filter(pc.invert(pc.is_in(survivors["clip_id"], pa.array(lake.clips))))
    if lake.bucket is not None:
        # A killed multipart upload of the pack's key: invisible, but its part holds bytes.
        from tests.fixtures.s3 import s3_client

        client, key = s3_client(lake.endpoint), lake.catalog.objects.key_of(lake.pack)  # type: ignore[attr-defined]
        upload = client.create_multipart_upload(Bucket=lake.bucket, Key=key)["UploadId"]
        client.upload_part(
            Bucket=lake.bucket, Key=key, UploadId=upload, PartNumber=1, Body=lake.latent_marker
        )
    result = lake.erase(requested_by="legal")
    assert lake_hits(lake) == NO_HITS  # on S3: no unfinished upload either
    assert result["objects"]["uploads_aborted"] == (1 if lake.bucket else 0)
    assert result["erasure_id"] == erasure_id(lake.asset)
    assert result["requested_by"] == "legal"
    assert result["tables"]["clips"]["rows_dropped"] == len(lake.clips)
    assert lake.pack in result["packs_rewritten"]
    assert lake.pack in result["objects"]["deleted"]
    assert lake.catalog.objects.head(lake.pack) is None
    # Every other asset's rows stay; survivors of the pack read and verify from the new one.
    after = {n: lake.catalog.scan(n, include_eval=True).num_rows for n in ("assets", "clips")}
    assert after == {"assets": before["assets"] - 1, "clips": before["clips"] - len(lake.clips)}
    moved = lake.catalog.scan("latents", include_eval=True)
    moved = moved.filter(pc.is_in(moved["member_sha256"], survivors["member_sha256"]))
    assert moved.num_rows == survivors.num_rows
    new_pack = result["packs_rewritten"][lake.pack]
    for row in moved.to_pylist():
        assert row["object_sha256"] == new_pack
        data = lake.catalog.objects.get_range(new_pack, row["offset"], row["length"])
        assert hashlib.sha256(data).hexdigest() == row["member_sha256"]
    for table in ("latents", "captions", "scores"):
        rows = lake.catalog.scan(table, include_eval=True)
        assert not set(rows["clip_id"].to_pylist()) & set(lake.clips)
    assert lake.catalog.embeddings("siglip-demo-v1").vectors(lake.clips)[0] == []


def test_a_rerun_returns_the_audit_record_and_changes_nothing(lake: Lake) -> None:
    lake.erase()  # idempotent: these tests also run alone
    first = get_erasure(lake.catalog, erasure_id(lake.asset))
    assert first["state"] == "done"
    again = lake.erase()
    assert again == {k: v for k, v in first.items() if k != "state"}


def test_the_erased_versions_are_marked_and_a_new_cut_works(lake: Lake) -> None:
    lake.erase()  # idempotent: these tests also run alone
    record = lake.registry.get(lake.version)
    assert record.contains_erased_data
    assert record.erasures[-1].erasure_id == erasure_id(lake.asset)
    index = _index(lake.registry, lake.version)
    erased = record.erasures[-1].erased_rows
    assert erased and all(index["asset_id"][r].as_py() == "" for r in erased)
    assert lake.asset not in index["asset_id"].to_pylist()
    nxt = cut_snapshot(lake.catalog, lake.registry, load_recipe(small_corpus_demo()))
    assert lake.asset not in _index(lake.registry, nxt.version)["asset_id"].to_pylist()


def test_bad_requests_change_nothing(lake: Lake) -> None:
    with pytest.raises(InvalidInput, match="64 lowercase hex"):
        erase_asset(lake.catalog, "nope")
    other = lake.catalog.scan("assets", columns=["asset_id"])["asset_id"][0].as_py()
    with pytest.raises(InvalidInput, match="no hard tombstone"):
        erase_asset(lake.catalog, other)
    ghost = uuid.uuid4().hex * 2
    lake.catalog.objects  # noqa: B018 - the store exists
    with pytest.raises(InvalidInput):
        erase_asset(lake.catalog, ghost)  # no tombstone can exist for a missing asset
    with pytest.raises(NotFound):
        get_erasure(lake.catalog, erasure_id(ghost))


def test_the_loader_skips_exactly_the_erased_rows_and_counts_them(
    lake: Lake, tmp_path: Path
) -> None:
    lake.erase()  # idempotent: these tests also run alone
    from loader.dataset import SnapshotDataset
    from loader.source import StoreSource

    record = lake.registry.get(lake.version)
    erased = set(record.erasures[-1].erased_rows)
    ds = SnapshotDataset(
        StoreSource(lake.catalog.objects),
        lake.version,
        rank=1,
        world_size=2,
        cache_dir=tmp_path / "node",
        cache_budget_bytes=1 << 30,
        prefetch_steps=0,
    )
    plan = ds.plan
    assert set(plan.erased_rows.tolist()) == erased
    first = next(s for s in range(plan.num_steps) if erased & set(plan.rows(s, 1, 2).tolist()))
    ds.seek(first)
    ds.end_step = first + 8
    expected_skips = 0
    for batch in ds:
        step = batch["step"]
        mine = plan.rows(step, 1, 2).tolist()
        kept = [r for r in mine if r not in erased]
        assert batch["rows"].tolist() == kept  # every other sample, in order, exactly once
        assert batch["erased"] == len(mine) - len(kept)
        assert not any(CAPTION_MARKER in (c or "") for c in batch["captions"])
        expected_skips += len(mine) - len(kept)
    assert expected_skips > 0  # the asset was in these steps
    stats = ds.stats()
    assert stats["erased_skipped"] == expected_skips
    assert stats["erased_rows"] == len(erased)
    assert stats["erasure_ids"] == [erasure_id(lake.asset)]


def test_a_pin_the_erasure_expired_fails_naming_the_erasure(lake: Lake) -> None:
    lake.erase()  # idempotent: these tests also run alone
    from catalog.pins import Pin

    record = lake.registry.get(lake.version)
    pins = record.erasures[-1].expired_pins
    assert pins  # the version was cut after the asset's ingest: its pins are gone
    # Its LanceDB versions too: the vectors' table was rewritten and the old ones removed.
    assert any(key.startswith("embeddings/") for key in pins), pins
    pin = Pin.from_dict(record.snapshot["catalog_snapshot_ids"])
    table = sorted(pins)[0]
    with pytest.raises(NotFound, match=erasure_id(lake.asset)) as info:
        lake.catalog.scan(table, pin)
    assert info.value.details["erasure_id"] == erasure_id(lake.asset)


def test_objects_adopted_by_reference_are_listed_not_erased(tmp_path: Path) -> None:
    from interop.tar_import import import_tar_shards
    from tests.interop._tar_data import make_dataset

    data = make_dataset(tmp_path / "tars", corrupt=False)
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake", eval_fraction=0.0))
    import_tar_shards(catalog, data.root)
    latents = catalog.scan("latents")
    clip = latents["clip_id"][0].as_py()
    shard = latents["object_sha256"][0].as_py()
    asset = catalog.scan("clips", row_filter=f"clip_id = '{clip}'")["asset_id"][0].as_py()
    before = {p: p.read_bytes() for p in data.root.glob("*.tar")}
    catalog.add_tombstones([{"asset_id": asset, "reason": "test", "kind": "hard"}])
    result = erase_asset(catalog, asset)
    assert result["not_erased"]["adopted_objects"] == [shard]
    assert shard not in result["objects"]["deleted"]
    # The publisher's bytes: not ours to erase.
    assert {p: p.read_bytes() for p in data.root.glob("*.tar")} == before
    assert not catalog.scan("clips", row_filter=f"asset_id = '{asset}'").num_rows
    others = catalog.scan("latents", row_filter=f"object_sha256 = '{shard}'")
    assert others.num_rows > 0 and clip not in others["clip_id"].to_pylist()


def test_a_patch_of_an_erased_version_skips_the_erased_rows(lake: Lake) -> None:
    lake.erase()  # idempotent: these tests also run alone
    from manifests.patch import patch

    erased = set(lake.registry.get(lake.version).erasures[-1].erased_rows)
    index = _index(lake.registry, lake.version)
    keep = next(r for r in range(index.num_rows) if r not in erased)
    patched = patch(lake.registry, lake.version, exclude_rows=[keep], reason="loss spike")
    with (
        lake.registry.local_artifact(patched.version, "plan.arrow") as path,
        pa.memory_map(str(path)) as f,
    ):
        rows = pa.ipc.open_file(f).read_all()["rows"]
    served = set(pc.list_flatten(rows).to_pylist())
    assert not served & (erased | {keep})
