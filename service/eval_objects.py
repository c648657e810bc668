"""Which stored objects are eval material: the index behind ``GET /v1/objects``.

An object is **eval-only** when at least one catalog row references it and every
row that does belongs to an eval clip: ``latents.object_sha256`` and
``captions.text_embedding_sha256`` of clips whose ``split`` is ``eval`` (a clip's
split is its asset's, fixed at ingest). A caller without the ``eval`` scope gets
the 404 a missing object gets, so that existence is not disclosed either.

Objects no row references keep being served to every ``read`` caller: snapshot
artifacts (a training cut never holds eval material), adopted TAR shards before
their latents land, and objects uploaded before their rows. An object shared by a
train row and an eval row is served (the train row needs it); a packed object that
mixes train and eval members therefore exposes the eval members' bytes, which is
why producers pack eval and train clips into separate objects.

The index is computed by the server from the catalog at the state a request reads
(never from what a caller names) and cached under the snapshot ids of the three
tables it reads (``clips``, ``latents``, ``captions``): it is rebuilt when any of
them changes, and a lookup is a set membership test.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from catalog.table_names import EvalKey, eval_key

if TYPE_CHECKING:
    from service.sql import CatalogViews

__all__ = ["REFERENCES", "EvalObjects"]

#: (table, object column): every catalog column that names a stored object.
REFERENCES = (("latents", "object_sha256"), ("captions", "text_embedding_sha256"))


def _owner(table: str) -> EvalKey:
    ek = eval_key(table)
    assert ek is not None  # a table that names objects holds material
    return ek


#: Whose ``split`` decides each referencing table's rows (catalog.table_names' policy).
_OWNERS = {table: _owner(table) for table, _ in REFERENCES}
_TABLES = (*sorted({ek.owner for ek in _OWNERS.values()}), *(table for table, _ in REFERENCES))

Key = tuple[int | None, ...]


class EvalObjects:
    """The eval-only object SHA-256s at a catalog state, cached per state.

    Args:
        views: Datasets of the catalog's tables at a pin (eval rows included).
    """

    def __init__(self, views: CatalogViews) -> None:
        self._views = views
        self._lock = threading.Lock()
        self._cached: tuple[Key, frozenset[str]] | None = None

    @staticmethod
    def key(pin: Mapping[str, int | None]) -> Key:
        """The snapshot ids the index at ``pin`` depends on."""
        return tuple(pin.get(table) for table in _TABLES)

    def hidden(self, sha256: str, pin: Mapping[str, int | None]) -> bool:
        """Whether ``sha256`` is eval-only at ``pin``."""
        return sha256 in self.at(pin)

    def at(self, pin: Mapping[str, int | None]) -> frozenset[str]:
        """The eval-only SHA-256s at ``pin`` (built once per state)."""
        key = self.key(pin)
        with self._lock:  # one build per state, however many requests wait for it
            cached = self._cached
            if cached is not None and cached[0] == key:
                return cached[1]
            built = self._build(pin)
            self._cached = (key, built)
            return built

    def _build(self, pin: Mapping[str, int | None]) -> frozenset[str]:
        eval_ids = {
            ek.owner: self._views.eval_ids(ek.owner, ek.key, pin.get(ek.owner))
            for ek in _OWNERS.values()
        }
        if not any(len(ids) for ids in eval_ids.values()):
            return frozenset()
        shas, is_eval = [], []
        for table, column in REFERENCES:
            ek = _OWNERS[table]
            refs = self._views.dataset(table, pin, include_eval=True).to_table(
                columns=[ek.key, column], filter=pc.field(column).is_valid()
            )
            shas.append(refs.column(column).combine_chunks().cast(pa.large_string()))
            is_eval.append(pc.is_in(refs.column(ek.key), value_set=eval_ids[ek.owner]))
        sha = pa.concat_arrays(shas)
        evals = pa.concat_arrays([m.combine_chunks() for m in is_eval])
        in_eval = pc.unique(pc.filter(sha, evals))
        in_train = pc.unique(pc.filter(sha, pc.invert(evals)))
        only = pc.filter(in_eval, pc.invert(pc.is_in(in_eval, value_set=in_train)))
        return frozenset(only.to_pylist())
