"""The frozen reference slice: a fixed random sample of train assets for drift checks.

A score's distribution moves for two reasons: the filter changed (a new version) or
the data did (upstream shift). Comparing two versions on *the same* clips separates
them, so the catalog keeps a reference slice: the train assets whose salted SHA-256
falls below ``fraction`` (default 0.1 %), decided by the same rule as the eval
carve-out (:func:`catalog.rules.eval_mask`) with a salt of its own. Membership is a
pure function of the asset id and the namespace's frozen settings
(``vidlake.reference-fraction``, ``vidlake.reference-salt``): no column, nothing
recomputed, the same answer in every process for as long as the catalog lives.

The settings are frozen when a catalog is created, and on the first open of a catalog
created before the slice existed. The salt is derived from the frozen eval salt
(so two processes freezing an old catalog at once write the same one) and is
independent of the eval split (a different SHA-256 input). Eval assets are never in
the slice. Scoring fleets must score every slice clip with every filter version
(never filter the slice out): ``vidlake reference-slice`` lists them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pyiceberg.catalog import Catalog

from catalog import rules
from catalog.errors import Conflict

__all__ = [
    "DEFAULT_REFERENCE_FRACTION",
    "PROP_REFERENCE_FRACTION",
    "PROP_REFERENCE_SALT",
    "ReferenceSlice",
    "derive_salt",
    "freeze_reference",
    "in_reference_slice",
]

PROP_REFERENCE_FRACTION = "vidlake.reference-fraction"
PROP_REFERENCE_SALT = "vidlake.reference-salt"
DEFAULT_REFERENCE_FRACTION = 0.001
_SALT_DOMAIN = b"vidlake.reference-slice\x00"

AssetIds: TypeAlias = Sequence[str] | pa.Array | pa.ChunkedArray


def derive_salt(eval_salt: str) -> str:
    """The reference salt of a catalog whose eval salt is ``eval_salt`` (hex)."""
    return hashlib.sha256(_SALT_DOMAIN + bytes.fromhex(eval_salt)).hexdigest()


def in_reference_slice(
    asset_ids: AssetIds,
    *,
    salt: str,
    fraction: float,
    eval_salt: str,
    eval_fraction: float,
) -> NDArray[np.bool_]:
    """Which of ``asset_ids`` (64-hex) are in the reference slice: a train asset (not
    eval by the catalog's carve-out) whose reference hash falls below ``fraction``."""
    hit = rules.eval_mask(asset_ids, salt, fraction)
    if not hit.any():
        return hit
    return hit & ~rules.eval_mask(asset_ids, eval_salt, eval_fraction)


@dataclass(frozen=True)
class ReferenceSlice:
    """A catalog's frozen reference slice settings (with its eval carve-out's)."""

    fraction: float
    salt: str
    eval_fraction: float
    eval_salt: str

    def contains(self, asset_ids: AssetIds) -> NDArray[np.bool_]:
        """Per asset id: in the slice (:func:`in_reference_slice`)."""
        return in_reference_slice(
            asset_ids,
            salt=self.salt,
            fraction=self.fraction,
            eval_salt=self.eval_salt,
            eval_fraction=self.eval_fraction,
        )


def freeze_reference(
    iceberg: Catalog,
    namespace: str,
    eval_fraction: float,
    eval_salt: str,
    fraction: float | None = None,
) -> ReferenceSlice:
    """Read the namespace's frozen reference settings, freezing them first when the
    catalog has none (a new catalog, or one created before the slice existed).

    Args:
        iceberg: The pyiceberg catalog.
        namespace: The vidlake namespace (it exists: :func:`catalog.backends.freeze_namespace`).
        eval_fraction: The frozen eval fraction.
        eval_salt: The frozen eval salt.
        fraction: The fraction asked for; None: the frozen one (0.001 when freezing).

    Raises:
        Conflict: ``fraction`` differs from the frozen fraction.
    """
    props = iceberg.load_namespace_properties(namespace)
    if PROP_REFERENCE_FRACTION not in props or PROP_REFERENCE_SALT not in props:
        chosen = DEFAULT_REFERENCE_FRACTION if fraction is None else fraction
        updates = {
            PROP_REFERENCE_FRACTION: repr(chosen),
            PROP_REFERENCE_SALT: derive_salt(eval_salt),
        }
        iceberg.update_namespace_properties(namespace, updates=updates)
        props = iceberg.load_namespace_properties(namespace)
    frozen = float(props[PROP_REFERENCE_FRACTION])
    if fraction is not None and fraction != frozen:
        raise Conflict(
            f"reference_fraction {fraction} differs from the catalog's frozen {frozen}",
            field="reference_fraction",
            frozen=frozen,
        )
    return ReferenceSlice(frozen, props[PROP_REFERENCE_SALT], eval_fraction, eval_salt)
