"""A publisher's TAR-shard cache imported unchanged (issue 18 items 1-4): its manifest as
published, its match-id split as vidlake's eval carve-out, frames and tokens from a 5-D
latent's header, and every tensor a member holds delivered (or the recipe's choice)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput, InvalidRecipe
from interop.sources import RangeSource
from interop.tar_import import import_tar_shards
from tests.interop._publisher import (
    FRAMES,
    LATENT_HW,
    MODEL_REVISIONS,
    SCHEMA,
    SHARDS,
    TENSORS,
    PublishedCache,
    write_published_cache,
)

SALT = "cd" * 16


@pytest.fixture()
def cache(tmp_path: Path) -> PublishedCache:
    return write_published_cache(tmp_path / "cache")


@pytest.fixture()
def catalog(tmp_path: Path) -> VidlakeCatalog:
    config = CatalogConfig.embedded(tmp_path / "lake", eval_salt=SALT, eval_fraction=0.0)
    return VidlakeCatalog.open(config)


def _meta(catalog: VidlakeCatalog) -> dict[str, dict[str, Any]]:
    clips = catalog.scan("clips", columns=["clip_id", "metadata", "split"], include_eval=True)
    out = {}
    for row in clips.to_pylist():
        meta = json.loads(row["metadata"])
        out[meta["sample_id"]] = {**meta, "clip_id": row["clip_id"], "clip_split": row["split"]}
    return out


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _recipe(**extra: Any) -> Any:
    from materializer.recipe import Recipe

    return Recipe.model_validate(
        {
            "name": "publisher",
            "seed": 5,
            "tokenizer_version": MODEL_REVISIONS["vae"],
            "streams": [{"name": "all", "where": "source_tier = 'crawl'"}],
            "captions": {"version": "import", "kinds": ["dense"]},
            "buckets": {"latent_frames": [FRAMES], "aspect_ratios": ["1:1"]},
            "phases": [
                {"name": "p", "rung": "256p", "weights": {"all": 1.0}, "steps": 6,
                 "global_batch": 2, "rank_multiple": 1, "allow_repeats_in_step": True}
            ],
            **extra,
        }
    )  # fmt: skip


# -- item 1: the manifest as published ---------------------------------------------------
def test_publisher_manifest_imports_unchanged(
    cache: PublishedCache, catalog: VidlakeCatalog
) -> None:
    before = _tree(cache.root)
    src = RangeSource(cache.root)
    report = import_tar_shards(catalog, src)
    assert _tree(cache.root) == before  # nothing of the publisher's is rewritten
    assert report.revision == "v000002"
    wanted = [s for s in cache.sample_ids if s not in cache.excluded]
    assert report.imported == len(wanted) and report.excluded == len(cache.excluded)
    assert cache.stray not in src.names_read  # the unlisted TAR is never opened
    meta = _meta(catalog)
    assert sorted(meta) == sorted(wanted)  # sample ids from the TAR headers
    lat = {r["clip_id"]: r for r in catalog.scan("latents", include_eval=True).to_pylist()}
    for sid, m in meta.items():
        row = lat[m["clip_id"]]
        # Hashes from both sidecar forms (top level on worker 00, nested on worker 01).
        assert row["member_sha256"] == cache.member_sha[sid]
        raw = (cache.root / m["shard"]).read_bytes()[row["offset"] : row["offset"] + row["length"]]
        assert hashlib.sha256(raw).hexdigest() == cache.member_sha[sid]
        # The per-shard revision pins the shard each sample was read from.
        assert m["shard_revision"] == f"v{SHARDS.index(m['shard']) + 1:06d}"
        assert m["shard_sha256"] == cache.shard_sha[m["shard"]]


def test_first_version_then_current_adds_only_the_new_shard(
    cache: PublishedCache, catalog: VidlakeCatalog
) -> None:
    first = import_tar_shards(catalog, cache.root, revision=1)
    assert first.imported == len(cache.v1_ids)
    second = import_tar_shards(catalog, cache.root)
    new = [s for s in cache.sample_ids if s not in cache.v1_ids and s not in cache.excluded]
    assert second.imported == len(new) and second.duplicates == len(cache.v1_ids)


def test_a_sample_stored_in_two_shards_is_refused(
    cache: PublishedCache, catalog: VidlakeCatalog
) -> None:
    doc = json.loads((cache.root / "manifest.json").read_text())
    doc["shards"].append({**doc["shards"][0], "path": "shards/copy.tar"})
    (cache.root / "shards" / "copy.tar").write_bytes((cache.root / SHARDS[0]).read_bytes())
    (cache.root / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(InvalidInput, match="stored in both"):
        import_tar_shards(catalog, cache.root)
    assert catalog.scan("latents", include_eval=True).num_rows == 0


# -- item 2: the publisher's split is vidlake's eval carve-out -------------------------------
def test_val_match_is_eval_and_never_in_a_training_snapshot(
    cache: PublishedCache, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    """Regression (issue 18 item 2): every sample was imported as train and the val
    match was served to training."""
    from materializer.cut import build_artifacts

    assert cache.val_ids  # the fixture holds a val match
    report = import_tar_shards(catalog, cache.root)
    assert report.eval == len(cache.val_ids)
    meta = _meta(catalog)
    for sid, m in meta.items():
        val = sid in cache.val_ids
        assert m["split"] == ("val" if val else "train")
        assert m["clip_split"] == ("eval" if val else "train")
    assert catalog.scan("clips").num_rows == len(meta) - len(cache.val_ids)  # sealed
    (tmp_path / "cut").mkdir()
    artifacts, _ = build_artifacts(catalog, _recipe(), tmp_path / "cut")
    with pa.memory_map(str(artifacts["index.arrow"])) as f:
        served = set(pa.ipc.open_file(f).read_all()["clip_id"].to_pylist())
    val_clips = {meta[s]["clip_id"] for s in cache.val_ids}
    assert served and not served & val_clips


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"key": "match_id", "val_fraction": 0.02}, "not a rule vidlake can apply"),
        ({"key": "match_id", "method": "xxhash_mod", "modulus": 100, "val_below": 2}, "xxhash"),
        ({"key": "match_id", "method": "sha256_mod", "modulus": 0, "val_below": 2}, "modulus"),
        ({"key": "series_id", "method": "sha256_mod", "modulus": 100, "val_below": 2}, "series_id"),
        ("by match", "must be an object"),
    ],
)
def test_a_split_rule_the_importer_cannot_apply_is_an_error(
    cache: PublishedCache, catalog: VidlakeCatalog, rule: Any, message: str
) -> None:
    doc = json.loads((cache.root / "manifest.json").read_text())
    doc["split"] = rule
    (cache.root / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(InvalidInput, match=message):
        import_tar_shards(catalog, cache.root)
    assert catalog.scan("latents", include_eval=True).num_rows == 0  # nothing written


def test_a_list_rule_names_the_val_matches(cache: PublishedCache, catalog: VidlakeCatalog) -> None:
    doc = json.loads((cache.root / "manifest.json").read_text())
    chosen = cache.match_of[cache.sample_ids[-2]]
    doc["split"] = {"key": "match_id", "method": "list", "val": [chosen]}
    (cache.root / "manifest.json").write_text(json.dumps(doc))
    import_tar_shards(catalog, cache.root)
    evals = {s for s, m in _meta(catalog).items() if m["clip_split"] == "eval"}
    assert evals == {s for s in cache.sample_ids if cache.match_of[s] == chosen} - set(
        cache.excluded
    )


def test_schema_and_model_revisions_are_recorded_and_checked_by_the_recipe(
    cache: PublishedCache, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    from materializer.cut import build_artifacts

    import_tar_shards(catalog, cache.root)
    for m in _meta(catalog).values():
        assert m["schema"] == SCHEMA and m["model_revisions"] == MODEL_REVISIONS
    lat = catalog.scan("latents", include_eval=True)
    assert set(lat["tokenizer_version"].to_pylist()) == {MODEL_REVISIONS["vae"]}
    # A recipe made for another VAE revision is refused: its latents are not these.
    (tmp_path / "cut").mkdir()
    with pytest.raises(InvalidRecipe, match="tokenizer"):
        build_artifacts(catalog, _recipe(tokenizer_version="wan21-vae@0000"), tmp_path / "cut")


# -- item 3: frames and tokens of a 5-D latent without latent_frames -------------------------
def test_5d_latent_without_latent_frames_gets_frames_and_tokens_from_its_header(
    cache: PublishedCache, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    from materializer.cut import build_artifacts

    import_tar_shards(catalog, cache.root)
    lat = catalog.scan("latents", include_eval=True).to_pylist()
    assert {r["latent_frames"] for r in lat} == {FRAMES}
    assert {r["tokens"] for r in lat} == {FRAMES * LATENT_HW[0] * LATENT_HW[1]}
    (tmp_path / "cut").mkdir()
    _, snap = build_artifacts(catalog, _recipe(), tmp_path / "cut")
    assert snap["counts"]["clips"] == len(cache.sample_ids) - len(cache.excluded) - len(
        cache.val_ids
    )


def _legacy_pt(root: Path, **declare: Any) -> None:
    """Rewrite worker 00's shard with legacy (non-zip) pickles: no readable header;
    ``declare`` adds fields to its sidecars."""
    import tarfile

    path = root / SHARDS[0]
    members = []
    with tarfile.open(path) as tar:
        for info in tar.getmembers():
            data = tar.extractfile(info).read()  # type: ignore[union-attr]
            if info.name.endswith(".pt"):
                obj = torch.load(io.BytesIO(data), weights_only=True)
                buf = io.BytesIO()
                torch.save(obj, buf, _use_new_zipfile_serialization=False)
                data = buf.getvalue()
                sid = info.name[:-3]
                side_name = f"{sid}.json"
                members.append((info.name, data, side_name))
            else:
                side = json.loads(data)
                side["sha256"] = hashlib.sha256(members[-1][1]).hexdigest()
                side.update(declare)
                members.append((info.name, json.dumps(side).encode(), ""))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data, _ in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    path.write_bytes(raw)
    for manifest in [root / "manifest.json", *sorted((root / "manifests").iterdir())]:
        doc = json.loads(manifest.read_text())
        for shard in doc["shards"]:
            if shard["path"] == SHARDS[0]:
                shard.update(size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
        manifest.write_text(json.dumps(doc))


def test_a_latent_whose_frames_cannot_be_known_is_refused_naming_the_field(
    cache: PublishedCache, catalog: VidlakeCatalog
) -> None:
    _legacy_pt(cache.root)
    with pytest.raises(InvalidInput, match="latent_frames") as info:
        import_tar_shards(catalog, cache.root)
    assert info.value.details["missing"] == "latent_frames"
    assert catalog.scan("latents", include_eval=True).num_rows == 0


def test_a_declared_5d_shape_gives_frames_and_tokens_without_a_header(
    cache: PublishedCache, catalog: VidlakeCatalog
) -> None:
    _legacy_pt(cache.root, shape=[1, 16, FRAMES, *LATENT_HW], dtype="float32")
    import_tar_shards(catalog, cache.root)
    lat = catalog.scan("latents", include_eval=True).to_pylist()
    legacy = [r for r in lat if r["tensor_keys"] == ["latent"]]
    assert len(legacy) == 6  # worker 00's samples: only what the sidecar declares
    assert {(r["latent_frames"], r["tokens"]) for r in legacy} == {
        (FRAMES, FRAMES * LATENT_HW[0] * LATENT_HW[1])
    }


def test_a_cut_names_latents_without_frames_as_a_drop_reason(
    cache: PublishedCache, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    """Latents ingested with null frames (older imports) are dropped by name, not
    silently: the cut reports ``no_latent_frames`` (and no numpy cast warning)."""
    import warnings

    from materializer.cut import build_artifacts

    import_tar_shards(catalog, cache.root)
    lat = catalog.scan("latents").to_pylist()  # a training sample's latent
    row = {**lat[0], "latent_frames": None, "rung": "512p"}
    catalog.add_latents([{k: v for k, v in row.items() if k != "created_at"}])
    recipe = _recipe()
    phases = [{**recipe.phases[0].model_dump(mode="json"), "rung": "512p"}]
    (tmp_path / "cut").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(InvalidInput, match="no_latent_frames 1") as info:
            build_artifacts(catalog, _recipe(phases=phases), tmp_path / "cut")
    assert info.value.details["drops"]["no_latent_frames"] == 1


# -- item 4: every tensor a member holds, or the recipe's choice ------------------------------
def _batches(catalog: VidlakeCatalog, recipe: Any, tmp_path: Path) -> list[dict[str, Any]]:
    from loader.dataset import SnapshotDataset
    from manifests.registry import Registry
    from materializer.cut import cut_snapshot

    record = cut_snapshot(catalog, Registry(catalog.objects), recipe)
    ds = SnapshotDataset(
        catalog.objects.url,
        record.version,
        cache_dir=tmp_path / f"cache-{record.version}",
        cache_budget_bytes=64 << 20,
        prefetch_steps=0,
        prefetch_threads=1,
    )
    with ds:
        return list(iter(ds))


def test_every_tensor_is_recorded_and_delivered_with_its_shape_and_dtype(
    cache: PublishedCache, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    import_tar_shards(catalog, cache.root)
    for row in catalog.scan("latents", include_eval=True).to_pylist():
        assert row["tensor_keys"] == list(TENSORS)
        assert row["shapes"] == [list(shape) for shape, _ in TENSORS.values()]
        assert row["dtypes"] == [str(dtype).removeprefix("torch.") for _, dtype in TENSORS.values()]
    by_clip = {m["clip_id"]: sid for sid, m in _meta(catalog).items()}
    batches = _batches(catalog, _recipe(), tmp_path)
    assert batches
    for batch in batches:
        for key, (shape, dtype) in TENSORS.items():
            assert batch[key].dtype == dtype
            assert tuple(batch[key].shape) == (len(batch["clip_ids"]), *shape)
        for i, clip in enumerate(batch["clip_ids"]):
            for key in TENSORS:
                assert torch.equal(batch[key][i], cache.tensors[by_clip[clip]][key])


def test_a_recipe_selects_which_tensors_to_deliver(
    cache: PublishedCache, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    import_tar_shards(catalog, cache.root)
    batches = _batches(catalog, _recipe(tensor_keys=["latent", "text_emb"]), tmp_path)
    assert batches
    for batch in batches:
        assert "latent" in batch and "text_emb" in batch
        assert "state" not in batch and "interaction" not in batch
        assert batch["text_emb"].dtype == torch.bfloat16


def test_samples_lacking_a_requested_tensor_are_dropped_by_name(
    cache: PublishedCache, catalog: VidlakeCatalog, tmp_path: Path
) -> None:
    from materializer.cut import build_artifacts

    import_tar_shards(catalog, cache.root)
    (tmp_path / "cut").mkdir()
    with pytest.raises(InvalidInput, match="missing_tensor_keys 9") as info:
        build_artifacts(catalog, _recipe(tensor_keys=["latent", "i2v_y"]), tmp_path / "cut")
    assert info.value.details["drops"]["missing_tensor_keys"] == 9


def test_recipe_tensor_keys_are_checked_and_leave_older_recipe_hashes_alone() -> None:
    from materializer.recipe import load_recipe

    base = _recipe().model_dump(mode="json", exclude={"tensor_keys"})
    for bad in (["latent", "latent"], [], ["no spaces"]):
        with pytest.raises(InvalidRecipe, match="tensor_keys"):
            load_recipe({**base, "tensor_keys": bad})
    plain = _recipe()
    assert "tensor_keys" not in json.loads(plain.to_canonical_json())
    assert plain.sha256() != _recipe(tensor_keys=["latent"]).sha256()


def _edit_manifest(cache: PublishedCache, edit: Any) -> None:
    doc = json.loads((cache.root / "manifest.json").read_text())
    edit(doc)
    (cache.root / "manifest.json").write_text(json.dumps(doc))


def test_a_shard_holding_other_than_its_num_samples_is_refused(
    cache: PublishedCache, catalog: VidlakeCatalog
) -> None:
    _edit_manifest(cache, lambda doc: doc["shards"][1].update(num_samples=7))
    with pytest.raises(InvalidInput, match="says 7 samples, the shard holds 6"):
        import_tar_shards(catalog, cache.root)
    assert catalog.scan("latents", include_eval=True).num_rows == 0


def test_a_sidecar_naming_another_sample_is_refused(
    cache: PublishedCache, catalog: VidlakeCatalog
) -> None:
    import tarfile

    path = cache.root / SHARDS[0]
    raw = path.read_bytes()
    first, second = cache.sample_ids[0], cache.sample_ids[1]
    with tarfile.open(path) as tar:
        info = tar.getmember(f"{first}.json")
        body = raw[info.offset_data : info.offset_data + info.size]
    swapped = body.replace(f'"sample_id": "{first}"'.encode(), f'"sample_id": "{second}"'.encode())
    assert len(swapped) == len(body) and swapped != body
    tampered = raw[: info.offset_data] + swapped + raw[info.offset_data + info.size :]
    # A valid TAR header still: only data bytes changed; the manifest is updated to match.
    path.write_bytes(tampered)
    sha = hashlib.sha256(tampered).hexdigest()
    _edit_manifest(cache, lambda doc: doc["shards"][0].update(sha256=sha))
    with pytest.raises(InvalidInput, match=f"says it is sample '{second}'"):
        import_tar_shards(catalog, cache.root)


def test_cli_imports_the_publisher_cache_and_reports_its_header_reads(
    cache: PublishedCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from service.cli import app
    from service.settings import get_settings

    monkeypatch.setenv("VIDLAKE_HOME", str(tmp_path / "home"))
    # No hash carve-out: with the default 2 % and a random salt, a train sample is
    # sometimes eval too, and the count below would then not be the val split's alone.
    monkeypatch.setenv("VIDLAKE_EVAL_FRACTION", "0")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        res = runner.invoke(app, ["import", "tar-shards", str(cache.root), "--json"])
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        assert report["revision"] == "v000002" and report["eval"] == len(cache.val_ids)
        assert report["imported"] == len(cache.sample_ids) - len(cache.excluded)
        # Two small reads per .pt tensor header, far less than the shards.
        assert 0 < report["header_requests"] <= 2 * report["samples_listed"]
        assert report["header_bytes_read"] < report["shard_bytes"]
        _edit_manifest(cache, lambda doc: doc.update(split={"key": "match_id"}))
        res = runner.invoke(app, ["import", "tar-shards", str(cache.root)])
        assert res.exit_code != 0 and isinstance(res.exception, InvalidInput)
    finally:
        get_settings.cache_clear()
