"""Import of TAR-shard datasets by reference: manifest rules, headers-only indexing, the
three sources, re-import, verification and quarantine, and serving through the loader."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
import torch

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import ChecksumMismatch, IntegrityError, InvalidInput, NotFound
from catalog.objects.refs import ObjectRef, RefStore, get_ref, list_failed, put_ref
from interop.sources import RangeSource
from interop.tar_import import (
    ImportOptions,
    import_tar_shards,
    quarantine_failed,
    verify_shards,
)
from interop.tar_index import index_tar
from tests.fixtures.s3 import S3RequestCounter, s3_client
from tests.interop._tar_data import RUNG, TOKENIZER, Dataset, http_server, make_dataset, upload

SALT = "ab" * 16


def _catalog(root: Path) -> VidlakeCatalog:
    return VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt=SALT, eval_fraction=0.0))


@pytest.fixture()
def data(tmp_path: Path) -> Dataset:
    return make_dataset(tmp_path / "ds")


@pytest.fixture()
def catalog(tmp_path: Path) -> VidlakeCatalog:
    return _catalog(tmp_path / "lake")


def _metadata(catalog: VidlakeCatalog) -> dict[str, dict[str, Any]]:
    clips = catalog.scan("clips", columns=["clip_id", "metadata"], include_eval=True)
    out = {}
    for row in clips.to_pylist():
        meta = json.loads(row["metadata"])
        out[meta["sample_id"]] = {**meta, "clip_id": row["clip_id"]}
    return out


# -- indexing ---------------------------------------------------------------------------
def test_index_reads_headers_only_and_finds_every_member(data: Dataset) -> None:
    src = RangeSource(data.root)
    reads: list[tuple[int, int]] = []

    def read(off: int, n: int) -> bytes:
        reads.append((off, n))
        return src.read_range("train-000001.tar", off, n)

    size = (data.root / "train-000001.tar").stat().st_size
    index = index_tar(read, size, window=512)
    names = [m.name for m in index.members]
    assert names == [f"{s}{ext}" for s in data.train_ids[4:8] for ext in (".pt", ".json")]
    raw = (data.root / "train-000001.tar").read_bytes()
    for m in index.members:
        assert m.offset % 512 == 0
        if m.name.endswith(".json"):
            assert index.inline[m.name] == raw[m.offset : m.offset + m.size]
    # No read touches a .pt member's bytes.
    for off, n in reads:
        for start, length in data.pt_ranges["train-000001.tar"]:
            assert off + n <= start or off >= start + length, (off, n, start, length)


def test_index_read_fraction_is_small_for_realistic_members(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "big", per_shard=3, corrupt=False, hw=(32, 32), frames=(16,))
    src = RangeSource(ds.root)
    size = (ds.root / "train-000000.tar").stat().st_size
    index = index_tar(lambda o, n: src.read_range("train-000000.tar", o, n), size)
    assert len(index.members) == 6
    assert index.bytes_read / size <= 0.01
    assert index.requests <= 4


def test_corrupt_header_is_an_integrity_error(data: Dataset) -> None:
    raw = bytearray((data.root / "train-000000.tar").read_bytes())
    raw[100] ^= 0x55  # inside the first header (mode field): the checksum fails
    with pytest.raises(IntegrityError):
        index_tar(lambda o, n: bytes(raw[o : o + n]), len(raw))


# -- import rules -----------------------------------------------------------------------
def test_import_adopts_listed_samples_by_reference(data: Dataset, catalog: VidlakeCatalog) -> None:
    src = RangeSource(data.root)
    report = import_tar_shards(catalog, src)
    assert report.revision == "v000002"
    wanted = [s for s in data.train_ids + data.val_ids if s not in data.excluded]
    assert report.imported == len(wanted)
    assert report.excluded == len(data.excluded)
    # The unlisted TAR is never opened; no shard was read in full.
    assert data.stray not in src.names_read
    assert report.index_bytes_read < report.shard_bytes
    # No byte copied into the object store: shards are references.
    assert list(catalog.objects.iter_objects()) == []
    for path, sha in data.shard_sha.items():
        ref = get_ref(catalog.objects, sha)
        assert ref is not None and ref.url.endswith(path)
    meta = _metadata(catalog)
    assert sorted(meta) == sorted(wanted)
    assert meta[wanted[0]]["sidecar"]["caption"].startswith("sample")
    # Latents point at the member's exact bytes (the corrupted one aside).
    lat = catalog.scan("latents", include_eval=True).to_pylist()
    by_clip = {m["clip_id"]: sid for sid, m in meta.items()}
    for row in lat:
        sid = by_clip[row["clip_id"]]
        assert row["format"] == "pt" and row["rung"] == RUNG
        assert row["tokenizer_version"] == TOKENIZER
        assert row["member_sha256"] == data.member_sha[sid]
        shard = meta[sid]["shard"]
        raw = (data.root / shard).read_bytes()[row["offset"] : row["offset"] + row["length"]]
        if sid != data.corrupt_id:
            assert hashlib.sha256(raw).hexdigest() == row["member_sha256"]
    # val -> eval, sealed from default reads.
    clips = catalog.scan("clips", columns=["clip_id", "split"], include_eval=True)
    split_of = dict(zip(clips["clip_id"].to_pylist(), clips["split"].to_pylist(), strict=True))
    for sid, m in meta.items():
        assert split_of[m["clip_id"]] == ("eval" if sid in data.val_ids else "train")
    # The job records the source revision.
    jobs = catalog.scan("jobs").to_pylist()
    prov = json.loads(jobs[-1]["provenance"])
    assert prov["revision"] == "v000002" and jobs[-1]["stage"] == "import"


def test_reimport_of_newer_revision_adds_only_new_samples_and_quarantines_exclusions(
    data: Dataset, catalog: VidlakeCatalog
) -> None:
    first = import_tar_shards(catalog, data.root, revision="v000001")
    assert first.revision == "v000001" and first.imported == len(data.v1_ids)
    second = import_tar_shards(catalog, data.root)
    new = [s for s in data.val_ids if s not in data.excluded]
    assert second.imported == len(new)
    assert second.duplicates == len(data.v1_ids) - len(data.excluded)
    assert second.quarantined == len(data.excluded)
    events = catalog.scan("asset_events").to_pylist()
    assert [e["event"] for e in events] == ["quarantined"] * len(data.excluded)
    again = import_tar_shards(catalog, data.root)
    assert again.imported == 0
    jobs = [json.loads(j["provenance"])["revision"] for j in catalog.scan("jobs").to_pylist()]
    assert sorted(jobs) == ["v000001", "v000002", "v000002"]


def test_bad_manifest_changes_nothing(data: Dataset, catalog: VidlakeCatalog) -> None:
    doc = json.loads((data.root / "manifest.json").read_text())
    doc["shards"][0]["sample_ids"].append("missing-sample")
    bad = data.root / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps(doc))
    for shard in doc["shards"]:
        (bad / shard["path"]).write_bytes((data.root / shard["path"]).read_bytes())
    before = catalog.pin()
    with pytest.raises(InvalidInput, match="missing-sample"):
        import_tar_shards(catalog, bad)
    assert catalog.pin() == before
    assert catalog.objects.list_keys("refs/") == []
    with pytest.raises(InvalidInput):
        import_tar_shards(catalog, data.root, revision="v1")
    with pytest.raises(NotFound):
        import_tar_shards(catalog, data.root, revision="v000009")


def test_http_source_reads_ranges_only_and_never_the_unlisted_tar(
    data: Dataset, catalog: VidlakeCatalog
) -> None:
    with http_server(data.root) as served:
        report = import_tar_shards(catalog, served.url)
        tar_gets = [r for r in served.requests if r[1].endswith(".tar")]
        assert tar_gets and all(rng is not None for _, _, rng in tar_gets)
        assert not any(data.stray in path for _, path, _ in served.requests)
        assert report.imported == len(data.train_ids) + len(data.val_ids) - len(data.excluded)
        # The loader's source reads a verified member through the HTTP reference.
        _loader_reads_members(catalog, data)


@pytest.mark.s3
def test_s3_source_never_reads_the_unlisted_tar(
    data: Dataset, catalog: VidlakeCatalog, s3_server: str, s3_bucket: str,
    s3_request_counter: S3RequestCounter,
) -> None:  # fmt: skip
    upload(data.root, s3_client(s3_server), s3_bucket, "ds")
    s3_request_counter.reset()
    report = import_tar_shards(catalog, f"s3://{s3_bucket}/ds")
    assert report.imported == len(data.train_ids) + len(data.val_ids) - len(data.excluded)
    assert s3_request_counter.count(None, f"ds/{data.stray}") == 0
    assert s3_request_counter.count("GetObject", "ds/manifest.json") == 1
    ref = get_ref(catalog.objects, data.shard_sha["train-000001.tar"])
    assert ref is not None and ref.url == f"s3://{s3_bucket}/ds/train-000001.tar"
    s3_request_counter.reset()
    _loader_reads_members(catalog, data)
    assert s3_request_counter.count("GetObject", f"ds/{data.stray}") == 0
    assert s3_request_counter.count("GetObject") >= 1


def _loader_reads_members(catalog: VidlakeCatalog, data: Dataset) -> None:
    """``loader.source.StoreSource`` reads every imported member through its shard's
    reference: intact ones verify, the corrupted one raises before anyone parses it."""
    from loader.source import StoreSource

    src = StoreSource(catalog.objects)
    for row in catalog.scan("latents", include_eval=True).to_pylist():
        args = (row["object_sha256"], row["offset"], row["length"], row["member_sha256"])
        if row["member_sha256"] == data.corrupt_sha256:
            with pytest.raises(ChecksumMismatch):
                src.read_member(*args)
        else:
            assert len(src.read_member(*args)) == row["length"]
        assert src.object_size(row["object_sha256"]) == row["object_size"]


# -- references, verification, quarantine -------------------------------------------------
def test_refs_are_create_only_and_answer_head(tmp_path: Path, data: Dataset) -> None:
    from catalog.objects.local import LocalObjectStore

    store = LocalObjectStore(tmp_path / "objs")
    sha = data.shard_sha["train-000001.tar"]
    path = data.root / "train-000001.tar"
    ref = ObjectRef(sha, path.stat().st_size, path.as_uri())
    assert put_ref(store, ref) is True
    assert put_ref(store, ref) is False  # idempotent
    with pytest.raises(Exception, match="already referenced"):
        put_ref(store, ObjectRef(sha, 1, path.as_uri()))
    wrapped = RefStore(store)
    assert store.head(sha) is None
    info = wrapped.head(sha)
    assert info is not None and info.size == ref.size
    assert wrapped.verify(sha).size == ref.size
    assert wrapped.get(sha) == path.read_bytes()
    with pytest.raises(InvalidInput):
        ObjectRef(sha, 1, "ftp://x/y")


def test_verify_quarantines_a_rotten_shard_and_the_next_cut_excludes_it(
    data: Dataset, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    import_tar_shards(catalog, data.root)
    result = verify_shards(catalog)
    rotten = data.shard_sha["train-000000.tar"]
    assert result["failed"] == [rotten]
    assert sorted(result["verified"]) == sorted(
        v for k, v in data.shard_sha.items() if k != "train-000000.tar"
    )
    assert list_failed(catalog.objects) == [rotten]
    assert result["quarantined"] == {rotten: 4}
    from materializer.cut import build_artifacts

    (tmp_path / "cut").mkdir()
    artifacts, snap = build_artifacts(catalog, _recipe(), tmp_path / "cut")
    assert snap["drops"]["quarantined"] == 4
    meta = _metadata(catalog)
    import pyarrow as pa

    with pa.memory_map(str(artifacts["index.arrow"])) as f:
        clip_ids = set(pa.ipc.open_file(f).read_all()["clip_id"].to_pylist())
    rotten_clips = {m["clip_id"] for m in meta.values() if m["shard"] == "train-000000.tar"}
    assert clip_ids and not clip_ids & rotten_clips
    events = catalog.scan("asset_events").num_rows
    assert quarantine_failed(catalog) == {rotten: 0}  # idempotent: nothing new
    assert catalog.scan("asset_events").num_rows == events


def _recipe(steps: int = 6) -> Any:
    from materializer.recipe import Recipe

    return Recipe.model_validate(
        {
            "name": "tar-test",
            "seed": 11,
            "tokenizer_version": TOKENIZER,
            "streams": [{"name": "all", "where": "source_tier = 'licensed'"}],
            "captions": {"version": "import", "kinds": ["dense"]},
            "buckets": {"latent_frames": [4, 8], "aspect_ratios": ["1:1"]},
            "phases": [
                # A bucket may hold one imported clip, fewer than a step of 2 draws.
                {"name": "p", "rung": RUNG, "weights": {"all": 1.0}, "steps": steps,
                 "global_batch": 2, "rank_multiple": 1, "allow_repeats_in_step": True}
            ],
        }
    )  # fmt: skip


def test_loader_serves_imported_samples_and_the_corrupt_member_never_reaches_torch_load(
    data: Dataset, catalog: VidlakeCatalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loader.dataset import SnapshotDataset
    from manifests.registry import Registry
    from materializer.cut import cut_snapshot

    import_tar_shards(catalog, data.root)
    record = cut_snapshot(catalog, Registry(catalog.objects), _recipe(steps=8))
    loaded: list[str] = []
    real_load = torch.load

    def spy(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, io.BytesIO):
            loaded.append(hashlib.sha256(f.getvalue()).hexdigest())
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    meta = _metadata(catalog)
    corrupt_clip = meta[str(data.corrupt_id)]["clip_id"]
    ds = SnapshotDataset(
        catalog.objects.url,
        record.version,
        cache_dir=tmp_path / "cache",
        cache_budget_bytes=64 << 20,
        prefetch_steps=0,
        prefetch_threads=1,
        on_corrupt="fail",  # the skip policy: tests/loader/test_corrupt.py
    )
    seen, failure = [], None
    with ds:
        for step in range(ds.plan.num_steps):
            ds.seek(step)
            try:
                batch = next(iter(ds))
            except ChecksumMismatch as exc:
                failure = exc
                continue
            seen.extend(batch["clip_ids"])
            assert batch["latent"].dtype == torch.bfloat16
            assert batch["latent"].shape[1] == 16
    assert seen and corrupt_clip not in seen
    assert failure is not None and failure.details["sha256"] == data.corrupt_sha256  # named
    assert data.corrupt_sha256 not in loaded
    assert set(loaded) <= set(data.member_sha.values())
    assert pc.count_distinct(catalog.scan("latents")["clip_id"]).as_py() >= len(set(seen))


def test_options_fill_what_sidecars_lack(tmp_path: Path, catalog: VidlakeCatalog) -> None:
    ds = make_dataset(tmp_path / "ds2", per_shard=1, corrupt=False)
    for path in sorted(ds.root.glob("*.tar")):
        if path.name == ds.stray:
            continue
        raw = bytearray(path.read_bytes())
        # Blank the sidecar's rung/tokenizer keys: rename them in place (same length).
        raw = bytearray(
            bytes(raw)
            .replace(b'"rung"', b'"rxng"')
            .replace(b'"tokenizer_version"', b'"tokenizer_vxrsion"')
        )
        path.write_bytes(bytes(raw))
        doc = json.loads((ds.root / "manifest.json").read_text())
        for shard in doc["shards"]:
            if shard["path"] == path.name:
                shard["sha256"] = hashlib.sha256(raw).hexdigest()
        (ds.root / "manifest.json").write_text(json.dumps(doc))
    import_tar_shards(catalog, ds.root, options=ImportOptions(rung="64p", tokenizer_version="t9"))
    lat = catalog.scan("latents", include_eval=True).to_pylist()
    assert lat and {r["rung"] for r in lat} == {"64p"}
    assert {r["tokenizer_version"] for r in lat} == {"t9"}


def test_whole_shard_fetch_through_the_loader_checks_the_full_sha256(
    data: Dataset, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    from loader.source import StoreSource

    import_tar_shards(catalog, data.root)
    src = StoreSource(catalog.objects)
    good = data.shard_sha["train-000001.tar"]
    out = tmp_path / "fetched"
    out.mkdir()
    src.fetch_object(good, out / "good.tar")
    assert (out / "good.tar").read_bytes() == (data.root / "train-000001.tar").read_bytes()
    rotten = data.shard_sha["train-000000.tar"]
    with pytest.raises(ChecksumMismatch):
        src.fetch_object(rotten, out / "rotten.tar")
    assert sorted(p.name for p in out.iterdir()) == ["good.tar"]  # no temp left
    assert list_failed(catalog.objects) == [rotten]
    assert quarantine_failed(catalog) == {rotten: 4}
