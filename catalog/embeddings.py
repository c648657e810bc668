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
  (:func:`pairs_within_vectors`): the query vectors are cut into blocks of
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
LanceDB directory holds.
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

__all__ = [
    "SPLITS",
    "AddResult",
    "EmbeddingIndex",
    "asset_vector_counts",
    "current_versions",
    "erase_asset_vectors",
    "list_models",
    "pairs_within_vectors",
    "table_name_for",
]

SPLITS = ("train", "eval")
PAIRS_SCHEMA = pa.schema(
    [
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("other_id", pa.string(), nullable=False),
        pa.field("distance", pa.float32(), nullable=False),
    ]
)
MODEL_METADATA_KEY = b"vidlake.model_version"
_IN_FILTER_MAX = 1024  # above this many ids a scan + is_in beats a giant SQL IN list
_BLOCK = 2048


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
        query = _unit_rows(np.asarray(vector, dtype=np.float64).reshape(1, -1), "vector")[0]
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
            self._db = _connect(self.uri)
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


def asset_vector_counts(uri_or_dir: str | os.PathLike[str], asset_id: str) -> dict[str, int]:
    """Rows of ``asset_id`` per embedding table (tables without any are left out)."""
    db = _erasure_db(uri_or_dir, asset_id)
    counts: dict[str, int] = {}
    for name in db.table_names():
        table = db.open_table(name)
        if "asset_id" in table.schema.names:
            n = int(table.count_rows(f"asset_id = '{asset_id}'"))
            if n:
                counts[name] = n
    return counts


def erase_asset_vectors(
    uri_or_dir: str | os.PathLike[str], asset_id: str, tables: Sequence[str]
) -> None:
    """Delete ``asset_id``'s rows from ``tables`` and erase their old versions.

    A LanceDB delete only writes a deletion file, and compaction rewrites a fragment
    only once a tenth of it is deleted: the vectors would stay in the fragment files.
    So each table is rewritten whole from its remaining rows (a new version of new
    fragment files; ``O(table)`` work, the price of a guarantee LanceDB's API offers
    no cheaper way to) and every version but the latest is cleaned up. Idempotent: a
    rerun rewrites the same rows again.

    A reader or writer holding an older version of such a table at that moment fails
    (the version it reads is gone), and pins of older table versions no longer
    resolve; an erasure's record says so. The table has no vector index to rebuild
    (see the module docstring: reads are exact scans).
    """
    import warnings

    db = _erasure_db(uri_or_dir, asset_id)
    present = set(db.table_names())
    for name in tables:
        if name not in present:
            continue
        table = db.open_table(name)
        table.delete(f"asset_id = '{asset_id}'")
        rows = table.to_arrow()
        db.create_table(name, rows, schema=rows.schema, mode="overwrite")
        with warnings.catch_warnings():
            # "removes every version except the latest": exactly the point here.
            warnings.simplefilter("ignore", UserWarning)
            db.open_table(name).optimize(cleanup_older_than=timedelta(0))


def _erasure_db(uri_or_dir: str | os.PathLike[str], asset_id: str) -> Any:
    if not re.fullmatch(r"[0-9a-f]{64}", asset_id):
        raise InvalidInput(f"asset id must be 64 lowercase hex, got {asset_id!r}")
    return EmbeddingIndex(uri_or_dir, "erasure")._connect()


