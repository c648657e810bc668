"""The remapping FileIO of restored tables, under its stable and its legacy path."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest

from catalog.backends import connect
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.fileio import IO_IMPL, LEGACY_IO_IMPL, REMAP_FROM, REMAP_TO, remap_location
from tests.catalog.test_catalog import asset, train_ids


def test_locations_under_the_old_root_move_and_others_pass_through() -> None:
    props = {REMAP_FROM: "file:///old/wh/", REMAP_TO: "file:///new/wh"}
    assert remap_location("file:///old/wh/t/data/a.parquet", props) == (
        "file:///new/wh/t/data/a.parquet"
    )
    assert remap_location("/old/wh/t/m.avro", props) == "/new/wh/t/m.avro"
    assert remap_location("file:///old/whx/a", props) == "file:///old/whx/a"
    assert remap_location("file:///old/wh/a", {}) == "file:///old/wh/a"


@pytest.mark.parametrize("impl", [IO_IMPL, LEGACY_IO_IMPL])
def test_a_table_naming_either_path_opens_and_reads_through_the_new_root(
    tmp_path: Path, impl: str
) -> None:
    """A table registered as a restore registers it (its metadata JSON copied with the
    remap properties; manifests and data files only under the new root) reads, whether
    it names the stable path or the legacy one of tables restored before the move."""
    module, name = impl.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name).__name__ == "RemappedFileIO"
    source = CatalogConfig.embedded(tmp_path / "a", eval_fraction=0.0)
    with VidlakeCatalog.open(source) as cat:
        ids = train_ids(cat, 3)
        cat.add_assets([asset(i, asset_id=a) for i, a in enumerate(ids)])
        meta_location, _ = cat.locations("assets")
        props = cat.namespace_properties()
    old_root, new_root = tmp_path / "a" / "warehouse", tmp_path / "b" / "warehouse"
    shutil.copytree(old_root, new_root)
    shutil.rmtree(old_root)
    rel = Path(meta_location.removeprefix("file://")).relative_to(old_root)
    meta = json.loads((new_root / rel).read_bytes())
    meta["properties"] |= {
        "py-io-impl": impl,
        REMAP_FROM: old_root.as_uri(),
        REMAP_TO: new_root.as_uri(),
    }
    meta["location"] = new_root.as_uri() + meta["location"][len(old_root.as_uri()) :]
    copy = (new_root / rel).with_name("99999-restored.metadata.json")
    copy.write_text(json.dumps(meta))
    target = CatalogConfig.embedded(tmp_path / "b")
    iceberg = connect(target)
    iceberg.create_namespace(target.namespace, props)
    iceberg.register_table((target.namespace, "assets"), copy.as_uri())
    with VidlakeCatalog.open(target) as cat:
        assert type(cat.iceberg_table("assets").io).__name__ == "RemappedFileIO"
        assert sorted(cat.scan("assets")["asset_id"].to_pylist()) == sorted(ids)
