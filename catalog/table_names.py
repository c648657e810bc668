"""The catalog's table names and its one eval policy: which rows of each table are eval.

Declared here without pyiceberg so that light processes (the SQL sandbox's workers,
the CLI's help) can import them; :mod:`catalog.tables` declares each table's schema
under these names and refuses to import if the two disagree.

The eval policy: an asset's ``split`` is decided once, at ingest (the carve-out of
:func:`catalog.rules.eval_mask`), and copied to its clips. Every other table reaches
eval through the id it is keyed by:

============ ========== ===========================================================
table        eval key   its rows are eval when
============ ========== ===========================================================
assets       asset_id   its own ``split`` is eval
clips        clip_id    its own ``split`` is eval
latents,     clip_id    the clip they belong to is eval
scores,
captions
tombstones,  asset_id   the asset they name is eval
asset_events
jobs         (none)     never: jobs describe curation runs, not material
============ ========== ===========================================================

The catalog's pinned reads (:mod:`catalog.reads`), the service's SQL views and its
eval-object index read this table; none of them spells the rule out again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from catalog.errors import NotFound

__all__ = [
    "EVAL_KEYS",
    "EVAL_SPLIT",
    "INGEST_ORDER",
    "SPLIT_COLUMN",
    "TABLE_NAMES",
    "TRAIN_SPLIT",
    "EvalKey",
    "eval_key",
]

TABLE_NAMES: tuple[str, ...] = (
    "assets",
    "asset_events",
    "tombstones",
    "clips",
    "latents",
    "scores",
    "captions",
    "jobs",
)
#: The tables in the order a producer fills them: each row references only rows of
#: tables before it (a clip its asset, a latent its clip).
INGEST_ORDER: tuple[str, ...] = (
    "assets",
    "clips",
    "latents",
    "scores",
    "captions",
    "tombstones",
    "asset_events",
    "jobs",
)
if sorted(INGEST_ORDER) != sorted(TABLE_NAMES):
    raise ImportError("INGEST_ORDER must order exactly the TABLE_NAMES")
SPLIT_COLUMN = "split"
EVAL_SPLIT = "eval"
TRAIN_SPLIT = "train"


@dataclass(frozen=True)
class EvalKey:
    """How the eval rows of a table are found.

    Attributes:
        owner: The table whose ``split`` decides (``assets`` or ``clips``).
        key: The id column, in both tables, that names the owner's row.
    """

    owner: str
    key: str

    def carries_split(self, table: str) -> bool:
        """Whether ``table``'s rows hold the ``split`` column themselves."""
        return self.owner == table


_BY_ASSET = EvalKey("assets", "asset_id")
_BY_CLIP = EvalKey("clips", "clip_id")

#: Table -> how its eval rows are found (None: the table holds no eval material).
EVAL_KEYS: Mapping[str, EvalKey | None] = {
    "assets": _BY_ASSET,
    "asset_events": _BY_ASSET,
    "tombstones": _BY_ASSET,
    "clips": _BY_CLIP,
    "latents": _BY_CLIP,
    "scores": _BY_CLIP,
    "captions": _BY_CLIP,
    "jobs": None,
}


def eval_key(table: str) -> EvalKey | None:
    """How ``table``'s eval rows are found (None: it holds none).

    Raises:
        NotFound: ``table`` is not a catalog table.
    """
    if table not in EVAL_KEYS:
        raise NotFound(f"no table {table!r}; tables: {', '.join(TABLE_NAMES)}", table=table)
    return EVAL_KEYS[table]
