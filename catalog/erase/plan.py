"""What an erasure removes: derived once from the catalog, recorded before anything changes.

:func:`build_plan` reads the catalog (eval rows included) and returns the plan that
``plan.json`` records:

* ``clip_ids``: the asset's clips; every row keyed by one of them goes (latents, scores,
  captions), and so do its clips and assets rows.
* ``objects``: every latent object its rows name, by fate. ``owned``: only the asset's
  rows reference it, so it is deleted. ``packs``: other assets' members share it, so it
  is rewritten without the erased members and the survivors are repointed. ``adopted``:
  an external reference (a TAR shard adopted by reference, :mod:`catalog.objects.refs`);
  the bytes are the publisher's and cannot be erased by us. ``absent``: already gone.
* ``text_embeddings``: the caption embedding objects; ``owned`` ones are deleted,
  ``shared`` ones (also named by another asset's caption) stay.

Only ids, SHA-256s and counts are recorded: the plan holds no erased payload.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from catalog.catalog import VidlakeCatalog
from catalog.erase.records import eq, isin
from catalog.errors import InvalidInput, NotFound
from catalog.hashing import is_sha256
from catalog.objects.refs import get_ref

__all__ = ["build_plan", "require_hard_tombstone"]


def require_hard_tombstone(catalog: VidlakeCatalog, asset_id: str) -> None:
    """An erase is irreversible: it needs a recorded hard takedown of the asset first.

    Raises:
        InvalidInput: ``asset_id`` is not a SHA-256 hex id, or it has no hard tombstone.
    """
    if not is_sha256(asset_id):
        raise InvalidInput(f"asset id must be 64 lowercase hex, got {asset_id!r}", field="asset_id")
    tombs = catalog.scan(
        "tombstones", columns=["kind"], row_filter=eq("asset_id", asset_id), include_eval=True
    )
    if "hard" not in tombs["kind"].to_pylist():
        raise InvalidInput(
            f"asset {asset_id} has no hard tombstone; record one first "
            "(vidlake tombstone ASSET --kind hard --reason ...)",
            field="asset_id",
            asset_id=asset_id,
        )


def build_plan(catalog: VidlakeCatalog, asset_id: str, eid: str) -> dict[str, Any]:
    """The plan of erasing ``asset_id`` (see the module docstring).

    Raises:
        NotFound: the catalog holds no row of the asset (nothing to erase).
    """
    assets = catalog.scan(
        "assets", columns=["asset_id"], row_filter=eq("asset_id", asset_id), include_eval=True
    )
    clips = catalog.scan(
        "clips", columns=["clip_id"], row_filter=eq("asset_id", asset_id), include_eval=True
    )
    clip_ids = sorted(set(clips["clip_id"].to_pylist()))
    if not assets.num_rows and not clip_ids:
        raise NotFound(f"the catalog holds no rows of asset {asset_id}", asset_id=asset_id)
    return {
        "erasure_id": eid,
        "asset_id": asset_id,
        "clip_ids": clip_ids,
        "objects": _latent_objects(catalog, clip_ids),
        "text_embeddings": _text_embeddings(catalog, clip_ids),
    }


def _rows_of(
    catalog: VidlakeCatalog, table: str, key: str, values: list[str], column: str
) -> pa.Table:
    """``clip_id`` and ``column`` of the rows whose ``key`` is one of ``values``."""
    if not values:
        return pa.table({"clip_id": pa.array([], pa.string()), column: pa.array([], pa.string())})
    return catalog.scan(
        table, columns=["clip_id", column], row_filter=isin(key, values), include_eval=True
    )


def _shared(rows: pa.Table, column: str, clip_ids: list[str]) -> set[str]:
    """Values of ``column`` that some row outside ``clip_ids`` names too."""
    others = rows.filter(pc.invert(pc.is_in(rows["clip_id"], pa.array(clip_ids, pa.string()))))
    return {v for v in others[column].to_pylist() if v is not None}


def _latent_objects(catalog: VidlakeCatalog, clip_ids: list[str]) -> dict[str, list[str]]:
    col = "object_sha256"
    mine = _rows_of(catalog, "latents", "clip_id", clip_ids, col)
    shas = sorted(set(mine[col].to_pylist()))
    shared = _shared(_rows_of(catalog, "latents", col, shas, col), col, clip_ids)
    fate: dict[str, list[str]] = {"owned": [], "packs": [], "adopted": [], "absent": []}
    store = catalog.objects
    for sha in shas:
        if store.head(sha) is None:
            fate["adopted" if get_ref(store, sha) is not None else "absent"].append(sha)
        else:
            fate["packs" if sha in shared else "owned"].append(sha)
    return fate


def _text_embeddings(catalog: VidlakeCatalog, clip_ids: list[str]) -> dict[str, list[str]]:
    col = "text_embedding_sha256"
    mine = _rows_of(catalog, "captions", "clip_id", clip_ids, col)
    shas = sorted({s for s in mine[col].to_pylist() if s is not None})
    shared = _shared(_rows_of(catalog, "captions", col, shas, col), col, clip_ids)
    return {
        "owned": [s for s in shas if s not in shared],
        "shared": [s for s in shas if s in shared],
    }