_NEAREST_SCHEMA = pa.schema(
    [
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("asset_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("distance", pa.float32(), nullable=False),
    ]
)


def pairs_within_vectors(
    ids: Sequence[str],
    vectors: NDArray[np.floating[Any]],
    distance: float,
    *,
    other_ids: Sequence[str] | None = None,
    other_vectors: NDArray[np.floating[Any]] | None = None,
    block: int = _BLOCK,
) -> pa.Table:
    """Exact pairs within cosine ``distance`` by a blocked matrix product.

    With no ``other_*``, pairs among ``ids`` (``i < j`` by position, each once);
    otherwise pairs of each id with each other id (equal ids never pair). Vectors are
    normalised here, so callers may pass raw embeddings.

    Cost: ``n * m * dim`` multiply-adds (half that among themselves) and, beyond the
    inputs, ``block x block`` float32 scratch. Output is ordered by the position of
    ``clip_id`` in ``ids``, then by the position of ``other_id``.

    Returns:
        A table with :data:`PAIRS_SCHEMA`: ``clip_id``, ``other_id``, ``distance``.
    """
    if (
        isinstance(distance, bool)
        or not isinstance(distance, int | float)
        or not 0 <= distance <= 2
    ):
        raise InvalidInput(
            f"distance must be a cosine distance in [0, 2], got {distance!r}", field="distance"
        )
    self_join = other_ids is None
    oid = list(ids) if other_ids is None else list(other_ids)
    if not len(ids) or not len(oid):
        return PAIRS_SCHEMA.empty_table()
    q = _unit_rows(_rows(vectors, len(ids), "vectors"), "vectors")
    o = q
    if not self_join:
        if other_vectors is None:
            raise InvalidInput("other_ids needs other_vectors", field="other_vectors")
        o = _unit_rows(_rows(other_vectors, len(oid), "other_vectors"), "other_vectors")
        if o.shape[1] != q.shape[1]:
            raise InvalidInput(f"dimension {o.shape[1]} != {q.shape[1]}", field="other_vectors")
    qi_all: list[NDArray[np.int64]] = []
    oj_all: list[NDArray[np.int64]] = []
    d_all: list[NDArray[np.float32]] = []
    ids_arr = np.asarray(list(ids), dtype=object)
    oid_arr = np.asarray(oid, dtype=object)
    # The threshold test runs on similarities in float32; widen it by a few ulps so a
    # pair exactly at the threshold is not lost to rounding, then decide on distance.
    min_sim = np.float32(1.0 - distance) - np.float32(1e-6)
    for a in range(0, len(q), block):
        qa = q[a : a + block]
        start = a if self_join else 0
        for b in range(start, len(o), block):
            sims = qa @ o[b : b + block].T
            hit = sims >= min_sim
            if self_join and a == b:
                hit &= np.triu(np.ones(hit.shape, dtype=bool), k=1)
            r, c = np.nonzero(hit)
            if not len(r):
                continue
            dist = np.clip(1.0 - sims[r, c].astype(np.float64), 0.0, 2.0)
            ok = dist <= distance
            r, c, dist = r[ok] + a, c[ok] + b, dist[ok]
            if not self_join:
                same = ids_arr[r] == oid_arr[c]
                r, c, dist = r[~same], c[~same], dist[~same]
            qi_all.append(r.astype(np.int64))
            oj_all.append(c.astype(np.int64))
            d_all.append(dist.astype(np.float32))
    if not qi_all:
        return PAIRS_SCHEMA.empty_table()
    qi, oj, dd = np.concatenate(qi_all), np.concatenate(oj_all), np.concatenate(d_all)
    order = np.lexsort((oj, qi))
    qi, oj, dd = qi[order], oj[order], dd[order]
    return pa.table(
        {
            "clip_id": pa.array(ids_arr[qi].tolist(), pa.string()),
            "other_id": pa.array(oid_arr[oj].tolist(), pa.string()),
            "distance": pa.array(dd, pa.float32()),
        },
        schema=PAIRS_SCHEMA,
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


def _connect(uri: str) -> Any:
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
    db = _connect(os.fspath(uri_or_dir))
    models = []
    for name in _table_names(db):
        if not name.startswith("emb_"):
            continue
        metadata = db.open_table(name).schema.metadata or {}
        raw = metadata.get(MODEL_METADATA_KEY)
        models.append(raw.decode("utf-8") if raw else name)
    return sorted(models)


def _rows(vectors: NDArray[np.floating[Any]], n: int, field: str) -> NDArray[np.float64]:
    mat = np.asarray(vectors, dtype=np.float64)
    if mat.ndim != 2 or mat.shape[0] != n:
        raise InvalidInput(f"{field} must be an ({n}, dim) array, got {mat.shape}", field=field)
    return mat


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


def _unit_rows(mat: NDArray[np.float64], field: str) -> NDArray[np.float32]:
    if mat.ndim != 2 or (len(mat) and mat.shape[1] == 0):
        raise InvalidBatch(f"{field} must be a non-empty (n, dim) array", row=0, field=field)
    if not np.isfinite(mat).all():
        row = int(np.nonzero(~np.isfinite(mat).all(axis=1))[0][0])
        raise InvalidBatch(f"{field} row {row} is not finite", row=row, field=field)
    norms = np.linalg.norm(mat, axis=1)
    if len(norms) and (norms == 0).any():
        row = int(np.nonzero(norms == 0)[0][0])
        raise InvalidBatch(
            f"{field} row {row} is a zero vector (no direction)", row=row, field=field
        )
    unit: NDArray[np.float32] = (mat / norms[:, None]).astype(np.float32)
    return unit


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
    return ids, assets, split_list, _unit_rows(mat.astype(np.float64), "vector")


def _split_filter(split: str) -> str:
    if split not in SPLITS:
        raise InvalidInput(f"split must be one of {SPLITS}, got {split!r}", field="split")
    return f"split = '{split}'"
