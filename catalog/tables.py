"""The catalog's tables: explicit Iceberg schemas, partition specs, and row checks.

A declarations module (about 550 lines, over the ~500 of the others): one
:class:`TableDef` per table with every field, its id, doc and check, so that a reader
sees each table whole; the builders of the row checks sit beside them.

Every table of DESIGN.md is declared here once, with field ids (in the order pyiceberg
assigns them at creation: top-level fields first, then nested element ids), required
and optional fields, and a partition spec where it pays:

========= ============================ ==============================================
table     partitioned by               why
========= ============================ ==============================================
scores    ``identity(filter_name)``    a recipe reads a few filters of many
latents   ``identity(rung)``           a phase reads one rung
captions  ``identity(caption_version)`` a recipe reads one caption version
========= ============================ ==============================================

The other tables are small or always read whole. :func:`arrow_schema` gives the Arrow
schema that matches an Iceberg schema (required fields are non-nullable).

Each check is a vectorised predicate (true or null for a good row);
:func:`catalog.coerce.coerce_batch` runs them on a producer's batch. Checks against the
catalog (duplicates, references, objects) live in :mod:`catalog.ingest`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from catalog import names, row_groups
from catalog.errors import Conflict
from catalog.rules import FRAME_BYTES
from catalog.table_names import EVAL_SPLIT, TABLE_NAMES, TRAIN_SPLIT

__all__ = [
    "EVENTS",
    "FORMATS",
    "SOURCE_TIERS",
    "TABLES",
    "TABLE_NAMES",
    "TOMBSTONE_KINDS",
    "TableDef",
    "arrow_schema",
    "ensure_table",
]

SOURCE_TIERS = ("licensed", "crawl", "synthetic")
SPLITS = (TRAIN_SPLIT, EVAL_SPLIT)
EVENTS = ("quarantined", "released", "near_duplicate")
TOMBSTONE_KINDS = ("soft", "hard")
FORMATS = ("safetensors", "pt", "npy")
#: ``probe`` sub-fields accepted as a nested dict/struct and stored flattened.
PROBE_FIELDS = ("container", "codec", "width", "height", "fps", "duration_s", "bitrate")

Check = Callable[[pa.Table], pa.ChunkedArray | pa.Array]


def _f(
    fid: int, name: str, typ: Any, required: bool = False, doc: str | None = None
) -> NestedField:
    return NestedField(field_id=fid, name=name, field_type=typ, required=required, doc=doc)


def _strings(element_id: int) -> ListType:
    return ListType(element_id=element_id, element=StringType(), element_required=True)


@dataclass(frozen=True)
class TableDef:
    """One catalog table: its schema and the rules for a batch of its rows.

    Attributes:
        name: Table name in the namespace.
        schema: The Iceberg schema (explicit field ids).
        partition_by: Source columns of identity partition fields.
        time_column: Timestamp filled with the ingest time where absent.
        defaults: Values filled where a column is absent or null.
        derived: Columns the catalog fills (the producer may leave them out, even the
            required ones).
        checks: ``(field, predicate)``: the predicate is true (or null) for good rows.
        json_columns: String columns that must hold JSON.
        dedup: Whether re-ingesting a row with the same key is a duplicate.
    """

    name: str
    schema: Schema
    partition_by: tuple[str, ...] = ()
    time_column: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    derived: frozenset[str] = frozenset()
    checks: tuple[tuple[str, Check], ...] = ()
    json_columns: tuple[str, ...] = ()
    dedup: bool = False

    def partition_spec(self) -> PartitionSpec:
        """The identity partition spec over ``partition_by`` (ids from 1000)."""
        fields = [
            PartitionField(
                source_id=self.schema.find_field(col).field_id,
                field_id=1000 + i,
                transform=IdentityTransform(),
                name=col,
            )
            for i, col in enumerate(self.partition_by)
        ]
        return PartitionSpec(*fields)

    def properties(self) -> dict[str, str]:
        """Iceberg table properties set at creation."""
        props = {
            "write.parquet.compression-codec": "zstd",
            "write.parquet.compression-level": "1",
            # Small row groups for the tables a point lookup (lineage of one clip)
            # reads by key: it decodes one row group (catalog.row_groups).
            row_groups.PROPERTY: str(row_groups.limit_for(self.name)),
            "vidlake.table": self.name,
        }
        if self.dedup:
            # A retried commit must re-check duplicates against the new state, which
            # pyiceberg's own retry cannot do; the catalog retries instead.
            props["commit.retry.num-retries"] = "0"
        return props


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema matching an Iceberg schema (required → non-nullable)."""
    return schema_to_pyarrow(schema, include_field_ids=False)


