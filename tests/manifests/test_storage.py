"""Storage operations against the S3 server: inventory, verified upload, seal, restore."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import ChecksumMismatch, InvalidInput
from catalog.objects.s3 import S3ObjectStore
from manifests.registry import Registry
from manifests.storage.inventory import build_inventory, read_inventory
from manifests.storage.receipts import read_receipts
from manifests.storage.restore import check_restore, restore
from manifests.storage.seal import seal
from manifests.storage.upload import upload_entries
from materializer.cut import build_artifacts, cut_snapshot
from materializer.recipe import load_recipe
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo
from tests.fixtures.s3 import S3RequestCounter, s3_client

pytestmark = pytest.mark.s3

RECIPE = small_corpus_demo()  # a 40-asset corpus: pools smaller than a step's draw


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """An embedded catalog with a small corpus and one published cut."""
    root = tmp_path_factory.mktemp("lake")
    with VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16)) as catalog:
        generate_corpus(catalog, assets=40, seed=3)
        record = cut_snapshot(catalog, Registry(catalog.objects), load_recipe(RECIPE))
    return root, record.version


@pytest.fixture(scope="module")
def inventory(lake: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root, version = lake
    with VidlakeCatalog.open(CatalogConfig.embedded(root)) as catalog:
        inv = build_inventory(catalog, Registry(catalog.objects), version)
    return inv.write(tmp_path_factory.mktemp("inv") / "inventory.jsonl")


def _store(endpoint: str, bucket: str) -> S3ObjectStore:
    return S3ObjectStore(bucket, "backup", endpoint_url=endpoint)


def _artifact_hashes(catalog: VidlakeCatalog, out: Path) -> dict[str, str]:
    out.mkdir()
    artifacts, _ = build_artifacts(catalog, load_recipe(RECIPE), out)
    return {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in artifacts.items()}


def test_inventory_lists_what_the_snapshot_needs(inventory: Path, lake: tuple[Path, int]) -> None:
    inv = read_inventory(inventory)
    counts = inv.counts()
    assert {"artifact", "snapshot", "registry", "latent", "warehouse", "lance"} <= set(counts)
    assert counts["artifact"] >= 3
    root = lake[0].resolve()
    for e in inv.entries:
        assert Path(e.path).is_absolute() and Path(e.path).is_relative_to(root)
        assert Path(e.path).stat().st_size == e.size
        if e.sha256 is not None:
            assert hashlib.sha256(Path(e.path).read_bytes()).hexdigest() == e.sha256
    assert set(inv.header["tables"]) >= {"assets", "clips", "latents"}


def test_upload_seal_restore_cut_and_load(
    inventory: Path,
    lake: tuple[Path, int],
    s3_server: str,
    s3_bucket: str,
    s3_request_counter: S3RequestCounter,
    tmp_path: Path,
) -> None:
    inv = read_inventory(inventory)
    store = _store(s3_server, s3_bucket)
    receipts = tmp_path / "receipts" / "main.jsonl"
    report = upload_entries(inv.entries, store, receipts, workers=4)
    assert report.ok, report.failed
    assert len(read_receipts(receipts)) == len(inv.entries)
    # A rerun sends nothing: every entry has a receipt for its identity.
    s3_request_counter.reset()
    again = upload_entries(inv.entries, store, receipts, workers=4)
    assert again.ok and again.skipped == len(inv.entries)
    assert s3_request_counter.count() == 0

    pointer = seal(inv, receipts, store, tmp_path / "sealed")
    assert json.loads((tmp_path / "sealed" / "restore_spec.json").read_text()) == pointer

    s3_request_counter.reset()
    out = tmp_path / "restored"
    result = restore(tmp_path / "sealed" / "restore_spec.json", out)
    latents = {e.sha256 for e in inv.entries if e.kind == "latent"}
    fetched = {r.key.rpartition("/")[2] for r in s3_request_counter.requests if r.op == "GetObject"}
    assert not latents & fetched, "restore fetched latents up front"
    assert result["snapshot"] == lake[1]

    with VidlakeCatalog.open(CatalogConfig.embedded(lake[0])) as original:
        want = _artifact_hashes(original, tmp_path / "a")
        pin = original.pin()
    settings = json.loads(Path(result["config"]).read_text())
    config = CatalogConfig.embedded(
        out, objects=settings["objects"], s3_endpoint_url=settings["s3_endpoint_url"]
    )
    with VidlakeCatalog.open(config) as restored:
        assert restored.pin() == pin
        assert _artifact_hashes(restored, tmp_path / "b") == want
        # The restored catalog reads through the bucket's registry as well.
        assert Registry(restored.objects).versions() == list(range(1, lake[1] + 1))

    proof = check_restore(tmp_path / "sealed" / "restore_spec.json", tmp_path / "work")
    assert proof["samples"] > 0 and proof["step"] == 0
    assert store.key_exists(proof["proof_key"])

    # The loader reads a step from the bucket alone (its cache pulls the latents).
    from loader.dataset import SnapshotDataset
    from loader.source import StoreSource

    ds = SnapshotDataset(
        StoreSource(store),
        lake[1],
        cache_dir=tmp_path / "cache",
        cache_budget_bytes=1 << 30,
        end_step=1,
        prefetch_steps=0,
    )
    try:
        batch = next(iter(ds))
    finally:
        ds.close()
    assert batch["step"] == 0 and len(batch["clip_ids"]) > 0


def test_seal_refuses_incomplete_coverage(
    inventory: Path, s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    inv = read_inventory(inventory)
    store = _store(s3_server, s3_bucket)
    receipts = tmp_path / "r.jsonl"
    part = inv.entries[: len(inv.entries) - 3]
    assert upload_entries(part, store, receipts, workers=4).ok
    with pytest.raises(InvalidInput) as exc:
        seal(inv, receipts, store, tmp_path / "sealed")
    assert len(exc.value.gaps) == 3
    assert not (tmp_path / "sealed").exists()
    assert store.list_keys("restore-specs/") == []


def test_tampered_spec_or_metadata_is_detected(
    inventory: Path, s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    inv = read_inventory(inventory)
    store = _store(s3_server, s3_bucket)
    receipts = tmp_path / "r.jsonl"
    assert upload_entries(inv.entries, store, receipts, workers=4).ok
    pointer = seal(inv, receipts, store, tmp_path / "sealed")
    spec_file = tmp_path / "sealed" / "restore_spec.json"
    client = s3_client(s3_server)
    spec_key = f"backup/{pointer['key']}"
    original = client.get_object(Bucket=s3_bucket, Key=spec_key)["Body"].read()

    # 1. A spec edited in the bucket.
    edited = original.replace(b'"snapshot": ', b'"snapshot":  ')
    client.put_object(Bucket=s3_bucket, Key=spec_key, Body=edited)
    with pytest.raises(ChecksumMismatch):
        restore(spec_file, tmp_path / "r1")
    client.put_object(Bucket=s3_bucket, Key=spec_key, Body=original)

    # 2. A table's metadata file replaced in the bucket.
    spec = json.loads(original)
    meta_sha = spec["tables"]["clips"]["sha256"]
    client.put_object(Bucket=s3_bucket, Key=store.key_of(meta_sha), Body=b"{}")
    with pytest.raises(ChecksumMismatch):
        restore(spec_file, tmp_path / "r2")


def _corrupt_claiming_its_checksum(store: S3ObjectStore, sha256: str, data: bytes) -> None:
    """Put corrupt bytes under ``sha256``'s key with a client-sent SHA-256 that claims
    they are the object: the S3 server (moto) keeps the claim without checking it."""
    bad = bytes([data[0] ^ 1]) + data[1:]
    s3_client(store.endpoint_url or "").put_object(
        Bucket=store.bucket,
        Key=store.key_of(sha256),
        Body=bad,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256)).decode(),
    )


def _small_entries(tmp_path: Path, n: int = 4) -> tuple[Any, ...]:
    from manifests.storage.inventory import InventoryEntry

    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    entries = []
    for i in range(n):
        p = folder / f"f{i}.bin"
        p.write_bytes(bytes([i + 1]) * (2000 + i))
        entries.append(InventoryEntry.of("latent", p, hashlib.sha256(p.read_bytes()).hexdigest()))
    return tuple(entries)


def test_upload_gives_no_receipt_for_a_corrupt_object_with_a_lying_checksum(
    s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    entries = _small_entries(tmp_path)
    store = _store(s3_server, s3_bucket)
    victim = entries[1]
    assert victim.sha256 is not None
    # A corrupt copy is already in the bucket (an earlier run, another tool), and it
    # claims the right SHA-256: the conditional PUT answers 412 and only the bytes tell.
    _corrupt_claiming_its_checksum(store, victim.sha256, Path(victim.path).read_bytes())
    receipts = tmp_path / "r.jsonl"
    report = upload_entries(entries, store, receipts, workers=2)
    assert [f["path"] for f in report.failed] == [victim.path]
    assert "corrupt" in report.failed[0]["error"] or "checksum" in report.failed[0]["error"]
    assert victim.path not in read_receipts(receipts)
    assert len(read_receipts(receipts)) == len(entries) - 1


def test_seal_verifies_every_object_by_content(
    s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    from manifests.storage.inventory import Inventory

    entries = _small_entries(tmp_path)
    store = _store(s3_server, s3_bucket)
    receipts = tmp_path / "r.jsonl"
    assert upload_entries(entries, store, receipts, workers=2).ok
    victim = entries[2]
    assert victim.sha256 is not None
    # Corrupted in the bucket after its receipt, same size, checksum claim intact.
    _corrupt_claiming_its_checksum(store, victim.sha256, Path(victim.path).read_bytes())
    header = {
        "tables": {},
        "warehouse": str(tmp_path / "warehouse"),
        "snapshot": 1,
        "namespace": "vidlake",
        "namespace_properties": {},
    }
    inv = Inventory(header=header, entries=entries)
    # (Without the corruption this inventory seals: the check below is what refuses.)
    with pytest.raises(ChecksumMismatch) as exc:
        seal(inv, receipts, store, tmp_path / "sealed")
    assert [p["sha256"] for p in exc.value.problems] == [victim.sha256]
    assert exc.value.problems[0]["reason"] == "corrupt"
    assert not (tmp_path / "sealed").exists()
    assert store.list_keys("restore-specs/") == []


@pytest.mark.parametrize("known_sha", [False, True], ids=["catalog-file", "content-addressed"])
def test_file_modified_during_upload_fails_and_has_no_receipt(
    s3_server: str,
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    known_sha: bool,
) -> None:
    from manifests.storage.inventory import InventoryEntry

    files = []
    for i in range(6):
        p = tmp_path / "data" / f"f{i}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(bytes([i]) * (1000 + i))
        files.append(p)
    entries = tuple(
        InventoryEntry.of(
            "latent", p, hashlib.sha256(p.read_bytes()).hexdigest() if known_sha else None
        )
        for p in files
    )
    victim = str(files[2].resolve())
    store = _store(s3_server, s3_bucket)
    real_put = store.put_file

    def rewrite_then_put(path: Any, sha256: str | None = None) -> Any:
        if str(path) == victim:  # the producer rewrites the file mid-upload
            Path(path).write_bytes(b"new bytes " * 7)
        return real_put(path, sha256)

    monkeypatch.setattr(store, "put_file", rewrite_then_put)
    receipts = tmp_path / "r.jsonl"
    report = upload_entries(entries, store, receipts, workers=3)
    assert not report.ok
    assert [f["path"] for f in report.failed] == [victim]
    got = read_receipts(receipts)
    assert victim not in got and len(got) == len(files) - 1
    assert all(r.sha256 == e.sha256 for e in entries for r in [got.get(e.path)] if r and e.sha256)


def test_cleanup_check_names_each_failing_condition(
    inventory: Path, s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    from manifests.storage.cleanup import cleanup_check

    inv = read_inventory(inventory)
    store = _store(s3_server, s3_bucket)
    receipts = tmp_path / "r.jsonl"
    latents = [e for e in inv.entries if e.kind == "latent"]
    target = latents[0].path
    spec_file = tmp_path / "sealed" / "restore_spec.json"

    def verdict(**kw: Any) -> dict[str, Any]:
        args: dict[str, Any] = {
            "inventory": inv,
            "receipts": read_receipts(receipts),
            "spec_file": spec_file if spec_file.exists() else None,
        }
        args.update(kw)
        (v,) = cleanup_check([target], **args)
        return v

    # Nothing uploaded: no receipt, not sealed.
    assert verdict()["failed"] == ["receipt", "sealed"]
    assert upload_entries(inv.entries, store, receipts, workers=4).ok
    assert verdict()["failed"] == ["sealed"]
    seal(inv, receipts, store, tmp_path / "sealed")
    v = verdict()
    assert v["failed"] == ["sealed"] and "representative read" in v["reasons"]["sealed"]
    check_restore(spec_file, tmp_path / "work")
    assert verdict() == {"path": target, "safe": True, "failed": [], "reasons": {}}
    # A later, unsealed snapshot still needs the bytes.
    v = verdict(newer_references=[{latents[0].sha256}])
    assert v["failed"] == ["unreferenced"]
    # A file outside the inventory is never safe.
    stray = tmp_path / "stray.bin"
    stray.write_bytes(b"x")
    (v,) = cleanup_check(
        [stray], inventory=inv, receipts=read_receipts(receipts), spec_file=spec_file
    )
    assert v["failed"][:2] == ["validated", "receipt"]
    # A file touched after its receipt fails both identity conditions.
    st = os.stat(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert verdict()["failed"] == ["validated", "receipt"]
