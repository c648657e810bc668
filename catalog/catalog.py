"""The vidlake catalog: Iceberg tables behind one ingest and read API.

:meth:`VidlakeCatalog.open` opens an Iceberg catalog by URI (SQLite file, PostgreSQL,
or an Iceberg REST catalog), creates the namespace and every table of
:mod:`catalog.tables` on first open, and freezes the eval carve-out settings in the
namespace properties then.

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
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    RESTError,
)
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, In, NotEqualTo
from pyiceberg.expressions.parser import parse as parse_filter
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from sqlalchemy.exc import SQLAlchemyError

from catalog import idempotency, link_events, rules
from catalog._append import append as fast_append
from catalog.errors import (
    Conflict,
    InvalidBatch,
    InvalidInput,
    NotFound,
    StorageError,
    VidlakeError,
)
from catalog.latent_headers import check_latent_headers, member_hashes, member_ranges
from catalog.objects import ObjectStore, open_store
from catalog.objects.refs import resolve_head
from catalog.pins import Pin
from catalog.tables import (
    TABLE_NAMES,
    TABLES,
    arrow_schema,
    coerce_batch,
    conform,
    ensure_table,
    fill_time,
)

if TYPE_CHECKING:
    from catalog.embeddings import EmbeddingIndex

__all__ = ["CatalogConfig", "IngestResult", "Pin", "VidlakeCatalog"]

log = logging.getLogger("vidlake.catalog")

PROP_EVAL_FRACTION = "vidlake.eval-fraction"
PROP_EVAL_SALT = "vidlake.eval-salt"
PROP_CREATED_AT = "vidlake.created-at"
DEFAULT_EVAL_FRACTION = 0.02
_COMMIT_ATTEMPTS = 12
_SQLITE_BUSY_MS = 60_000
_HEAD_WORKERS = 16

Rows: TypeAlias = pa.Table | Sequence[Mapping[str, Any]]
#: The backends' own failures, translated to StorageError at this boundary.
_BACKEND_ERRORS: tuple[type[Exception], ...] = (OSError, SQLAlchemyError, RESTError)
_LINK_FAILURES: tuple[type[Exception], ...] = (
    *_BACKEND_ERRORS,
    CommitFailedException,
    StorageError,
    NotFound,
)
#: An events commit that fails for any of these is re-derived by a later add_assets.
_EVENT_FAILURES: tuple[type[Exception], ...] = (*_LINK_FAILURES, Conflict)
_CREATE_RACES: tuple[type[Exception], ...] = (*_BACKEND_ERRORS, NamespaceAlreadyExistsError)


class CatalogConfig(BaseModel):
    """Where the catalog lives and the rules it applies (a recorded fact: frozen).

    Attributes:
        uri: SQLAlchemy URI of the SQL catalog (``sqlite:///…/catalog.db``,
            ``postgresql+psycopg2://…``) or ``rest:http://…`` for an Iceberg REST catalog.
        warehouse: Directory or ``s3://bucket/prefix`` holding table data and metadata.
        namespace: The Iceberg namespace of the tables.
        objects: Object store URL (directory or ``s3://``).
        lance: LanceDB directory or URI (embeddings).
        eval_fraction: Eval carve-out fraction; None: the catalog's frozen value (0.02
            when creating). A value different from the frozen one is a Conflict.
        eval_salt: Hex salt of the carve-out; None: the frozen one (random at creation).
        near_dup_hamming: Hamming threshold per 64-bit frame hash.
        near_dup_min_frames: Matching aligned frames that make a near-duplicate.
        near_dup_window: Leading frames compared.
        s3_endpoint_url: S3-compatible endpoint (else ``AWS_ENDPOINT_URL``, else AWS).
        s3_path_style: Path-style S3 addressing.
        s3_region: Region of the warehouse bucket (else ``AWS_REGION`` /
            ``AWS_DEFAULT_REGION``; ``us-east-1`` with a custom endpoint).
        iceberg_properties: Extra pyiceberg catalog / FileIO properties, passed through
            (``s3.access-key-id``, ``s3.secret-access-key``, ``token``, …).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str = "sqlite:///.vidlake/catalog.db"
    warehouse: str = ".vidlake/warehouse"
    namespace: str = Field(default="vidlake", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    objects: str = ".vidlake/objects"
    lance: str = ".vidlake/lance"
    eval_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    eval_salt: str | None = None
    near_dup_hamming: int = Field(default=4, ge=0, le=31)
    near_dup_min_frames: int = Field(default=6, ge=1)
    near_dup_window: int = Field(default=8, ge=1, le=1024)
    s3_endpoint_url: str | None = None
    s3_path_style: bool | None = None
    s3_region: str | None = None
    iceberg_properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("eval_salt")
    @classmethod
    def _hex_salt(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                if not value or bytes.fromhex(value).hex() != value.lower():
                    raise ValueError
            except ValueError:
                raise ValueError("eval_salt must be a non-empty even-length hex string") from None
        return value

    @model_validator(mode="after")
    def _window_holds_min_frames(self) -> Self:
        if self.near_dup_min_frames > self.near_dup_window:
            raise ValueError("near_dup_min_frames must not exceed near_dup_window")
        return self

    @classmethod
    def embedded(cls, root: str | Path, **overrides: Any) -> CatalogConfig:
        """The embedded layout under ``root``: ``catalog.db``, ``warehouse/``,
        ``objects/``, ``lance/``."""
        base = Path(root).absolute()
        values: dict[str, Any] = {
            "uri": f"sqlite:///{base / 'catalog.db'}",
            "warehouse": str(base / "warehouse"),
            "objects": str(base / "objects"),
            "lance": str(base / "lance"),
        }
        values.update(overrides)
        return cls(**values)

    def near_dup_rule(self) -> rules.NearDupRule:
        """The near-duplicate rule these settings describe."""
        return rules.NearDupRule(
            self.near_dup_hamming, self.near_dup_min_frames, self.near_dup_window
        )


@dataclass(frozen=True)
class IngestResult:
    """What one ``add_*`` call did.

    Attributes:
        table: The table written.
        inserted: Rows appended.
        duplicates: Rows skipped as already present (in the catalog or the batch).
        eval: Inserted rows in the eval split (assets only).
        rejected: Rows rejected (0: a bad row rejects the whole batch by raising).
        snapshot_id: The table's snapshot after the call (None: still empty); for a
            replay, the snapshot that committed the batch.
        near_duplicates: Inserted assets linked as near-duplicates.
        idempotency_key: The batch's key (the caller's, else ``sha256:<batch hash>``;
            :mod:`catalog.idempotency`).
        replayed: The key was already recorded: nothing was written, and the counts
            are those of the commit that recorded it.
    """

    table: str
    inserted: int
    duplicates: int
    eval: int
    rejected: int
    snapshot_id: int | None
    near_duplicates: int = 0
    idempotency_key: str | None = None
    replayed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def replay(cls, table: str, prior: idempotency.Recorded) -> IngestResult:
        """The result of a batch whose key ``prior`` recorded."""
        c = prior.counts
        return cls(
            table,
            c["inserted"],
            c["duplicates"],
            c["eval"],
            0,
            prior.snapshot_id,
            c["near_duplicates"],
            idempotency_key=prior.key,
            replayed=True,
        )


@dataclass
class _Cached:
    """Key columns of one table at one snapshot, arrays derived from them, and a sorted
    digest index over the key (see :func:`rules.digest_matches`)."""

    snapshot_id: int | None
    data: pa.Table
    derived: dict[str, NDArray[Any]] = field(default_factory=dict)
    index: tuple[NDArray[np.uint64], NDArray[np.int64]] | None = None

    def find(
        self, key: str, values: pa.ChunkedArray | pa.Array, digests: NDArray[np.uint64]
    ) -> NDArray[np.int64]:
        """Row of each value in column ``key`` (-1 where absent): digest candidates,
        then an exact comparison, so a digest collision never fakes a match."""
        found = np.full(len(values), -1, dtype=np.int64)
        if self.index is None or len(self.index[0]) == 0 or len(values) == 0:
            return found
        qi, rows = rules.digest_matches(self.index, digests)
        if len(qi):
            mine = pc.take(values, pa.array(qi))
            theirs = pc.take(self.data[key], pa.array(rows))
            same = _np(pc.fill_null(pc.equal(mine, theirs), False)).astype(np.bool_)
            found[qi[same]] = rows[same]
        return found


@dataclass
class _Plan:
    rows: pa.Table
    duplicates: int = 0
    eval: int = 0
    near_duplicates: int = 0
    events: pa.Table | None = None
    #: A check run while the rows are written, before the commit (CPU-bound Python:
    #: the Parquet write releases the GIL, so the two overlap).
    verify: Callable[[], object] | None = None

    def counts(self, inserted: int) -> dict[str, int]:
        """The result's counts when ``inserted`` rows commit."""
        return {
            "inserted": inserted,
            "duplicates": self.duplicates,
            "eval": self.eval,
            "near_duplicates": self.near_duplicates,
        }


def _backoff(attempt: int) -> None:
    """Sleep before retrying a lost commit race (exponential, jittered)."""
    time.sleep(min(2.0, 0.02 * 2**attempt) * (1 + random.random()))


def _ident(namespace: str, table: str) -> tuple[str, str]:
    return (namespace, table)


def _first_bad(mask: pa.ChunkedArray | pa.Array | NDArray[np.bool_]) -> int | None:
    """Index of the first False in a good-row mask (null counts as bad), or None."""
    good = mask if isinstance(mask, np.ndarray) else _np(pc.fill_null(mask, False))
    bad = np.flatnonzero(~good.astype(np.bool_))
    return int(bad[0]) if len(bad) else None


def _find_refs(entry: _Cached, key: str, ids: pa.ChunkedArray | pa.Array) -> NDArray[np.int64]:
    """:func:`_find_ids` for references that repeat many times (an asset has many
    clips): each distinct id is looked up once (~3x cheaper)."""
    refs = pc.dictionary_encode(_combined(ids))
    at = _find_ids(entry, key, refs.dictionary)
    at = at[_np(refs.indices.fill_null(0)).astype(np.int64)]
    if refs.indices.null_count:
        at[_np(pc.is_null(refs.indices)).astype(np.bool_)] = -1
    return at


def _find_ids(entry: _Cached, key: str, ids: pa.ChunkedArray | pa.Array) -> NDArray[np.int64]:
    """Row of each hex id in ``entry`` (-1 where absent or null)."""
    valid = _np(pc.is_valid(ids)).astype(np.bool_)
    if valid.all():
        return entry.find(key, ids, rules.hex_prefix64(ids))
    found = np.full(len(ids), -1, dtype=np.int64)
    some = pc.filter(ids, pa.array(valid))
    found[valid] = entry.find(key, some, rules.hex_prefix64(some))
    return found


def _first_occurrence(
    keys: pa.ChunkedArray | pa.Array, digests: NDArray[np.uint64] | None = None
) -> NDArray[np.bool_]:
    """True at the first row of each distinct key. ``digests`` (equal keys have equal
    digests) give a cheap answer for the usual batch, which repeats nothing."""
    n = len(keys)
    if digests is not None:
        ordered = np.sort(digests)
        if not (ordered[1:] == ordered[:-1]).any():
            return np.ones(n, dtype=np.bool_)
    elif pc.count_distinct(keys).as_py() == n:
        return np.ones(n, dtype=np.bool_)
    grouped = (
        pa.table({"k": keys, "i": pa.array(np.arange(n, dtype=np.int64))})
        .group_by("k")
        .aggregate([("i", "min")])
    )
    first = np.zeros(n, dtype=np.bool_)
    first[grouped["i_min"].to_numpy()] = True
    return first


def _np(col: pa.ChunkedArray | pa.Array) -> NDArray[Any]:
    return np.asarray(col.to_numpy(zero_copy_only=False))


class VidlakeCatalog:
    """The catalog: ingest with rules, pinned reads. Open with :meth:`open`."""

    def __init__(
        self,
        config: CatalogConfig,
        iceberg: Catalog,
        eval_fraction: float,
        eval_salt: str,
        objects: ObjectStore | None = None,
    ) -> None:
        self.config = config
        self.iceberg = iceberg
        self.eval_fraction = eval_fraction
        self.eval_salt = eval_salt
        self._objects = objects
        self._rule = config.near_dup_rule()
        self._lock = threading.RLock()
        self._cache: dict[str, _Cached] = {}
        self._keys: dict[str, idempotency.KeyIndex] = {}

    # -- opening ----------------------------------------------------------------------
    @classmethod
    def open(cls, config: CatalogConfig, *, objects: ObjectStore | None = None) -> VidlakeCatalog:
        """Open (and on first use create) the catalog ``config`` describes.

        Args:
            config: Where the catalog lives.
            objects: The object store for latent checks (default: opened lazily from
                ``config.objects``).

        Raises:
            Conflict: ``config`` names an eval fraction or salt other than the frozen ones.
            StorageError: The catalog backend cannot be reached or written.
        """
        try:
            iceberg = _connect(config)
            fraction, salt = _freeze_namespace(iceberg, config)
            for tdef in TABLES.values():
                ensure_table(iceberg, config.namespace, tdef)
        except VidlakeError:
            raise
        except Exception as exc:  # the backend's own errors: translate once, here
            raise StorageError(f"cannot open catalog {config.uri}: {exc}", uri=config.uri) from exc
        return cls(config, iceberg, fraction, salt, objects)

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
        """The pyiceberg table (fresh metadata), for maintenance and interop."""
        if name not in TABLES:
            raise NotFound(f"no table {name!r}; tables: {', '.join(TABLE_NAMES)}", table=name)
        return self._load(name)

    def close(self) -> None:
        """Release the backend's connections."""
        closer = getattr(self.iceberg, "close", None)
        if callable(closer):
            closer()

    def __enter__(self) -> VidlakeCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ingest -----------------------------------------------------------------------
    def add_assets(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Ingest raw assets: dedup by id, eval carve-out, near-duplicate links."""
        return self._ingest("assets", rows, self._plan_assets, idempotency_key)

    def add_clips(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Ingest clips of existing assets (``clip_id`` computed when absent)."""
        return self._ingest("clips", rows, self._plan_clips, idempotency_key)

    def add_latents(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Ingest latents of existing clips stored in the object store."""
        return self._ingest(
            "latents", rows, self._plan_latents, idempotency_key, prepare=self._prepare_latents
        )

    def add_scores(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Append filter scores (each row names its filter version)."""
        return self._ingest("scores", rows, self._plan_clip_refs, idempotency_key)

    def add_captions(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Append captions (each row names its caption version)."""
        return self._ingest("captions", rows, self._plan_clip_refs, idempotency_key)

    def add_tombstones(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Record takedowns of existing assets (``kind`` soft or hard)."""
        return self._ingest("tombstones", rows, self._plan_asset_refs, idempotency_key)

    def add_asset_events(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Record status changes of existing assets (quarantined, released, links)."""
        return self._ingest("asset_events", rows, self._plan_asset_refs, idempotency_key)

    def add_jobs(self, rows: Rows, *, idempotency_key: str | None = None) -> IngestResult:
        """Record curation jobs (one row per state change; readers take the latest)."""
        return self._ingest("jobs", rows, self._plan_plain, idempotency_key)

    def _ingest(
        self,
        name: str,
        data: Rows,
        plan: Callable[[pa.Table, Table], _Plan],
        key: str | None,
        prepare: Callable[[pa.Table], pa.Table] | None = None,
    ) -> IngestResult:
        """Check, plan and commit one batch, unless its key is already recorded.

        ``prepare`` runs the checks that do not depend on the table's state (object
        reads) once; ``plan`` runs again after a lost commit race, as does the key
        lookup (the winner may have committed this very batch).
        """
        tdef = TABLES[name]
        with self._lock:
            tbl = self._load(name)
            batch = coerce_batch(tdef, data, tbl.schema(), fill_time=False)
            batch_sha = idempotency.batch_sha256(batch)
            if key is None:
                key = idempotency.derived_key(batch_sha)
            key = idempotency.check_key(key)
            batch = fill_time(tdef, batch)
            if name == "assets":
                self._repair_link_events(tbl)
            for attempt in range(_COMMIT_ATTEMPTS):
                if (prior := self._key_index(name).lookup(tbl.metadata, key)) is not None:
                    if prior.batch_sha256 not in (None, batch_sha):
                        log.warning(
                            "%s: key %r was recorded for other rows (batch %s, now %s); "
                            "nothing written",
                            name,
                            key,
                            prior.batch_sha256,
                            batch_sha,
                        )
                    return IngestResult.replay(name, prior)
                if prepare is not None:
                    batch, prepare = prepare(batch), None
                base = _snapshot_id(tbl)
                todo = plan(batch, tbl)
                if todo.rows.num_rows == 0:
                    if todo.verify is not None:
                        todo.verify()
                    return IngestResult(name, 0, todo.duplicates, 0, 0, base, idempotency_key=key)
                rows = conform(todo.rows, tbl.schema())
                counts = todo.counts(rows.num_rows)
                props = {
                    "vidlake.rows": str(rows.num_rows),
                    **idempotency.summary_properties(key, batch_sha, counts),
                }
                if todo.events is not None and todo.events.num_rows:
                    props[idempotency.PROP_EVENTS] = str(todo.events.num_rows)
                try:
                    fast_append(tbl, rows, props, alongside=todo.verify)
                except CommitFailedException:
                    # Another writer committed first: re-check against its state.
                    log.info("%s: concurrent commit, re-checking (attempt %d)", name, attempt + 1)
                    _backoff(attempt)
                    tbl = self._load(name)
                    continue
                except _BACKEND_ERRORS as exc:
                    raise StorageError(f"appending to {name} failed: {exc}", table=name) from exc
                snap = tbl.current_snapshot()
                assert snap is not None  # we just appended
                self._advance_cache(name, base, snap.parent_snapshot_id, snap.snapshot_id, rows)
                if todo.events is not None and todo.events.num_rows:
                    self._append_links(todo.events, snap.snapshot_id)
                return IngestResult(
                    name,
                    counts["inserted"],
                    counts["duplicates"],
                    counts["eval"],
                    0,
                    snap.snapshot_id,
                    counts["near_duplicates"],
                    idempotency_key=key,
                )
            raise Conflict(
                f"{name}: gave up after {_COMMIT_ATTEMPTS} concurrent commits", table=name
            )

    def _key_index(self, table: str) -> idempotency.KeyIndex:
        return self._keys.setdefault(table, idempotency.KeyIndex())

    def _append_links(self, events: pa.Table, assets_snapshot: int) -> None:
        """Append the near-duplicate events of an assets commit, once (a keyed commit,
        re-checked after a lost race). A failure loses nothing for good: the next
        ``add_assets`` re-derives them (:meth:`_repair_link_events`), and the assets'
        ``near_duplicates`` column holds every link meanwhile."""
        try:
            link_events.append_once(
                lambda: self._load("asset_events"),
                self._key_index("asset_events"),
                events,
                assets_snapshot,
                _COMMIT_ATTEMPTS,
            )
        except _EVENT_FAILURES as exc:
            log.warning("events of assets snapshot %d not recorded: %s", assets_snapshot, exc)

    def _repair_link_events(self, assets: Table) -> None:
        """Append the events of every assets commit whose events commit is missing
        (a writer killed between its two commits; see :mod:`catalog.link_events`)."""
        planned = self._key_index("assets")
        recorded = self._key_index("asset_events")
        for sid in link_events.missing(assets, planned, recorded, self._load("asset_events")):
            try:
                old, new = link_events.committed_batch(assets, sid)
            except _LINK_FAILURES as exc:  # a later add_assets tries again
                log.warning("re-deriving the events of assets snapshot %d failed: %s", sid, exc)
                continue
            events = link_events.rederive(old, self._cached("near_dup_events").data, new)
            log.warning("assets snapshot %d lost %d link events; re-derived", sid, len(events))
            self._append_links(events, sid)

    def _plan_plain(self, batch: pa.Table, tbl: Table) -> _Plan:
        return _Plan(batch)

    def _plan_clip_refs(self, batch: pa.Table, tbl: Table) -> _Plan:
        """Scores and captions: every row's clip exists."""
        # A clip has a few scores or captions at most: no dictionary (it costs more).
        at = _find_ids(self._cached("clips"), "clip_id", batch["clip_id"])
        if (row := _first_bad(at >= 0)) is not None:
            raise InvalidBatch(
                f"row {row}, field 'clip_id': unknown clip {batch['clip_id'][row]}",
                row=row,
                field="clip_id",
            )
        return _Plan(batch)

    def _plan_asset_refs(self, batch: pa.Table, tbl: Table) -> _Plan:
        assets = self._cached("assets")
        for col in ("asset_id", "related_asset_id"):
            if col in batch.column_names:
                known = _np(pc.is_null(batch[col])) | (
                    _find_ids(assets, "asset_id", batch[col]) >= 0
                )
                if (row := _first_bad(known)) is not None:
                    raise InvalidBatch(
                        f"row {row}, field {col!r}: unknown asset", row=row, field=col
                    )
        return _Plan(batch)

    def _plan_assets(self, batch: pa.Table, tbl: Table) -> _Plan:
        have = self._cached("assets", tbl)
        ids = batch["asset_id"]
        digests = rules.hex_prefix64(ids)
        dup = (have.find("asset_id", ids, digests) >= 0) | ~_first_occurrence(ids, digests)
        keep = np.flatnonzero(~dup)
        new = batch.take(pa.array(keep))
        if new.num_rows == 0:
            return _Plan(new, duplicates=len(batch))
        is_eval = rules.eval_mask(new["asset_id"], self.eval_salt, self.eval_fraction)
        if "split" in new.column_names:
            forced_train = _np(pc.fill_null(pc.equal(new["split"], "train"), False)) & is_eval
            if forced_train.any():
                row = int(keep[np.argmax(forced_train)])
                raise InvalidBatch(
                    f"row {row}, field 'split': the asset is carved into eval",
                    row=row,
                    field="split",
                )
            is_eval |= _np(pc.fill_null(pc.equal(new["split"], "eval"), False))
        dup_of, near, events = self._link_near_duplicates(new, have)
        rows = new.drop_columns(
            [c for c in ("split", "duplicate_of", "near_duplicates") if c in new.column_names]
        )
        rows = rows.append_column(
            "split", pa.array(np.where(is_eval, "eval", "train"), pa.large_string())
        )
        rows = rows.append_column("duplicate_of", dup_of).append_column("near_duplicates", near)
        return _Plan(
            rows,
            duplicates=len(batch) - new.num_rows,
            eval=int(is_eval.sum()),
            near_duplicates=new.num_rows - dup_of.null_count,
            events=events,
        )

    def _link_near_duplicates(
        self, new: pa.Table, have: _Cached
    ) -> tuple[pa.Array, pa.Array, pa.Table | None]:
        """``duplicate_of`` and ``near_duplicates`` of new assets, and the link events.

        The near-duplicate graph has an edge for every match ever recorded (each
        asset's ``near_duplicates``, ``duplicate_of``, and ``near_duplicate`` events);
        each connected group's canonical copy is :func:`rules.canonical_indices`.
        """
        m, n_old, rule = new.num_rows, have.data.num_rows, self._rule
        none = pa.nulls(m, pa.large_string()), pa.nulls(m, pa.large_list(pa.large_string()))
        fps = (
            new["fingerprint"]
            if "fingerprint" in new.column_names
            else pa.nulls(m, pa.large_binary())
        )
        q, q_len = rules.fingerprint_matrix(fps, rule.window)
        qi, ri = rules.near_duplicate_pairs(
            q, q_len, have.derived["frames"], have.derived["lengths"], rule
        )
        bi, bj = rules.near_duplicate_pairs(q, q_len, q, q_len, rule, same=True)
        if len(qi) == 0 and len(bi) == 0:
            return *none, None
        all_ids = _NodeIds(_combined(have.data["asset_id"]), _combined(new["asset_id"]))
        new_rate = _bitrates(new)

        def rate_of(nodes: NDArray[np.int64]) -> NDArray[np.float64]:
            old = nodes < n_old
            rate = np.empty(len(nodes), dtype=np.float64)
            rate[old] = have.derived["bitrate"][nodes[old]]
            rate[~old] = new_rate[nodes[~old] - n_old]
            return rate

        links = rules.plan_links(
            n_old, m, self._link_edges(have), (qi, ri), (bi, bj), rate_of, all_ids.take
        )
        dup_of = np.full(m, None, dtype=object)
        linked = links.duplicate_of >= 0
        dup_of[linked] = all_ids.take(links.duplicate_of[linked])
        events = link_events.event_rows(
            all_ids.take(links.event_asset), all_ids.take(links.event_canonical)
        )
        counts = np.bincount(links.match_owner, minlength=m)
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        values = pa.array(all_ids.take(links.match_other).tolist(), pa.large_string())
        near = pa.LargeListArray.from_arrays(offsets, values, mask=pa.array(counts == 0))
        return pa.array(dup_of.tolist(), pa.large_string()), near, events

    def _link_edges(self, have: _Cached) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Recorded near-duplicate edges among existing assets, as row indices."""
        events = self._cached("near_dup_events").data
        data = have.data
        return rules.link_edges(
            _combined(data["asset_id"]),
            data["near_duplicates"],
            data["duplicate_of"],
            events["asset_id"],
            events["related_asset_id"],
        )

    def _plan_clips(self, batch: pa.Table, tbl: Table) -> _Plan:
        given = batch["clip_id"] if "clip_id" in batch.column_names else None

        def verify() -> pa.Array:
            """The rule's clip ids; InvalidBatch where a given one disagrees."""
            computed = rules.clip_ids(
                batch["asset_id"],
                _np(batch["t_start_s"]),
                _np(batch["t_end_s"]),
                batch["split_version"],
            )
            if given is not None:
                agree = pc.or_kleene(pc.is_null(given), pc.equal(given, computed))
                if (row := _first_bad(agree)) is not None:
                    raise InvalidBatch(
                        f"row {row}, field 'clip_id': {given[row]} is not rules.clip_id("
                        f"asset_id, t_start_s, t_end_s, split_version) = {computed[row]}",
                        row=row,
                        field="clip_id",
                    )
            return computed

        if given is None or given.null_count:
            return self._plan_clip_rows(batch, tbl, verify())
        # Every id is given: plan with them and re-derive every one while the data file
        # is written (the hashing is Python, the write releases the GIL). A wrong id
        # still rejects the batch, and its error comes first, as if checked first.
        ids = _combined(given)
        try:
            todo = self._plan_clip_rows(batch, tbl, ids)
        except InvalidBatch:
            verify()
            raise
        todo.verify = verify
        return todo

    def _plan_clip_rows(self, batch: pa.Table, tbl: Table, ids: pa.Array) -> _Plan:
        """Clip rows with ``ids``: asset references, splits and duplicates."""
        assets = self._cached("assets")
        at = _find_refs(assets, "asset_id", batch["asset_id"])
        if (row := _first_bad(at >= 0)) is not None:
            raise InvalidBatch(
                f"row {row}, field 'asset_id': unknown asset", row=row, field="asset_id"
            )
        split = pc.take(assets.data["split"], pa.array(at))
        if "split" in batch.column_names:
            agree = pc.or_kleene(pc.is_null(batch["split"]), pc.equal(batch["split"], split))
            if (row := _first_bad(agree)) is not None:
                raise InvalidBatch(
                    f"row {row}, field 'split': differs from the asset's", row=row, field="split"
                )
        have = self._cached("clips", tbl)
        digests = rules.hex_prefix64(ids)
        dup = (have.find("clip_id", ids, digests) >= 0) | ~_first_occurrence(ids, digests)
        rows = batch.drop_columns([c for c in ("clip_id", "split") if c in batch.column_names])
        rows = rows.append_column("clip_id", ids).append_column("split", split)
        if dup.any():
            rows = rows.filter(pa.array(~dup))
        n_eval = int(pc.sum(pc.equal(rows["split"], "eval")).as_py() or 0)
        return _Plan(rows, duplicates=int(dup.sum()), eval=n_eval)

    def _prepare_latents(self, batch: pa.Table) -> pa.Table:
        """The state-free latent checks, once per batch: each object exists and holds
        the member's range, a whole-object member's hash is the object's, and every
        header agrees with its row (:mod:`catalog.latent_headers`). Returns the batch
        with ``length``, ``member_sha256`` and ``object_size`` filled from the store."""
        size = self._object_sizes(batch["object_sha256"])
        if (row := _first_bad(size >= 0)) is not None:
            raise InvalidBatch(
                f"row {row}, field 'object_sha256': not in the object store",
                row=row,
                field="object_sha256",
            )
        if "object_size" in batch.column_names:
            stated = _np(pc.fill_null(batch["object_size"], -1)).astype(np.int64)
            if (row := _first_bad((stated < 0) | (stated == size))) is not None:
                raise InvalidBatch(
                    f"row {row}, field 'object_size': the store holds {size[row]} bytes",
                    row=row,
                    field="object_size",
                )
        offset, length = member_ranges(batch, size)
        member = member_hashes(batch, (offset == 0) & (length == size))
        check_latent_headers(self.objects, batch, offset.tolist(), length.tolist())
        rows = batch.drop_columns(
            [c for c in ("length", "member_sha256", "object_size") if c in batch.column_names]
        )
        rows = rows.append_column("length", pa.array(length, pa.int64()))
        return rows.append_column("member_sha256", member).append_column(
            "object_size", pa.array(size, pa.int64())
        )

    def _plan_latents(self, batch: pa.Table, tbl: Table) -> _Plan:
        """Latents (after :meth:`_prepare_latents`): the clip exists; a latent already
        present (clip, rung, tokenizer, member SHA-256) is a duplicate."""
        known = _find_ids(self._cached("clips"), "clip_id", batch["clip_id"]) >= 0
        if (row := _first_bad(known)) is not None:
            raise InvalidBatch(
                f"row {row}, field 'clip_id': unknown clip", row=row, field="clip_id"
            )
        key = _latent_key(
            batch["clip_id"], batch["rung"], batch["tokenizer_version"], batch["member_sha256"]
        )
        have = self._cached("latents", tbl)
        digests = rules.hex_prefix64(batch["clip_id"])
        dup = (have.find("key", key, digests) >= 0) | ~_first_occurrence(key)
        return _Plan(batch.filter(pa.array(~dup)), duplicates=int(dup.sum()))

    def _object_sizes(self, shas: pa.ChunkedArray) -> NDArray[np.int64]:
        """Stored size of each row's object (-1 where absent), one ``head`` per object."""
        unique = pc.unique(shas)
        names = unique.to_pylist()
        store = self.objects

        def head(sha: str) -> Any:
            # An object adopted by reference (catalog.objects.refs: a TAR shard that
            # stays at its publisher's URL) counts as present at its referenced size.
            return resolve_head(store, sha)

        if len(names) > 8:
            with ThreadPoolExecutor(max_workers=_HEAD_WORKERS) as pool:
                infos = list(pool.map(head, names))
        else:
            infos = [head(s) for s in names]
        sizes = np.array([-1 if i is None else i.size for i in infos], dtype=np.int64)
        return sizes[_np(pc.index_in(shas, value_set=unique)).astype(np.int64)]

    # -- key caches -------------------------------------------------------------------
    def _load(self, name: str) -> Table:
        try:
            return self.iceberg.load_table(_ident(self.config.namespace, name))
        except NoSuchTableError as exc:
            raise NotFound(f"table {name!r} is missing from the catalog", table=name) from exc
        except _BACKEND_ERRORS as exc:
            raise StorageError(f"loading table {name} failed: {exc}", table=name) from exc

    def _reduce(self, spec: _Spec, rows: pa.Table) -> _Cached:
        """The cached form of a table's key rows (see ``_SPECS``); no snapshot yet."""
        digests = rules.hex_prefix64(rows[spec.digest_of]) if spec.digest_of else None
        index = rules.sorted_index(digests) if digests is not None else None
        if spec.name == "assets":
            frames, lengths = rules.fingerprint_matrix(rows["fingerprint"], self._rule.window)
            bitrate = _np(pc.cast(rows["probe_bitrate"], pa.float64(), safe=False)).astype(
                np.float64
            )
            data = rows.select(["asset_id", "split", "duplicate_of", "near_duplicates"])
            derived = {"frames": frames, "lengths": lengths, "bitrate": bitrate}
            return _Cached(None, data.combine_chunks(), derived, index)
        if spec.name == "latents":
            key = _latent_key(
                rows["clip_id"], rows["rung"], rows["tokenizer_version"], rows["member_sha256"]
            )
            return _Cached(None, pa.table({"key": key}), {}, index)
        return _Cached(None, rows.select(list(spec.keep)).combine_chunks(), {}, index)

    def _cached(self, name: str, tbl: Table | None = None) -> _Cached:
        """The key rows of a table at its current snapshot, read incrementally: only
        the files appended since the cached snapshot are scanned."""
        spec = _SPECS[name]
        tbl = tbl if tbl is not None else self._load(spec.table)
        current = _snapshot_id(tbl)
        entry = self._cache.get(name)
        if entry is not None and entry.snapshot_id == current:
            return entry
        try:
            if (
                entry is not None
                and entry.snapshot_id is not None
                and current is not None
                and _appends_only(tbl, entry.snapshot_id, current)
            ):
                added = tbl.incremental_append_scan(
                    from_snapshot_id_exclusive=entry.snapshot_id,
                    to_snapshot_id_inclusive=current,
                    row_filter=spec.row_filter,
                    selected_fields=spec.columns,
                ).to_arrow()
                entry = _merge(entry, current, self._reduce(spec, added))
            else:
                if current is None:
                    rows = arrow_schema(tbl.schema()).empty_table().select(list(spec.columns))
                else:
                    scan = tbl.scan(
                        row_filter=spec.row_filter,
                        selected_fields=spec.columns,
                        snapshot_id=current,
                    )
                    rows = scan.to_arrow()
                entry = self._reduce(spec, rows)
                entry.snapshot_id = current
        except _BACKEND_ERRORS as exc:
            raise StorageError(f"reading {spec.table} failed: {exc}", table=spec.table) from exc
        self._cache[name] = entry
        return entry

    def _advance_cache(
        self, table: str, base: int | None, parent: int | None, new: int, rows: pa.Table
    ) -> None:
        """After our own append: extend the caches of ``table`` with the rows we wrote,
        when nobody else committed in between (else drop them; the next read rescans)."""
        for name, spec in _SPECS.items():
            if spec.table != table:
                continue
            entry = self._cache.get(name)
            if entry is None:
                continue
            if entry.snapshot_id == base == parent and isinstance(spec.row_filter, AlwaysTrue):
                self._cache[name] = _merge(
                    entry, new, self._reduce(spec, rows.select(list(spec.columns)))
                )
            else:
                del self._cache[name]

    # -- reads ------------------------------------------------------------------------
    def pin(self, embeddings: Sequence[str] = ()) -> Pin:
        """The current snapshot id of every table: a consistent state to read at.

        Args:
            embeddings: Embedding model versions whose current LanceDB table version
                the pin also records (None for a model without a table).
        """
        pin = Pin({name: _snapshot_id(self._load(name)) for name in TABLE_NAMES})
        if not embeddings:
            return pin
        from catalog.embeddings import current_versions

        return pin.with_embeddings(current_versions(self.config.lance, embeddings))

    def scan(
        self,
        table: str,
        pin: Pin | None = None,
        columns: Sequence[str] | None = None,
        row_filter: str | BooleanExpression | None = None,
        *,
        include_eval: bool = False,
    ) -> pa.Table:
        """Read a table at a pin (the current state when None) into one Arrow table.

        Args:
            table: Table name.
            pin: The state to read; None pins the current one.
            columns: Columns to return (all when None).
            row_filter: A pyiceberg filter (string such as ``"score > 0.5"`` or expression).
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
        row_filter: str | BooleanExpression | None = None,
        *,
        include_eval: bool = False,
    ) -> pa.RecordBatchReader:
        """:meth:`scan` as a stream of record batches (bounded memory).

        A pin reads with the schema its snapshot was written with. Without a pin the
        current schema applies: columns added after the current snapshot read as nulls.
        """
        current = pin is None
        pin = pin if pin is not None else self.pin()
        tbl = self.iceberg_table(table)  # loaded after the pin: it knows the pinned snapshot
        sid = pin[table]
        if sid is not None and tbl.metadata.snapshot_by_id(sid) is None:
            raise NotFound(
                f"{table} has no snapshot {sid} (expired?)", table=table, snapshot_id=sid
            )
        written = _schema_at(tbl, sid)
        schema = tbl.schema() if current else written
        wanted = list(columns) if columns is not None else [f.name for f in schema.fields]
        unknown = [c for c in wanted if c not in schema.column_names]
        if unknown:
            raise InvalidInput(f"{table} has no columns {unknown}", field="columns")
        out_schema = arrow_schema(schema)
        if sid is None:
            return pa.RecordBatchReader.from_batches(
                pa.schema([out_schema.field(c) for c in wanted]), iter(())
            )
        expr = _filter(row_filter)
        drop_eval: pa.Array | None = None
        key = None
        if not include_eval:
            if table in ("assets", "clips"):
                expr = And(expr, _pred(NotEqualTo, "split", "eval"))
            elif table in ("latents", "scores", "captions", "tombstones", "asset_events"):
                key = "clip_id" if table in ("latents", "scores", "captions") else "asset_id"
                drop_eval = self._eval_ids("clips" if key == "clip_id" else "assets", key, pin)
        read = [c for c in wanted if c in written.column_names]
        read += [key] if key and key not in read else []
        try:
            reader = tbl.scan(
                row_filter=expr, selected_fields=tuple(read), snapshot_id=sid
            ).to_arrow_batch_reader()
        except ValueError as exc:  # a filter naming an unknown column, a bad literal
            raise InvalidInput(f"bad row filter for {table}: {exc}", field="row_filter") from exc
        if (drop_eval is None or len(drop_eval) == 0) and read == wanted:
            return reader
        fields = [
            reader.schema.field(c) if c in read else out_schema.field(c).with_nullable(True)
            for c in wanted
        ]

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in reader:
                if drop_eval is not None and len(drop_eval) and key is not None:
                    batch = batch.filter(pc.invert(pc.is_in(batch[key], value_set=drop_eval)))
                arrays = [
                    batch[f.name] if f.name in read else pa.nulls(batch.num_rows, f.type)
                    for f in fields
                ]
                yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

        return pa.RecordBatchReader.from_batches(pa.schema(fields), batches())

    def _eval_ids(self, table: str, key: str, pin: Pin) -> pa.Array:
        """Ids of eval assets (or clips) at the pin."""
        sid = pin[table]
        if sid is None:
            return pa.array([], pa.large_string())
        tbl = self.iceberg_table(table)
        rows = tbl.scan(
            row_filter=_pred(EqualTo, "split", "eval"), selected_fields=(key,), snapshot_id=sid
        ).to_arrow()
        return _combined(rows[key])

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
        rows = self.scan("scores", pin, include_eval=include_eval)
        if versions:
            names = pa.array(list(versions), pa.large_string())
            wanted = pa.array([str(versions[n]) for n in versions], pa.large_string())
            at = pc.index_in(rows["filter_name"], value_set=names)
            keep = pc.or_kleene(
                pc.is_null(at), pc.equal(rows["filter_version"], pc.take(wanted, at))
            )
            rows = rows.filter(pc.fill_null(keep, True))
        return rules.latest_rows(
            rows,
            keys=("clip_id", "filter_name"),
            order=[(c, "descending") for c in ("computed_at", "filter_version", "score", "job_id")],
        )

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
        expr: BooleanExpression = AlwaysTrue()
        if version is not None:
            expr = And(expr, _pred(EqualTo, "caption_version", version))
        if kinds is not None:
            expr = And(expr, _pred(In, "kind", list(kinds)))
        rows = self.scan("captions", pin, row_filter=expr, include_eval=include_eval)
        return rules.latest_rows(
            rows,
            keys=("clip_id", "kind"),
            order=[(c, "descending") for c in ("ingested_at", "caption_version", "text", "job_id")],
        )

    def asset_status(self, pin: Pin | None = None, *, include_eval: bool = False) -> pa.Table:
        """Governance state of every asset at the pin, one row each.

        Columns: ``asset_id``, ``split``, ``tombstoned`` (bool), ``tombstone_kind``
        (``hard`` if any hard takedown, else ``soft``, null when none), ``quarantined``
        (the latest quarantined/released event wins; a tie quarantines),
        ``duplicate_of`` (the canonical copy of the asset's near-duplicate group, null
        for a canonical or unlinked asset), ``near_dup_of_eval`` (the group holds an eval
        asset: a train asset that must not enter a training cut).
        """
        pin = pin if pin is not None else self.pin()
        assets = self.scan(
            "assets",
            pin,
            ["asset_id", "split", "probe_bitrate", "duplicate_of", "near_duplicates"],
            include_eval=True,
        )
        tombs = self.scan("tombstones", pin, ["asset_id", "kind"], include_eval=True)
        events = self.scan(
            "asset_events", pin, ["asset_id", "event", "related_asset_id", "at"], include_eval=True
        )
        status = rules.asset_status(assets, tombs, events)
        if not include_eval:
            status = status.filter(pc.not_equal(status["split"], "eval"))
        return status


# -- module helpers -------------------------------------------------------------------
def _pred(kind: type[Any], column: str, value: Any) -> BooleanExpression:
    """A pyiceberg predicate (its pydantic signature defeats mypy's reading)."""
    expr: BooleanExpression = kind(column, value)
    return expr


@dataclass(frozen=True)
class _Spec:
    """A cached key view of a table: the columns read and the rows kept."""

    name: str
    table: str
    columns: tuple[str, ...]
    keep: tuple[str, ...]
    row_filter: BooleanExpression = field(default_factory=AlwaysTrue)
    digest_of: str | None = None


_SPECS: dict[str, _Spec] = {
    s.name: s
    for s in (
        _Spec(
            "assets",
            "assets",
            (
                "asset_id",
                "split",
                "probe_bitrate",
                "duplicate_of",
                "near_duplicates",
                "fingerprint",
            ),
            (),
            digest_of="asset_id",
        ),
        _Spec("clips", "clips", ("clip_id",), ("clip_id",), digest_of="clip_id"),
        _Spec(
            "latents",
            "latents",
            ("clip_id", "rung", "tokenizer_version", "member_sha256"),
            (),
            digest_of="clip_id",
        ),
        _Spec(
            "near_dup_events",
            "asset_events",
            ("asset_id", "related_asset_id", "event"),
            ("asset_id", "related_asset_id"),
            _pred(EqualTo, "event", "near_duplicate"),
        ),
    )
}


class _NodeIds:
    """Asset ids of graph nodes: existing rows first, then the batch's."""

    def __init__(self, old: pa.Array, new: pa.Array) -> None:
        self.old, self.new = old, new

    def take(self, nodes: NDArray[np.int64]) -> NDArray[np.str_]:
        n_old = len(self.old)
        out = np.empty(len(nodes), dtype="U64")
        is_old = nodes < n_old
        out[is_old] = self.old.take(pa.array(nodes[is_old])).to_pylist()
        out[~is_old] = self.new.take(pa.array(nodes[~is_old] - n_old)).to_pylist()
        return out


def _combined(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _merge(entry: _Cached, snapshot_id: int, part: _Cached) -> _Cached:
    """``entry`` extended with rows appended after it (``part``, from ``_reduce``)."""
    merged = pa.concat_tables([entry.data, part.data.cast(entry.data.schema)])
    if merged.column(0).num_chunks > 64:  # keep takes cheap without copying every time
        merged = merged.combine_chunks()
    arrays = {k: np.concatenate([entry.derived[k], part.derived[k]]) for k in entry.derived}
    index = entry.index
    if index is not None and part.index is not None:
        index = rules.index_merge(index, part.index, entry.data.num_rows)
    return _Cached(snapshot_id, merged, arrays, index)


def _schema_at(tbl: Table, snapshot_id: int | None) -> Schema:
    """The schema a snapshot was written with (the current one for an empty table)."""
    snap = tbl.metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    if snap is not None and snap.schema_id is not None:
        for schema in tbl.metadata.schemas:
            if schema.schema_id == snap.schema_id:
                return schema
    return tbl.schema()


def _snapshot_id(tbl: Table) -> int | None:
    snap = tbl.current_snapshot()
    return None if snap is None else snap.snapshot_id


def _appends_only(tbl: Table, since: int, until: int) -> bool:
    """Whether ``since`` is an ancestor of ``until`` with only appends in between."""
    snap = tbl.metadata.snapshot_by_id(until)
    while snap is not None:
        if snap.snapshot_id == since:
            return True
        if snap.summary is None or snap.summary.operation != Operation.APPEND:
            return False
        parent = snap.parent_snapshot_id
        snap = tbl.metadata.snapshot_by_id(parent) if parent is not None else None
    return False


def _filter(row_filter: str | BooleanExpression | None) -> BooleanExpression:
    if row_filter is None:
        return AlwaysTrue()
    if isinstance(row_filter, str):
        try:
            return parse_filter(row_filter)
        except Exception as exc:  # pyparsing's ParseException and friends
            raise InvalidInput(
                f"cannot parse row filter {row_filter!r}: {exc}", field="row_filter"
            ) from exc
    return row_filter


def _latent_key(*cols: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One string per latent: clip, rung, tokenizer, member SHA-256 (unit-separated)."""
    joined = pc.binary_join_element_wise(
        *(c.cast(pa.large_string()) for c in cols), pa.scalar("\x1f", pa.large_string())
    )
    return _combined(joined)


def _bitrates(rows: pa.Table) -> NDArray[np.float64]:
    if "probe_bitrate" not in rows.column_names:
        return np.full(rows.num_rows, np.nan)
    return _np(pc.cast(rows["probe_bitrate"], pa.float64(), safe=False)).astype(np.float64)


def _warehouse(location: str) -> str:
    """A warehouse location pyiceberg understands; a local directory is created."""
    if "://" in location and not location.startswith("file://"):
        return location.rstrip("/")
    path = Path(location.removeprefix("file://")).absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


def _io_properties(config: CatalogConfig) -> dict[str, str]:
    import os

    props: dict[str, str] = {}
    if config.warehouse.startswith("s3://"):
        endpoint = config.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            props["s3.endpoint"] = endpoint
        if config.s3_path_style is not None:
            props["s3.force-virtual-addressing"] = str(not config.s3_path_style).lower()
        # Without a region pyiceberg asks AWS where the bucket lives: a network call
        # that is wrong for a compatible endpoint and hangs where AWS is unreachable.
        region = (
            config.s3_region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or ("us-east-1" if endpoint else None)
        )
        if region:
            props["s3.region"] = region
    props.update(config.iceberg_properties)
    return props


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    """Every SQLite connection waits for locks (busy timeout) instead of failing, and
    the file is in WAL mode so readers never block the writer."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _connect(config: CatalogConfig) -> Catalog:
    """The pyiceberg catalog for ``config.uri``."""
    props = {"warehouse": _warehouse(config.warehouse), **_io_properties(config)}
    if config.uri.startswith("rest:"):
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("vidlake", **{"uri": config.uri.removeprefix("rest:"), **props})
    import sqlite3

    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    try:
        url = make_url(config.uri)
    except Exception as exc:  # sqlalchemy's ArgumentError
        raise InvalidInput(f"not a catalog URI: {config.uri!r}", field="uri") from exc
    is_sqlite = url.get_backend_name() == "sqlite"
    if is_sqlite:
        db = url.database or ""
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).parent.mkdir(parents=True, exist_ok=True)
            # WAL is a property of the file: set it before the first SQLAlchemy
            # connection, so that even pyiceberg's table creation runs in WAL mode.
            with sqlite3.connect(db, timeout=_SQLITE_BUSY_MS / 1000) as conn:
                conn.execute("PRAGMA journal_mode = WAL")
            conn.close()
        url = url.update_query_dict({"timeout": str(_SQLITE_BUSY_MS / 1000)})
    catalog = SqlCatalog("vidlake", uri=url.render_as_string(hide_password=False), **props)
    if is_sqlite:
        event.listen(catalog.engine, "connect", _sqlite_on_connect)
        catalog.engine.dispose()  # reconnect through the listener from now on
    return catalog


def _freeze_namespace(iceberg: Catalog, config: CatalogConfig) -> tuple[float, str]:
    """Create the namespace with the eval settings, or read the frozen ones."""
    ns = config.namespace
    try:
        props = iceberg.load_namespace_properties(ns)
    except NoSuchNamespaceError:
        fresh = {
            PROP_EVAL_FRACTION: repr(
                config.eval_fraction if config.eval_fraction is not None else DEFAULT_EVAL_FRACTION
            ),
            PROP_EVAL_SALT: config.eval_salt.lower() if config.eval_salt else rules.new_eval_salt(),
            PROP_CREATED_AT: dt.datetime.now(dt.UTC).isoformat(),
        }
        with contextlib.suppress(*_CREATE_RACES):  # a racing process won: its settings hold
            iceberg.create_namespace(ns, fresh)
        props = iceberg.load_namespace_properties(ns)
    if PROP_EVAL_FRACTION not in props or PROP_EVAL_SALT not in props:
        raise Conflict(
            f"namespace {ns!r} exists without vidlake's frozen eval settings",
            namespace=ns,
        )
    fraction, salt = float(props[PROP_EVAL_FRACTION]), props[PROP_EVAL_SALT]
    if config.eval_fraction is not None and config.eval_fraction != fraction:
        raise Conflict(
            f"eval_fraction {config.eval_fraction} differs from the catalog's frozen {fraction}",
            field="eval_fraction",
            frozen=fraction,
        )
    if config.eval_salt is not None and config.eval_salt.lower() != salt:
        raise Conflict("eval_salt differs from the catalog's frozen salt", field="eval_salt")
    return fraction, salt
