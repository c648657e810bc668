"""Selection at a pinned catalog state (materializer/select.py): governance drops."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow.compute as pc
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from materializer.recipe import Recipe, load_recipe
from materializer.select import select
from materializer.validate import resolve_pin
from service.demo.corpus import generate_corpus
from tests.fixtures.recipes import small_corpus_demo


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> VidlakeCatalog:
    root: Path = tmp_path_factory.mktemp("lake")
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16))
    generate_corpus(catalog, assets=60, seed=5)
    return catalog


@pytest.fixture()
def recipe() -> Recipe:
    return load_recipe(small_corpus_demo())


def _selected_assets(catalog: VidlakeCatalog, recipe: Recipe) -> set[str]:
    samples = select(catalog, recipe, resolve_pin(catalog, recipe)).samples
    return set(samples["asset_id"].to_pylist())


def test_a_quarantine_tie_resolves_the_same_in_the_catalog_and_the_cut(
    catalog: VidlakeCatalog, recipe: Recipe
) -> None:
    """A quarantined and a released event at the same instant quarantine the asset,
    both in ``asset_status`` (ingest side) and in the cut's selection, whatever order
    the two events were written in."""
    status = catalog.asset_status()
    quiet = status.filter(pc.invert(status["quarantined"]))
    kept = sorted(_selected_assets(catalog, recipe) & set(quiet["asset_id"].to_pylist()))
    first, second = kept[:2]
    at = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
    catalog.add_asset_events(
        [
            {"asset_id": first, "event": "released", "at": at},
            {"asset_id": first, "event": "quarantined", "at": at},
            {"asset_id": second, "event": "quarantined", "at": at},
            {"asset_id": second, "event": "released", "at": at},
        ]
    )
    after = {r["asset_id"]: r["quarantined"] for r in catalog.asset_status().to_pylist()}
    assert (after[first], after[second]) == (True, True)
    selected = _selected_assets(catalog, recipe)
    assert first not in selected and second not in selected
