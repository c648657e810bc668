"""Clip embeddings in LanceDB: one table per embedding model version.

Each row is ``clip_id, asset_id, split, vector``; vectors are stored L2-normalised, so
cosine distance is ``1 - dot``. The table is keyed by ``clip_id``: adding a clip that
is already there is a duplicate, not a second row (a LanceDB merge-insert, atomic per
batch, so concurrent writers cannot double a row).

Two kinds of reads:

* :meth:`EmbeddingIndex.nearest` asks LanceDB for the k nearest neighbours (a flat,
  exact scan while the table has no vector index).
* :meth:`EmbeddingIndex.pairs_within` answers "every pair within cosine distance d"
  for a set of clips, among themselves (semantic dedup) or against a split
  (decontamination against ``eval``). It is an exact, blocked numpy matrix product
  (:func:`catalog.vectors.pairs_within_vectors`): the query vectors are cut into blocks of
  ``block`` rows and each block is multiplied with the candidate matrix, so memory
  stays at ``O(block^2)`` floats beyond the inputs while time is ``O(n * m * dim)``
  for ``n`` queries and ``m`` candidates (``O(n^2 * dim / 2)`` among themselves).
  That is seconds for 10^4 x 10^4 and minutes for 3 x 10^5 x 3 x 10^5 at dim 768 on
  two cores; callers scale it by partitioning first (SemDeDup clusters, then pairs
  within each cluster) rather than by an approximate index whose misses would let
  eval near-duplicates through.

:class:`EmbeddingIndex` opens its connection lazily and pickles as its address, so
it can be handed to worker processes.

Versions: every LanceDB write makes a new table version. An index built with
``version=N`` reads exactly version ``N`` (``table.checkout``) and refuses writes; a
catalog :class:`~catalog.pins.Pin` records that number for each model a cut reads
(:func:`current_versions`), so a pinned re-cut reads the same vectors however many
embeddings were added since. Each table records its model version in its schema
metadata (``vidlake.model_version``), so :func:`list_models` can name the models a
LanceDB directory holds. Erasing an asset's vectors is :mod:`catalog.erase.vectors`.

Why this module is a little over 500 lines: :class:`EmbeddingIndex` is one class
over one LanceDB table (connection, version, schema checks); the vector math and
the erasure live in their own modules.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog.errors import InvalidBatch, InvalidInput, NotFound, NotInstalled
from catalog.table_names import EVAL_SPLIT, TRAIN_SPLIT
from catalog.vectors import PAIRS_SCHEMA, pairs_within_vectors, unit_rows

__all__ = [
    "SPLITS",
    "AddResult",
    "EmbeddingIndex",
    "connect_lance",
    "current_versions",
    "list_models",
    "table_name_for",
]

SPLITS = (TRAIN_SPLIT, EVAL_SPLIT)
MODEL_METADATA_KEY = b"vidlake.model_version"
_IN_FILTER_MAX = 1024  # above this many ids a scan + is_in beats a giant SQL IN list


@dataclass(frozen=True)
class AddResult:
    """Outcome of :meth:`EmbeddingIndex.add`."""

    inserted: int
    duplicates: int


def table_name_for(model_version: str) -> str:
    """The LanceDB table name for ``model_version``.

    Unsafe characters become ``_``; a hash suffix keeps distinct versions distinct
    (``a/b`` and ``a_b`` must not share a table).
    """
    if not isinstance(model_version, str) or not model_version.strip():
        raise InvalidInput(
            "embedding model version must be a non-empty string", field="model_version"
        )
    safe = re.sub(r"[^A-Za-z0-9_]+", "_", model_version).strip("_")[:64] or "v"
    digest = hashlib.sha256(model_version.encode("utf-8")).hexdigest()[:12]
    return f"emb_{safe}_{digest}"


class EmbeddingIndex:
    """Embeddings of one model version, in one LanceDB table.

    Args:
        uri_or_dir: A LanceDB directory or URI (``s3://…`` works as LanceDB allows).
        model_version: The embedding model version; names the table.
        version: Read exactly this LanceDB table version (a pin's); None reads the
            latest and allows writes.
    """

    def __init__(
        self, uri_or_dir: str | os.PathLike[str], model_version: str, version: int | None = None
    ) -> None:
        if version is not None and (
            isinstance(version, bool) or not isinstance(version, int) or version < 1
        ):
            raise InvalidInput(
                f"a LanceDB table version is an integer >= 1, got {version!r}", field="version"
            )
        self.uri = os.fspath(uri_or_dir)
        self.model_version = model_version
        self.pinned_version = version
        self.table_name = table_name_for(model_version)
        self._db: Any = None
        self._table: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Connections hold native handles; a worker reconnects on first use.
        return {
            "uri": self.uri,
            "model_version": self.model_version,
            "version": self.pinned_version,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.uri = state["uri"]
        self.model_version = state["model_version"]
        self.pinned_version = state.get("version")
        self.table_name = table_name_for(self.model_version)
        self._db = None
        self._table = None

    def __repr__(self) -> str:
        at = "" if self.pinned_version is None else f", version={self.pinned_version}"
        return f"EmbeddingIndex({self.uri!r}, {self.model_version!r}{at})"

    def at(self, version: int | None) -> EmbeddingIndex:
        """The same table read at LanceDB ``version`` (None: the latest)."""
        return EmbeddingIndex(self.uri, self.model_version, version=version)

    @property
    def version(self) -> int | None:
        """The table version this index reads: the pinned one, else the current
        latest (None while the table does not exist)."""
        if self.pinned_version is not None:
            self._open()  # NotFound when that version does not exist
            return self.pinned_version
        table = self._open()
        if table is None:
            return None
        return int(table.version)  # the connection re-reads the latest on every access

    # -- writes -------------------------------------------------------------------

    def add(
        self,
        clip_ids: Sequence[str],
        asset_ids: Sequence[str],
        splits: Sequence[str],
        vectors: NDArray[np.floating[Any]],
    ) -> AddResult:
        """Add a batch of embeddings; clip ids already present count as duplicates.

        Args:
            clip_ids: One id per row.
            asset_ids: The asset of each clip.
            splits: ``train`` or ``eval`` per row (the asset's split).
            vectors: ``(n, dim)`` array; normalised before storage. Every table has one
                dimension, fixed by its first batch.

        Raises:
            InvalidBatch: A bad row (``row``, ``field``); nothing is written.
        """
        if self.pinned_version is not None:
            raise InvalidInput(
                f"{self!r} reads a pinned version; write through an unpinned index",
                field="version",
            )
        ids, assets, split_arr, unit = _check_batch(clip_ids, asset_ids, splits, vectors)
        n = len(ids)
        if n == 0:
            return AddResult(0, 0)
        dim = unit.shape[1]
        # Keep the first of repeated ids within the batch; the rest are duplicates.
        _, first = np.unique(np.asarray(ids, dtype=object), return_index=True)
        keep = np.sort(first)
        table = self._open(create_dim=dim)
        have = _dim_of(table)
        if have != dim:
            raise InvalidBatch(
                f"vectors have dimension {dim}; table {self.table_name} has {have}",
                row=0,
                field="vector",
            )
        batch = pa.table(
            {
                "clip_id": pa.array([ids[i] for i in keep], pa.string()),
                "asset_id": pa.array([assets[i] for i in keep], pa.string()),
                "split": pa.array([split_arr[i] for i in keep], pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(unit[keep].ravel()), dim),
            },
            schema=_schema(dim),
        )
        result = table.merge_insert("clip_id").when_not_matched_insert_all().execute(batch)
        inserted = int(result.num_inserted_rows)
        return AddResult(inserted=inserted, duplicates=n - inserted)

    # -- reads --------------------------------------------------------------------

    def count(self, split: str | None = None) -> int:
        """Rows in the table, optionally of one split."""
        table = self._open()
        if table is None:
            return 0
        if split is None:
            return int(table.count_rows())
        return int(table.count_rows(_split_filter(split)))

    def clip_ids(self, split: str | None = None) -> pa.Array:
        """Every clip id in the table (of one split when given), as one string array."""
        table = self._open()
        if table is None:
            return pa.array([], pa.string())
        query = table.search(None).select(["clip_id"])
        if split is not None:
            query = query.where(_split_filter(split))
        column = query.to_arrow()["clip_id"]
        return pa.concat_arrays([pa.array([], pa.string()), *column.cast(pa.string()).chunks])

    @property
    def dim(self) -> int | None:
        """The table's vector dimension, None before the first add."""
        table = self._open()
        return None if table is None else _dim_of(table)

    def nearest(
        self, vector: NDArray[np.floating[Any]], k: int, split: str | None = None
    ) -> pa.Table:
        """The ``k`` clips nearest ``vector`` by cosine distance.

        Returns:
            Columns ``clip_id, asset_id, split, distance`` ordered by distance, then
            ``clip_id`` (so ties resolve the same way every time).
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInput(f"k must be a positive integer, got {k!r}", field="k")
        where = None if split is None else _split_filter(split)
        table = self._open()
        if table is None:
            return _NEAREST_SCHEMA.empty_table()
        query = unit_rows(np.asarray(vector, dtype=np.float64).reshape(1, -1), "vector")[0]
        if query.shape[0] != _dim_of(table):
            raise InvalidInput(
                f"query has dimension {query.shape[0]}, table has {_dim_of(table)}", field="vector"
            )
        search = table.search(query).distance_type("cosine").limit(k)
        if where is not None:
            search = search.where(where, prefilter=True)
        got = search.select(["clip_id", "asset_id", "split", "_distance"]).to_arrow()
        # Rounding can make a self-match's distance a hair below zero.
        dist = np.clip(got["_distance"].to_numpy().astype(np.float32), 0.0, 2.0)
        out = pa.table(
            {
                "clip_id": got["clip_id"],
                "asset_id": got["asset_id"],
                "split": got["split"],
                "distance": pa.array(dist, pa.float32()),
            },
            schema=_NEAREST_SCHEMA,
        )
        return out.sort_by([("distance", "ascending"), ("clip_id", "ascending")])

    def vectors(self, ids: Sequence[str]) -> tuple[list[str], NDArray[np.float32]]:
        """Stored (unit) vectors of ``ids``.

        Returns:
            The ids found, in the order asked (repeats dropped), and their vectors as an
            ``(n, dim)`` float32 array. Ids without an embedding are left out.
        """
        wanted = list(dict.fromkeys(_check_ids(ids)))
        table = self._open()
        if table is None or not wanted:
            return [], np.zeros((0, 0 if table is None else _dim_of(table)), np.float32)
        dim = _dim_of(table)
        found = self._read(table, wanted)
        position = {cid: i for i, cid in enumerate(found["clip_id"].to_pylist())}
        order = [position[c] for c in wanted if c in position]
        mat = _matrix(found["vector"], dim)[order] if order else np.zeros((0, dim), np.float32)
        return [wanted[i] for i, c in enumerate(wanted) if c in position], mat

    def pairs_within(
        self, ids: Sequence[str], distance: float, *, against_split: str | None = None
    ) -> pa.Table:
        """Every pair within cosine ``distance`` (inclusive) involving ``ids``.

        Args:
            ids: The clips to check; those without an embedding are skipped.
            distance: Cosine distance threshold, in ``[0, 2]``.
            against_split: None: pairs among ``ids`` themselves, each unordered pair
                once. A split name: pairs of an id with any clip of that split in the
                table (e.g. train clips near any ``eval`` clip); a clip never pairs
                with itself.

        Returns:
            ``clip_id`` (from ``ids``), ``other_id``, ``distance``; see
            :func:`pairs_within_vectors` for order and cost.
        """
        found, mat = self.vectors(ids)
        if against_split is None:
            return pairs_within_vectors(found, mat, distance)
        table = self._open()
        if table is None or not found:
            return PAIRS_SCHEMA.empty_table()
        others = (
            table.search(None).where(_split_filter(against_split)).select(["clip_id", "vector"])
        )
        other = others.to_arrow()
        other_ids = other["clip_id"].to_pylist()
        return pairs_within_vectors(
            found,
            mat,
            distance,
            other_ids=other_ids,
            other_vectors=_matrix(other["vector"], mat.shape[1]),
        )

    # -- plumbing -----------------------------------------------------------------

    def _connect(self) -> Any:
        if self._db is None:
            self._db = connect_lance(self.uri)
        return self._db

    def _open(self, create_dim: int | None = None) -> Any:
        if self._table is None:
            db = self._connect()
            if self.table_name in db:
                table = db.open_table(self.table_name)
                if self.pinned_version is not None:
                    _checkout(table, self.model_version, self.pinned_version)
                self._table = table
            elif self.pinned_version is not None:
                raise NotFound(
                    f"embedding model {self.model_version!r} has no LanceDB table, so no "
                    f"version {self.pinned_version}",
                    model_version=self.model_version,
                    version=self.pinned_version,
                )
            elif create_dim is not None:
                self._table = db.create_table(
                    self.table_name, schema=_schema(create_dim, self.model_version), exist_ok=True
                )
        return self._table

    def _read(self, table: Any, ids: list[str]) -> pa.Table:
        cols = ["clip_id", "vector"]
        if len(ids) <= _IN_FILTER_MAX:
            listed = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)
            return table.search(None).where(f"clip_id IN ({listed})").select(cols).to_arrow()
        wanted = pa.array(ids, pa.string())
        parts = []
        for batch in table.search(None).select(cols).to_batches():
            parts.append(batch.filter(pc.is_in(batch["clip_id"], value_set=wanted)))
        return pa.Table.from_batches(parts, schema=pa.schema([table.schema.field(c) for c in cols]))


_NEAREST_SCHEMA = pa.schema(
    [
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("asset_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("distance", pa.float32(), nullable=False),
    ]
)


def _schema(dim: int, model_version: str | None = None) -> pa.Schema:
    metadata = None if model_version is None else {MODEL_METADATA_KEY: model_version.encode()}
    return pa.schema(
        [
            pa.field("clip_id", pa.string(), nullable=False),
            pa.field("asset_id", pa.string(), nullable=False),
            pa.field("split", pa.string(), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
        ],
        metadata=metadata,
    )


def _checkout(table: Any, model_version: str, version: int) -> None:
    """Put ``table`` at ``version``, or say which versions exist."""
    try:
        table.checkout(version)
    except (ValueError, OSError, RuntimeError) as exc:
        versions = [int(v["version"]) for v in table.list_versions()]
        have = f"{min(versions)}..{max(versions)}" if versions else "none"
        raise NotFound(
            f"embedding model {model_version!r} has no LanceDB version {version} "
            f"(versions {have}; cleaned up?)",
            model_version=model_version,
            version=version,
            versions=have,
        ) from exc


def connect_lance(uri: str) -> Any:
    """A LanceDB connection to ``uri`` whose reads see other processes' commits."""
    try:
        import lancedb
    except ImportError as exc:  # pragma: no cover - part of vidlake[service]
        raise NotInstalled("embeddings need lancedb: pip install 'vidlake[service]'") from exc
    # Zero interval: every read sees other processes' commits (a cut must not miss
    # embeddings an ingest job just wrote).
    return lancedb.connect(uri, read_consistency_interval=timedelta(0))


def _table_names(db: Any) -> list[str]:
    names: list[str] = []
    token = None
    while True:
        page = db.list_tables(page_token=token)
        names.extend(page.tables)
        token = page.page_token
        if not token:
            return sorted(names)


def current_versions(
    uri_or_dir: str | os.PathLike[str], model_versions: Sequence[str]
) -> dict[str, int | None]:
    """The latest LanceDB table version of each model (None: no table yet)."""
    uri = os.fspath(uri_or_dir)
    return {m: EmbeddingIndex(uri, m).version for m in sorted(set(model_versions))}


def list_models(uri_or_dir: str | os.PathLike[str]) -> list[str]:
    """The embedding model versions with a table under ``uri_or_dir``, sorted.

    A table written before tables recorded their model (no ``vidlake.model_version``
    in its schema metadata) is listed by its table name.
    """
    db = connect_lance(os.fspath(uri_or_dir))
    models = []
    for name in _table_names(db):
        if not name.startswith("emb_"):
            continue
        metadata = db.open_table(name).schema.metadata or {}
        raw = metadata.get(MODEL_METADATA_KEY)
        models.append(raw.decode("utf-8") if raw else name)
    return sorted(models)


def _dim_of(table: Any) -> int:
    return int(table.schema.field("vector").type.list_size)


def _matrix(column: pa.ChunkedArray | pa.Array, dim: int) -> NDArray[np.float32]:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(arr) == 0:
        return np.zeros((0, dim), np.float32)
    # flatten() honours slice offsets, unlike .values.
    return np.asarray(arr.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(
        -1, dim
    )


def _check_ids(ids: Sequence[str]) -> list[str]:
    out = list(ids)
    for i, cid in enumerate(out):
        if not isinstance(cid, str) or not cid:
            raise InvalidBatch(
                f"clip_id at row {i} must be a non-empty string", row=i, field="clip_id"
            )
    return out


def _check_batch(
    clip_ids: Sequence[str],
    asset_ids: Sequence[str],
    splits: Sequence[str],
    vectors: NDArray[np.floating[Any]],
) -> tuple[list[str], list[str], list[str], NDArray[np.float32]]:
    ids = _check_ids(clip_ids)
    assets, split_list = list(asset_ids), list(splits)
    mat = np.asarray(vectors)
    if not np.issubdtype(mat.dtype, np.floating):
        raise InvalidBatch(
            f"vectors must be floating point, got {mat.dtype}", row=0, field="vector"
        )
    n = len(ids)
    if len(assets) != n or len(split_list) != n or mat.ndim != 2 or mat.shape[0] != n:
        raise InvalidBatch(
            f"clip_ids ({n}), asset_ids ({len(assets)}), splits ({len(split_list)}) and "
            f"vectors {mat.shape} must have one row each",
            row=0,
            field="vector",
        )
    for i, (asset, split) in enumerate(zip(assets, split_list, strict=True)):
        if not isinstance(asset, str) or not asset:
            raise InvalidBatch(
                f"asset_id at row {i} must be a non-empty string", row=i, field="asset_id"
            )
        if split not in SPLITS:
            raise InvalidBatch(
                f"split at row {i} must be one of {SPLITS}, got {split!r}", row=i, field="split"
            )
    return ids, assets, split_list, unit_rows(mat.astype(np.float64), "vector")


def _split_filter(split: str) -> str:
    if split not in SPLITS:
        raise InvalidInput(f"split must be one of {SPLITS}, got {split!r}", field="split")
    return f"split = '{split}'"
