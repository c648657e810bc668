"""The frozen reference slice: a pure, seeded function of asset ids and frozen settings."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from catalog import rules
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import Conflict
from catalog.reference import (
    DEFAULT_REFERENCE_FRACTION,
    PROP_REFERENCE_FRACTION,
    PROP_REFERENCE_SALT,
    derive_salt,
    in_reference_slice,
)

SALT = "ab" * 32


def _ids(n: int) -> list[str]:
    return [hashlib.sha256(f"asset-{i}".encode()).hexdigest() for i in range(n)]


def _config(tmp_path: Path, **over: object) -> CatalogConfig:
    base = tmp_path / "lake"
    fields: dict[str, object] = {
        "uri": f"sqlite:///{base}/catalog.db",
        "warehouse": str(base / "warehouse"),
        "objects": str(base / "objects"),
        "lance": str(base / "lance"),
        "eval_salt": SALT,
    }
    fields.update(over)
    return CatalogConfig.model_validate(fields)


def test_slice_is_the_fraction_of_train_assets_and_never_eval() -> None:
    ids = _ids(20_000)
    ref = derive_salt(SALT)
    found = in_reference_slice(ids, salt=ref, fraction=0.05, eval_salt=SALT, eval_fraction=0.2)
    is_eval = rules.eval_mask(ids, SALT, 0.2)
    assert not (found & is_eval).any()
    # 5 % of the 80 % that are train: 800 expected, binomial sd ~ 27.
    assert 650 < int(found.sum()) < 950
    again = in_reference_slice(
        ids[::-1], salt=ref, fraction=0.05, eval_salt=SALT, eval_fraction=0.2
    )
    assert np.array_equal(again[::-1], found)  # per id, not per position


def test_slice_is_independent_of_the_eval_split() -> None:
    ids = _ids(20_000)
    ref = derive_salt(SALT)
    raw = rules.eval_mask(ids, ref, 0.5)
    is_eval = rules.eval_mask(ids, SALT, 0.5)
    # Independent hashes: about a quarter of ids in both (sd ~ 61).
    assert 4700 < int((raw & is_eval).sum()) < 5300


def test_new_catalog_freezes_the_settings(tmp_path: Path) -> None:
    with VidlakeCatalog.open(_config(tmp_path, reference_fraction=0.25)) as cat:
        props = cat.namespace_properties()
        assert float(props[PROP_REFERENCE_FRACTION]) == 0.25
        assert props[PROP_REFERENCE_SALT] == derive_salt(SALT)
        first = cat.reference
    with VidlakeCatalog.open(_config(tmp_path)) as cat:  # None: the frozen value
        assert cat.reference == first
        ids = _ids(500)
        assert np.array_equal(cat.reference.contains(ids), first.contains(ids))


def test_other_fraction_is_a_conflict_and_changes_nothing(tmp_path: Path) -> None:
    VidlakeCatalog.open(_config(tmp_path)).close()
    with pytest.raises(Conflict, match=r"reference_fraction 0\.5 differs"):
        VidlakeCatalog.open(_config(tmp_path, reference_fraction=0.5))
    with VidlakeCatalog.open(_config(tmp_path)) as cat:
        assert cat.reference.fraction == DEFAULT_REFERENCE_FRACTION


def test_old_catalog_gets_the_slice_frozen_on_first_open(catalog_config: CatalogConfig) -> None:
    config = catalog_config.model_copy(update={"eval_salt": SALT})
    with VidlakeCatalog.open(config) as cat:
        # A catalog created before the slice existed: no reference properties.
        cat.iceberg.update_namespace_properties(
            cat.config.namespace, removals={PROP_REFERENCE_FRACTION, PROP_REFERENCE_SALT}
        )
        assert PROP_REFERENCE_SALT not in cat.namespace_properties()
    with VidlakeCatalog.open(config) as cat:
        props = cat.namespace_properties()
        assert float(props[PROP_REFERENCE_FRACTION]) == DEFAULT_REFERENCE_FRACTION
        assert props[PROP_REFERENCE_SALT] == derive_salt(SALT)  # the same in every process
        assert cat.reference.salt == derive_salt(SALT)