# -- vectorised predicates (true or null = good row) -------------------------------------
def _hex(col: str, n: int) -> Check:
    def check(t: pa.Table) -> pa.ChunkedArray | pa.Array:
        # A regex costs ~8 ms per 100k ids; checking the lengths and every byte with
        # numpy costs ~1 ms. Only a batch that fails it pays for the regex, which then
        # names the row (null rows count as good either way).
        if _all_hex(t[col], n):
            return pa.nulls(t.num_rows, pa.bool_()).fill_null(True)
        return pc.match_substring_regex(t[col], f"^[0-9a-f]{{{n}}}$")

    return check


def _all_hex(values: pa.ChunkedArray | pa.Array, n: int) -> bool:
    """Whether every non-null value is exactly ``n`` lowercase hex characters (False
    may also mean "not sure": the caller then checks value by value)."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for arr in chunks:
        if len(arr) == 0:
            continue
        if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
            return False
        width = np.int64 if pa.types.is_large_string(arr.type) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width)
        offsets = offsets[arr.offset : arr.offset + len(arr) + 1]
        lengths = np.diff(offsets)
        if arr.null_count:
            lengths = lengths[np.asarray(arr.is_valid())]
        if not (lengths == n).all():
            return False
        # Every byte between the first and last offset: null slots' bytes (normally
        # none) must be hex too, else the exact check decides.
        data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
        # In cache-sized pieces: whole-column temporaries cost ~4x (page faults).
        for start in range(0, len(data), _PIECE):
            d = data[start : start + _PIECE]
            if not (((d >= 48) & (d <= 57)) | ((d >= 97) & (d <= 102))).all():
                return False
    return True


_PIECE = 1 << 16


def _nonempty(col: str) -> Check:
    return lambda t: pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(t[col])), 0)


def _named(col: str, pattern: str) -> Check:
    """The value has the shape a recipe names it by (:mod:`catalog.names`). A batch
    holds a few distinct names: the regex runs on those, and on every row only when
    one fails (to name the row)."""

    def check(t: pa.Table) -> pa.ChunkedArray | pa.Array:
        distinct = pc.unique(t[col]).drop_null()
        if pc.all(pc.match_substring_regex(distinct, pattern)).as_py() is not False:
            return pa.nulls(t.num_rows, pa.bool_()).fill_null(True)
        return pc.match_substring_regex(t[col], pattern)

    return check


def _version(col: str) -> Check:
    """A version a recipe can name: 1-200 characters, not blank."""
    return lambda t: pc.and_kleene(
        _nonempty(col)(t), pc.less_equal(pc.utf8_length(t[col]), names.VERSION_MAX_LENGTH)
    )


def _one_of(col: str, values: Sequence[str]) -> Check:
    return lambda t: pc.or_kleene(pc.is_null(t[col]), pc.is_in(t[col], value_set=pa.array(values)))


def _cmp(col: str, op: str, value: float) -> Check:
    fn = {"ge": pc.greater_equal, "gt": pc.greater}[op]
    # safe=False: an int64 beyond 2**53 is still finite (a safe cast would raise).
    return lambda t: pc.and_kleene(
        fn(t[col], value), pc.is_finite(pc.cast(t[col], pa.float64(), safe=False))
    )


def _absent(col: str) -> Check:
    return lambda t: pc.is_null(t[col])


def _fingerprint_ok(t: pa.Table) -> pa.ChunkedArray:
    n = pc.binary_length(t["fingerprint"])
    return pc.and_(pc.greater(n, 0), pc.equal(pc.bit_wise_and(n, FRAME_BYTES - 1), 0))


def _clip_after_start(t: pa.Table) -> pa.ChunkedArray:
    return pc.and_(pc.greater(t["t_end_s"], t["t_start_s"]), pc.is_finite(t["t_end_s"]))


def _related_when_near_dup(t: pa.Table) -> pa.ChunkedArray:
    is_link = pc.equal(t["event"], "near_duplicate")
    return pc.or_(pc.invert(is_link), pc.is_valid(t["related_asset_id"]))


def _same_length_as_keys(col: str) -> Check:
    return lambda t: pc.equal(pc.list_value_length(t[col]), pc.list_value_length(t["tensor_keys"]))


# -- the tables -----------------------------------------------------------------------
ASSETS = TableDef(
    name="assets",
    schema=Schema(
        _f(1, "asset_id", StringType(), True, "SHA-256 (lowercase hex) of the asset's bytes"),
        _f(2, "uri", StringType(), True),
        _f(3, "size", LongType(), True),
        _f(4, "source", StringType()),
        _f(5, "source_tier", StringType(), True, "licensed | crawl | synthetic"),
        _f(6, "license_id", StringType()),
        _f(7, "territory", StringType()),
        _f(8, "opt_out", BooleanType(), True),
        _f(9, "pii_class", StringType()),
        _f(10, "provenance", StringType(), doc="JSON"),
        _f(11, "probe_container", StringType()),
        _f(12, "probe_codec", StringType()),
        _f(13, "probe_width", IntegerType()),
        _f(14, "probe_height", IntegerType()),
        _f(15, "probe_fps", DoubleType()),
        _f(16, "probe_duration_s", DoubleType()),
        _f(17, "probe_bitrate", LongType(), doc="bits per second"),
        _f(18, "fingerprint", BinaryType(), doc="64-bit perceptual frame hashes, big-endian"),
        _f(19, "split", StringType(), True, "train | eval, fixed at ingest"),
        _f(20, "duplicate_of", StringType(), doc="canonical near-duplicate at ingest time"),
        _f(21, "near_duplicates", _strings(23), doc="assets this one matched at ingest"),
        _f(22, "ingested_at", TimestamptzType(), True),
        identifier_field_ids=[1],
    ),
    time_column="ingested_at",
    defaults={"opt_out": False},
    derived=frozenset({"split", "duplicate_of", "near_duplicates"}),
    checks=(
        ("asset_id", _hex("asset_id", 64)),
        ("uri", _nonempty("uri")),
        ("size", _cmp("size", "ge", 0)),
        ("source_tier", _one_of("source_tier", SOURCE_TIERS)),
        ("probe_width", _cmp("probe_width", "gt", 0)),
        ("probe_height", _cmp("probe_height", "gt", 0)),
        ("probe_fps", _cmp("probe_fps", "gt", 0)),
        ("probe_duration_s", _cmp("probe_duration_s", "ge", 0)),
        ("probe_bitrate", _cmp("probe_bitrate", "ge", 0)),
        ("fingerprint", _fingerprint_ok),
        ("split", _one_of("split", SPLITS)),
        ("duplicate_of", _absent("duplicate_of")),
        ("near_duplicates", _absent("near_duplicates")),
    ),
    json_columns=("provenance",),
    dedup=True,
)

ASSET_EVENTS = TableDef(
    name="asset_events",
    schema=Schema(
        _f(1, "asset_id", StringType(), True),
        _f(2, "event", StringType(), True, "quarantined | released | near_duplicate"),
        _f(3, "related_asset_id", StringType(), doc="near_duplicate: the canonical copy"),
        _f(4, "reason", StringType()),
        _f(5, "details", StringType(), doc="JSON"),
        _f(6, "actor", StringType()),
        _f(7, "job_id", StringType()),
        _f(8, "at", TimestamptzType(), True),
    ),
    time_column="at",
    checks=(
        ("asset_id", _hex("asset_id", 64)),
        ("event", _one_of("event", EVENTS)),
        ("related_asset_id", _hex("related_asset_id", 64)),
        ("related_asset_id", _related_when_near_dup),
    ),
    json_columns=("details",),
)

TOMBSTONES = TableDef(
    name="tombstones",
    schema=Schema(
        _f(1, "asset_id", StringType(), True),
        _f(2, "reason", StringType(), True),
        _f(3, "kind", StringType(), True, "soft | hard"),
        _f(4, "requested_by", StringType()),
        _f(5, "at", TimestamptzType(), True),
    ),
    time_column="at",
    checks=(
        ("asset_id", _hex("asset_id", 64)),
        ("reason", _nonempty("reason")),
        ("kind", _one_of("kind", TOMBSTONE_KINDS)),
    ),
)

CLIPS = TableDef(
    name="clips",
    schema=Schema(
        _f(
            1,
            "clip_id",
            StringType(),
            True,
            "rules.clip_id(asset_id, t_start_s, t_end_s, split_version)",
        ),
        _f(2, "asset_id", StringType(), True),
        _f(3, "t_start_s", DoubleType(), True),
        _f(4, "t_end_s", DoubleType(), True),
        _f(5, "split_version", StringType(), True, "version of the scene splitter"),
        _f(6, "fps", DoubleType()),
        _f(7, "num_frames", IntegerType(), True),
        _f(8, "width", IntegerType(), True),
        _f(9, "height", IntegerType(), True),
        _f(10, "aspect_bucket", StringType()),
        _f(11, "split", StringType(), True, "the asset's split"),
        _f(12, "job_id", StringType()),
        _f(13, "metadata", StringType(), doc="JSON: importer sidecar fields"),
        _f(14, "ingested_at", TimestamptzType(), True),
        identifier_field_ids=[1],
    ),
    time_column="ingested_at",
    derived=frozenset({"clip_id", "split"}),
    checks=(
        ("clip_id", _hex("clip_id", 32)),
        ("asset_id", _hex("asset_id", 64)),
        ("t_start_s", _cmp("t_start_s", "ge", 0)),
        ("t_end_s", _clip_after_start),
        ("split_version", _nonempty("split_version")),
        ("fps", _cmp("fps", "gt", 0)),
        ("num_frames", _cmp("num_frames", "gt", 0)),
        ("width", _cmp("width", "gt", 0)),
        ("height", _cmp("height", "gt", 0)),
        ("split", _one_of("split", SPLITS)),
    ),
    json_columns=("metadata",),
    dedup=True,
)

LATENTS = TableDef(
    name="latents",
    schema=Schema(
        _f(1, "clip_id", StringType(), True),
        _f(2, "rung", StringType(), True, "resolution rung, e.g. 256p"),
        _f(3, "tokenizer_version", StringType(), True),
        _f(4, "format", StringType(), True, "safetensors | pt | npy"),
        _f(5, "object_sha256", StringType(), True),
        _f(6, "object_size", LongType(), doc="size of the whole object"),
        _f(7, "offset", LongType(), True),
        _f(8, "length", LongType(), True),
        _f(9, "member_sha256", StringType(), True, "SHA-256 of bytes [offset, offset+length)"),
        _f(10, "tensor_keys", _strings(17), True),
        _f(
            11,
            "shapes",
            ListType(
                element_id=18,
                element=ListType(element_id=19, element=LongType(), element_required=True),
                element_required=True,
            ),
        ),
        _f(12, "dtypes", _strings(20)),
        _f(13, "latent_frames", IntegerType()),
        _f(14, "tokens", LongType(), True),
        _f(15, "job_id", StringType()),
        _f(16, "ingested_at", TimestamptzType(), True),
    ),
    partition_by=("rung",),
    time_column="ingested_at",
    defaults={"offset": 0},
    derived=frozenset({"length", "member_sha256"}),
    checks=(
        ("clip_id", _hex("clip_id", 32)),
        ("rung", _named("rung", names.RUNG)),
        ("tokenizer_version", _version("tokenizer_version")),
        ("format", _one_of("format", FORMATS)),
        ("object_sha256", _hex("object_sha256", 64)),
        ("object_size", _cmp("object_size", "ge", 0)),
        ("offset", _cmp("offset", "ge", 0)),
        ("length", _cmp("length", "gt", 0)),
        ("member_sha256", _hex("member_sha256", 64)),
        ("tensor_keys", lambda t: pc.greater(pc.list_value_length(t["tensor_keys"]), 0)),
        ("shapes", _same_length_as_keys("shapes")),
        ("dtypes", _same_length_as_keys("dtypes")),
        ("latent_frames", _cmp("latent_frames", "gt", 0)),
        ("tokens", _cmp("tokens", "ge", 0)),
    ),
    dedup=True,
)

SCORES = TableDef(
    name="scores",
    schema=Schema(
        _f(1, "clip_id", StringType(), True),
        _f(2, "filter_name", StringType(), True),
        _f(3, "filter_version", StringType(), True),
        _f(4, "score", DoubleType(), True),
        _f(5, "job_id", StringType()),
        _f(6, "computed_at", TimestamptzType(), True),
    ),
    partition_by=("filter_name",),
    time_column="computed_at",
    checks=(
        ("clip_id", _hex("clip_id", 32)),
        ("filter_name", _named("filter_name", names.NAME)),
        ("filter_version", _version("filter_version")),
        ("score", lambda t: pc.is_finite(t["score"])),
    ),
)

CAPTIONS = TableDef(
    name="captions",
    schema=Schema(
        _f(1, "clip_id", StringType(), True),
        _f(2, "caption_version", StringType(), True),
        _f(3, "kind", StringType(), True, "dense | short | ..."),
        _f(4, "text", StringType(), True),
        _f(5, "text_embedding_sha256", StringType()),
        _f(6, "model_version", StringType()),
        _f(7, "job_id", StringType()),
        _f(8, "ingested_at", TimestamptzType(), True),
    ),
    partition_by=("caption_version",),
    time_column="ingested_at",
    checks=(
        ("clip_id", _hex("clip_id", 32)),
        ("caption_version", _version("caption_version")),
        ("kind", _named("kind", names.NAME)),
        ("text", _nonempty("text")),
        ("text_embedding_sha256", _hex("text_embedding_sha256", 64)),
    ),
)

JOBS = TableDef(
    name="jobs",
    schema=Schema(
        _f(1, "job_id", StringType(), True),
        _f(
            2,
            "stage",
            StringType(),
            True,
            "decode | split | filter | caption | encode | import ...",
        ),
        _f(3, "status", StringType()),
        _f(4, "code_version", StringType()),
        _f(5, "model_versions", StringType(), doc="JSON object"),
        _f(6, "started_at", TimestamptzType()),
        _f(7, "finished_at", TimestamptzType()),
        _f(8, "host", StringType()),
        _f(9, "counts", StringType(), doc="JSON object"),
        _f(10, "provenance", StringType(), doc="JSON"),
        _f(11, "ingested_at", TimestamptzType(), True),
    ),
    time_column="ingested_at",
    checks=(("job_id", _nonempty("job_id")), ("stage", _nonempty("stage"))),
    json_columns=("model_versions", "counts", "provenance"),
)

TABLES: Mapping[str, TableDef] = {
    t.name: t for t in (ASSETS, ASSET_EVENTS, TOMBSTONES, CLIPS, LATENTS, SCORES, CAPTIONS, JOBS)
}
if tuple(TABLES) != TABLE_NAMES:  # catalog.table_names declares them for light importers
    raise ImportError(f"catalog.tables declares {tuple(TABLES)}, table_names {TABLE_NAMES}")


def ensure_table(iceberg: Catalog, namespace: str, tdef: TableDef) -> None:
    """Create ``tdef`` when absent; check an existing table still has its columns."""
    ident = (namespace, tdef.name)
    try:
        tbl = iceberg.load_table(ident)
    except NoSuchTableError:
        try:
            iceberg.create_table(
                ident,
                schema=tdef.schema,
                partition_spec=tdef.partition_spec(),
                properties=tdef.properties(),
            )
            return
        except TableAlreadyExistsError:
            tbl = iceberg.load_table(ident)
    have = tbl.schema()
    for fld in tdef.schema.fields:
        try:
            found = have.find_field(fld.name)
        except ValueError:
            raise Conflict(
                f"table {tdef.name} lacks column {fld.name}", table=tdef.name, field=fld.name
            ) from None
        if found.field_type != fld.field_type:
            raise Conflict(
                f"column {tdef.name}.{fld.name} is {found.field_type}, expected {fld.field_type}",
                table=tdef.name,
                field=fld.name,
            )
