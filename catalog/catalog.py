"""The vidlake catalog: Iceberg tables behind one ingest and read API (the facade).

:meth:`VidlakeCatalog.open` opens an Iceberg catalog by URI (SQLite file, PostgreSQL,
or an Iceberg REST catalog), creates the namespace and every table of
:mod:`catalog.tables` on first open, and freezes the eval carve-out settings in the
namespace properties then (and the drift reference slice's, :mod:`catalog.reference`,
on the first open of a catalog that lacks them).

Ingest (``add_*``) takes a ``pyarrow.Table`` or a list of dicts, checks every row
(vectorised), and commits **one** Iceberg append per call; a bad row raises
:class:`~catalog.errors.InvalidBatch` and commits nothing. Rules enforced at ingest:

* ``assets``: ``asset_id`` is 64 lowercase hex; an asset already in the catalog (or
  earlier in the batch) is a duplicate, not a second row; ``split`` is the eval
  carve-out of :func:`catalog.rules.eval_mask` (a producer may force ``eval``, never
  ``train``); a near-duplicate (:func:`catalog.rules.near_duplicate_pairs`) of an
  existing or same-batch asset is linked ``duplicate_of`` the canonical copy of its
  group (highest bitrate, ties to the smallest id), both rows kept, the matches kept in
  ``near_duplicates``, and a ``near_duplicate`` event is appended to ``asset_events``
  for each new link (a second commit, on that table).
* ``clips``: ``clip_id`` is :func:`catalog.rules.clip_id` (computed when absent, a
  disagreeing one rejected); the asset exists; ``split`` is the asset's; a clip id
  already present is a duplicate.
* ``latents``: the clip exists; the object exists in the object store (or is
  referenced there: :mod:`catalog.objects.refs`) and
  ``offset + length`` fits in it (``object_size`` is recorded from the store); a
  member that is the whole object carries the object's SHA-256; each member's
  header agrees with the row (:mod:`catalog.latent_headers`); a latent already
  present (clip, rung, tokenizer, member SHA-256) is a duplicate.
* ``tombstones``, ``asset_events``: the asset exists.
* ``scores`` and ``captions``: the clip exists; they carry a version; ``jobs`` a job id
  and a stage. These are append-only facts: readers take the latest
  (``latest_scores``, ``latest_captions``).
* Names a recipe selects by (rung, filter name, caption kind, versions) have the
  recipe's shapes (:mod:`catalog.names`, checked in :mod:`catalog.tables`).

Every batch has an idempotency key (``idempotency_key=``, else the SHA-256 of its
canonical bytes) recorded in the snapshot summary of its commit; a rerun with a
recorded key writes nothing and returns the first result, ``replayed``
(:mod:`catalog.idempotency`). Lost near-duplicate events of an interrupted
``add_assets`` are re-derived by the next one (:mod:`catalog.link_events`).

Reads go through a :class:`~catalog.pins.Pin` (table → Iceberg snapshot id, plus the
LanceDB version of each embedding model a cut reads), so that a snapshot cut sees one
consistent state and can be replayed months later. Eval rows are left out
unless ``include_eval=True``.

Appends go through :func:`catalog._append.append`: the catalog writes the Parquet data
files itself and commits one fast-append snapshot (pyiceberg's ``Table.append`` costs
3-4x a bare Parquet write of the batch), and a clip batch whose ids are all given has
them re-derived while its data file is written (the hashing is Python, the write
releases the GIL); a disagreeing id still rejects the batch before anything commits.

Concurrency: several processes may ingest into one catalog (SQLite runs in WAL mode with
a busy timeout). Tables with a uniqueness rule turn off pyiceberg's own commit retry and
are retried here, re-checking duplicates against the new state.

Where each part lives: :mod:`catalog.config` (the config, the ingest result),
:mod:`catalog.backends` (connecting, the namespace's frozen settings),
:mod:`catalog.commit` (one batch's commit loop), :mod:`catalog.ingest` (the per-table
planners), :mod:`catalog.key_index` (the on-disk key index), :mod:`catalog.reads`
(pinned scans, the eval policy of :mod:`catalog.table_names`). This module wires them
behind :class:`VidlakeCatalog`; it is the only way other packages reach pyiceberg
state (snapshot ids, data files, table locations): nothing outside ``catalog``
imports pyiceberg.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as ds
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from catalog import reads, tags
from catalog.backends import connect, freeze_namespace, load_table
from catalog.commit import Ingester, Rows
from catalog.config import CatalogConfig, IngestResult
from catalog.errors import NotFound, StorageError, VidlakeError
from catalog.ingest import Planner
from catalog.ingest_history import IngestPoint, ingest_history
from catalog.key_index import KeyStore, index_path
from catalog.keycache import snapshot_id
from catalog.objects import ObjectStore, open_store
from catalog.pins import Pin
from catalog.reads import RowFilter
from catalog.reference import ReferenceSlice, freeze_reference
from catalog.tables import TABLE_NAMES, TABLES, ensure_table
from catalog.tags import TagReport, VersionTags

if TYPE_CHECKING:
    from catalog.embeddings import EmbeddingIndex

__all__ = ["VidlakeCatalog"]


class VidlakeCatalog:
    """The catalog: ingest with rules, pinned reads. Open with :meth:`open`."""

    def __init__(
        self,
        config: CatalogConfig,
        iceberg: Catalog,
        eval_fraction: float,
        eval_salt: str,
        objects: ObjectStore | None = None,
        reference: ReferenceSlice | None = None,
    ) -> None:
        self.config = config
        self._reference = reference
        self.iceberg = iceberg
        self.eval_fraction = eval_fraction
        self.eval_salt = eval_salt
        self._objects = objects
        rule = config.near_dup_rule()
        keys = KeyStore(index_path(config), self._load, rule)
        planner = Planner(keys, rule, eval_fraction, eval_salt, lambda: self.objects)
        self._keys = keys
        self._ingester = Ingester(self._load, keys, planner)

    # -- opening ----------------------------------------------------------------------
    @classmethod
    def open(cls, config: CatalogConfig, *, objects: ObjectStore | None = None) -> VidlakeCatalog:
        """Open (and on first use create) the catalog ``config`` describes.

        Args:
            config: Where the catalog lives.
            objects: The object store for latent checks (default: opened lazily from
                ``config.objects``).

        Raises:
            Conflict: ``config`` names an eval fraction or salt (or a reference
                fraction) other than the frozen ones.
            StorageError: The catalog backend cannot be reached or written.
        """
        try:
            iceberg = connect(config)
            fraction, salt = freeze_namespace(iceberg, config)
            reference = freeze_reference(
                iceberg, config.namespace, fraction, salt, config.reference_fraction
            )
            for tdef in TABLES.values():
                ensure_table(iceberg, config.namespace, tdef)
        except VidlakeError:
            raise
        except Exception as exc:  # the backend's own errors: translate once, here
            raise StorageError(f"cannot open catalog {config.uri}: {exc}", uri=config.uri) from exc
        return cls(config, iceberg, fraction, salt, objects, reference)

    @property
    def reference(self) -> ReferenceSlice:
        """The frozen drift reference slice (:mod:`catalog.reference`)."""
        if self._reference is None:
            self._reference = freeze_reference(
                self.iceberg, self.config.namespace, self.eval_fraction, self.eval_salt
            )
        return self._reference

    @property
    def objects(self) -> ObjectStore:
        """The object store latents live in."""
        if self._objects is None:
            self._objects = open_store(
                self.config.objects,
                endpoint_url=self.config.s3_endpoint_url,
                path_style=self.config.s3_path_style,
            )
        return self._objects

    def embeddings(self, model_version: str, version: int | None = None) -> EmbeddingIndex:
        """The LanceDB embedding table of ``model_version`` (``catalog.embeddings``),
        read at LanceDB table ``version`` when given (a pin's), else at the latest."""
        from catalog.embeddings import EmbeddingIndex

        return EmbeddingIndex(self.config.lance, model_version, version=version)

    def iceberg_table(self, name: str) -> Table:
        """The pyiceberg table (fresh metadata), for maintenance inside ``catalog``
        and for tests; other packages use the methods below."""
        if name not in TABLES:
            raise NotFound(f"no table {name!r}; tables: {', '.join(TABLE_NAMES)}", table=name)
        return self._load(name)

    def _load(self, name: str) -> Table:
        return load_table(self.iceberg, self.config.namespace, name)

    def purge_key_index(self) -> None:
        """Empty this host's key index (an erasure's last trace in it); the next
        ingest rebuilds it from the tables (:meth:`catalog.key_index.KeyStore.purge`)."""
        self._keys.purge()

    def close(self) -> None:
        """Release the backend's connections (and the key index's)."""
        self._keys.close()
        closer = getattr(self.iceberg, "close", None)
        if callable(closer):
            closer()

    def __enter__(self) -> VidlakeCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- table state, without pyiceberg types -----------------------------------------
    def current_snapshot_id(self, table: str) -> int | None:
        """``table``'s current snapshot id, from fresh metadata (None: empty)."""
        return snapshot_id(self.iceberg_table(table))

    def snapshot_ids(self, table: str) -> list[int]:
        """Every snapshot id ``table``'s metadata still holds, oldest first."""
        return [s.snapshot_id for s in self.iceberg_table(table).metadata.snapshots]

    def has_snapshot(self, table: str, sid: int) -> bool:
        """Whether ``table`` still holds snapshot ``sid`` (not expired)."""
        return self.iceberg_table(table).metadata.snapshot_by_id(sid) is not None

    def ingest_history(self, table: str) -> list[IngestPoint]:
        """Each commit of ``table`` still in its metadata: time, operation, records added
        (:mod:`catalog.ingest_history`; no data read)."""
        return ingest_history(self.iceberg_table(table))

    def row_count(self, table: str) -> int:
        """Rows of ``table``'s current snapshot, from its summary (no data read)."""
        return _row_count(self.iceberg_table(table))

    def overview(self, table: str) -> tuple[int, list[IngestPoint]]:
        """:meth:`row_count` and :meth:`ingest_history` of ``table`` from one metadata read."""
        tbl = self.iceberg_table(table)
        return _row_count(tbl), ingest_history(tbl)

    def locations(self, table: str) -> tuple[str, str]:
        """``table``'s current metadata file and its table location (URIs)."""
        tbl = self.iceberg_table(table)
        return tbl.metadata_location, tbl.metadata.location

    def namespace_properties(self) -> dict[str, str]:
        """The namespace's properties (the frozen eval settings among them)."""
        return dict(self.iceberg.load_namespace_properties(self.config.namespace))

    def snapshot_dataset(self, table: str, sid: int | None) -> ds.Dataset:
        """``table``'s rows at snapshot ``sid``, eval included, as a pyarrow dataset
        over its data files (:func:`catalog.reads.snapshot_dataset`)."""
        return reads.snapshot_dataset(self, table, sid)

    # -- version tags (catalog.tags) ------------------------------------------------
    def tag_versions(self, wanted: list[VersionTags], *, now_ms: int | None = None) -> TagReport:
        """Tag each version's snapshots ``vidlake-v{N}`` (:func:`catalog.tags.tag_versions`)."""
        return tags.tag_versions(self._load, wanted, now_ms=now_ms)

    def drop_aged_tags(self, *, now_ms: int | None = None) -> TagReport:
        """Remove the version tags past their retention (:func:`catalog.tags.drop_aged_tags`)."""
        return tags.drop_aged_tags(self._load, now_ms=now_ms)

    def tagged_snapshot_ids(self, table: str, *, now_ms: int | None = None) -> set[int]:
        """Snapshot ids of ``table`` a branch or an unexpired tag holds: what a snapshot
        expiry must keep (:func:`catalog.tags.tagged_snapshot_ids`)."""
        return tags.tagged_snapshot_ids(self.iceberg_table(table), now_ms=now_ms)

    def version_tags(self, table: str) -> dict[int, int]:
        """``table``'s ``vidlake-v{N}`` tags: version -> tagged snapshot id."""
        return {v: r.snapshot_id for v, r in tags.version_tags(self.iceberg_table(table)).items()}

    # -- ingest -----------------------------------------------------------------------
    def add_assets(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Ingest raw assets: dedup by id, eval carve-out, near-duplicate links."""
        return self._ingester.ingest("assets", rows, idempotency_key)

    def add_clips(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Ingest clips of existing assets (``clip_id`` computed when absent)."""
        return self._ingester.ingest("clips", rows, idempotency_key)

    def add_latents(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Ingest latents of existing clips stored in the object store."""
        return self._ingester.ingest("latents", rows, idempotency_key)

    def add_scores(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Append filter scores (each row names its filter version)."""
        return self._ingester.ingest("scores", rows, idempotency_key)

    def add_captions(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Append captions (each row names its caption version)."""
        return self._ingester.ingest("captions", rows, idempotency_key)

    def add_tombstones(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Record takedowns of existing assets (``kind`` soft or hard)."""
        return self._ingester.ingest("tombstones", rows, idempotency_key)

    def add_asset_events(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Record status changes of existing assets (quarantined, released, links)."""
        return self._ingester.ingest("asset_events", rows, idempotency_key)

    def add_jobs(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Record curation jobs (one row per state change; readers take the latest)."""
        return self._ingester.ingest("jobs", rows, idempotency_key)

    # -- reads ------------------------------------------------------------------------
    def pin(self, embeddings: Sequence[str] = ()) -> Pin:
        """The current snapshot id of every table: a consistent state to read at.

        Args:
            embeddings: Embedding model versions whose current LanceDB table version
                the pin also records (None for a model without a table).
        """
        return reads.pin(self, embeddings)

    def scan(
        self,
        table: str,
        pin: Pin | None = None,
        columns: Sequence[str] | None = None,
        row_filter: RowFilter | None = None,
        *,
        include_eval: bool = False,
    ) -> pa.Table:
        """Read a table at a pin (the current state when None) into one Arrow table.

        Args:
            table: Table name.
            pin: The state to read; None pins the current one.
            columns: Columns to return (all when None).
            row_filter: A pyiceberg filter (string such as ``"score > 0.5"``, or an
                expression such as :func:`catalog.reads.one_of`'s).
            include_eval: Keep rows of eval assets (and their clips' rows).
        """
        return self.scan_batches(
            table, pin, columns, row_filter, include_eval=include_eval
        ).read_all()

    def scan_batches(
        self,
        table: str,
        pin: Pin | None = None,
        columns: Sequence[str] | None = None,
        row_filter: RowFilter | None = None,
        *,
        include_eval: bool = False,
    ) -> pa.RecordBatchReader:
        """:meth:`scan` as a stream of record batches (bounded memory).

        A pin reads with the schema its snapshot was written with. Without a pin the
        current schema applies: columns added after the current snapshot read as nulls.
        """
        return reads.scan_batches(self, table, pin, columns, row_filter, include_eval=include_eval)

    def eval_ids(self, table: str, pin: Pin | None = None) -> pa.Array:
        """The ids of the eval assets (``table="assets"``) or clips (``"clips"``) at
        ``pin`` (the current state when None): the carve-out, as ``scan`` hides it."""
        return reads.eval_ids(self, table, pin if pin is not None else self.pin())

    def latest_scores(
        self,
        pin: Pin | None = None,
        versions: Mapping[str, str] | None = None,
        *,
        include_eval: bool = False,
    ) -> pa.Table:
        """One score per (clip_id, filter_name): at ``versions[filter_name]`` where the
        filter is named, else the latest version. "Latest" is the most recently
        computed row (ties: the greater version, then the greater score), so that a
        re-score at the same version supersedes the old one.

        Returns:
            The ``scores`` columns, sorted by (clip_id, filter_name).
        """
        return reads.latest_scores(self, pin, versions, include_eval=include_eval)

    def latest_captions(
        self,
        pin: Pin | None = None,
        version: str | None = None,
        kinds: Sequence[str] | None = None,
        *,
        include_eval: bool = False,
    ) -> pa.Table:
        """One caption per (clip_id, kind): at ``version`` when given, else the latest
        (most recently ingested; ties: greater version, then text). ``kinds`` limits the
        kinds returned."""
        return reads.latest_captions(self, pin, version, kinds, include_eval=include_eval)

    def asset_status(self, pin: Pin | None = None, *, include_eval: bool = False) -> pa.Table:
        """Governance state of every asset at the pin, one row each.

        Columns: ``asset_id``, ``split``, ``tombstoned`` (bool), ``tombstone_kind``
        (``hard`` if any hard takedown, else ``soft``, null when none), ``quarantined``
        (the latest quarantined/released event wins; a tie quarantines),
        ``duplicate_of`` (the canonical copy of the asset's near-duplicate group, null
        for a canonical or unlinked asset), ``near_dup_of_eval`` (the group holds an eval
        asset: a train asset that must not enter a training cut).
        """
        return reads.asset_status(self, pin, include_eval=include_eval)


def _row_count(tbl: Table) -> int:
    snap = tbl.current_snapshot()
    total = snap.summary.get("total-records") if snap and snap.summary else None
    return int(total or 0)
