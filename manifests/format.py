"""The on-disk format of a snapshot's artifacts, shared by the writers (materializer,
manifests) and the reader (loader). This module is the contract: change it only with
both sides and bump ``FORMAT_VERSION``. It imports only the standard library and
pyarrow, so that a GPU node's loader can read it.

Artifacts of one snapshot (each stored content-addressed in the object store):

``plan.arrow``
    Arrow IPC *file*, uncompressed (memory-mappable), schema :data:`PLAN_SCHEMA`.
    One record per global step, steps ``0..num_steps-1`` in order. ``rows`` is the
    global batch as manifest row numbers, already shuffled within the step so that
    every rank's contiguous slice carries the mixture. Rank ``r`` of ``W`` takes
    ``rows[r*B//W:(r+1)*B//W]`` where ``B = len(rows)``; ``W`` must divide ``B``.
    ``stream_epochs[k]`` is the epoch stream ``k`` is in at this step.
    ``skipped`` counts rows a patch removed from this step (0 in an unpatched plan).

``index.arrow``
    Arrow IPC *file*, uncompressed, schema :data:`INDEX_SCHEMA`: the manifest columns
    a loader needs, one record per manifest row, in manifest row order (``row`` equals
    the position).

``manifest.parquet``
    Every manifest column (a superset of the index: lineage refs, score versions,
    job ids...), same row order.

``lineage.arrow`` (:data:`LINEAGE_NAME`, written by a cut, optional)
    Arrow IPC *file*, uncompressed, schema :data:`LINEAGE_SCHEMA`: one record per
    manifest row (``row``, its sorted ``steps``), so "which steps served this row" is
    O(1). A patch has none (its plan differs from its base's).

``skipped.parquet`` (:data:`SKIPPED_NAME`, written by a patch)
    Schema :data:`SKIPPED_SCHEMA`: every (step, row) a chain of patches removed from
    the plan, with its clip and reason.

``excluded_rows.parquet`` (:data:`EXCLUDED_NAME`, written by a patch)
    Schema :data:`EXCLUDED_SCHEMA`: every manifest row the chain of patches excluded,
    served or not.

``quality.json`` (:data:`QUALITY_NAME`, written by a cut, optional)
    JSON: the plan quality report (:mod:`materializer.quality`): realized stream
    shares vs targets over sliding windows per phase, epochs per (stream, bucket),
    samples repeated within a step, autocorrelation of source / asset / cluster by
    lag; ``snapshot.json``'s ``quality`` holds its headline numbers. Versions cut
    before it existed have neither.

``snapshot.json`` (:data:`SNAPSHOT_JSON`)
    Metadata; see :data:`SNAPSHOT_REQUIRED_KEYS`. ``artifacts`` maps each artifact
    name to ``{"sha256", "size"}``; ``streams`` lists stream names by id;
    ``buckets`` lists ``{"id", "num_frames", "aspect"}`` by id; ``phases`` lists
    ``{"name", "rung", "first_step", "num_steps", "rank_multiple"}``.

Registry entry ``manifests/v{N:06d}.json`` (a named key in the object store):
``{"version", "parent", "snapshot_sha256", "snapshot_size", "recipe_sha256",
"patch_of", "created_at"}``.

Erasure marks ``manifests/v{N:06d}.erasure-{k:04d}.json`` (create-only, written by a
hard-takedown erasure, see :mod:`manifests.erasure`): the mark with the highest ``k``
names the version's current ``artifacts`` (``{name: {"sha256", "size"}}``, replacing
those of ``snapshot.json``) and the sorted manifest rows ``erased_rows`` that readers
skip. ``plan.arrow`` is never rewritten by an erasure.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "ARTIFACT_NAMES",
    "EXCLUDED_NAME",
    "EXCLUDED_SCHEMA",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "INDEX_SCHEMA",
    "LINEAGE_NAME",
    "LINEAGE_SCHEMA",
    "MANIFEST_NAME",
    "PLAN_NAME",
    "PLAN_SCHEMA",
    "QUALITY_NAME",
    "SKIPPED_NAME",
    "SKIPPED_SCHEMA",
    "SNAPSHOT_JSON",
    "SNAPSHOT_REQUIRED_KEYS",
    "erasure_key",
    "erasure_prefix",
    "erasure_seq",
    "registry_key",
]

FORMAT_VERSION = 1

PLAN_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64(), nullable=False),
        pa.field("phase", pa.int32(), nullable=False),
        pa.field("bucket", pa.int32(), nullable=False),
        pa.field("stream_epochs", pa.list_(pa.int32()), nullable=False),
        pa.field("rows", pa.list_(pa.int64()), nullable=False),
        pa.field("skipped", pa.int32(), nullable=False),
    ],
    metadata={"vidlake.format": str(FORMAT_VERSION), "vidlake.artifact": "plan"},
)

INDEX_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("asset_id", pa.string(), nullable=False),
        pa.field("stream", pa.int32(), nullable=False),
        pa.field("bucket", pa.int32(), nullable=False),
        # The bucket's latent frame count: the loader keeps the first num_frames frames
        # along axis 1 (T) of every 4-D (C, T, H, W) tensor, so a step stacks cleanly.
        pa.field("num_frames", pa.int32(), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        # Where the latent's bytes are: an object (by SHA-256), a byte range in it, and
        # the SHA-256 of that range (equal to object_sha256 for a standalone object).
        pa.field("object_sha256", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("member_sha256", pa.string(), nullable=False),
        pa.field("format", pa.string(), nullable=False),  # safetensors | pt | npy
        pa.field("tensor_keys", pa.list_(pa.string()), nullable=False),
        # Caption variants; the loader picks variant (epoch + row) % len for the
        # epoch the row's stream is in. text_embedding_sha256 is aligned with captions.
        pa.field("captions", pa.list_(pa.string()), nullable=False),
        pa.field("text_embedding_sha256", pa.list_(pa.string()), nullable=False),
    ],
    metadata={"vidlake.format": str(FORMAT_VERSION), "vidlake.artifact": "index"},
)

LINEAGE_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),
        pa.field("steps", pa.large_list(pa.int64()), nullable=False),
    ],
    metadata={"vidlake.format": str(FORMAT_VERSION), "vidlake.artifact": "lineage"},
)

SKIPPED_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64(), nullable=False),
        pa.field("row", pa.int64(), nullable=False),
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)

EXCLUDED_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)

PLAN_NAME = "plan.arrow"
INDEX_NAME = "index.arrow"
MANIFEST_NAME = "manifest.parquet"
LINEAGE_NAME = "lineage.arrow"
SKIPPED_NAME = "skipped.parquet"
EXCLUDED_NAME = "excluded_rows.parquet"
QUALITY_NAME = "quality.json"
SNAPSHOT_JSON = "snapshot.json"

#: The artifacts every published version has (besides ``snapshot.json``).
ARTIFACT_NAMES = (MANIFEST_NAME, PLAN_NAME, INDEX_NAME)

SNAPSHOT_REQUIRED_KEYS = frozenset(
    {
        "format",
        "version",
        "parent",
        "recipe",
        "recipe_sha256",
        "catalog_snapshot_ids",
        "seed",
        "code_version",
        "counts",
        "drops",
        "stream_shares",
        "bucket_histogram",
        "streams",
        "buckets",
        "phases",
        "num_steps",
        "plan_rows",
        "artifacts",
    }
)


def registry_key(version: int) -> str:
    """The named key that claims snapshot ``version`` in the object store."""
    return f"manifests/v{version:06d}.json"


def erasure_prefix(version: int) -> str:
    """The prefix of version ``version``'s erasure marks."""
    return f"manifests/v{version:06d}.erasure-"


def erasure_key(version: int, seq: int) -> str:
    """The named key of erasure mark ``seq`` (1, 2, …) of snapshot ``version``."""
    return f"{erasure_prefix(version)}{seq:04d}.json"


def erasure_seq(key: str, version: int) -> int | None:
    """The sequence number of an erasure mark key of ``version``, else None."""
    prefix = erasure_prefix(version)
    if not key.startswith(prefix) or not key.endswith(".json"):
        return None
    digits = key[len(prefix) : -len(".json")]
    return int(digits) if digits.isdigit() else None
