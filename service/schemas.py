"""API schemas: what the REST API accepts and returns.

These are not storage models. The catalog's tables, the registry's entries and the
job store's rows have their own types; routers translate, so that the API can stay
stable while storage changes (and the OpenAPI document shows exactly these). One
exception: :class:`DiffPublic` is the registry's computed (not stored)
:class:`~manifests.diff.SnapshotDiff` as it is, rather than a copy of its fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from manifests.diff import SnapshotDiff

__all__ = [
    "ClipLineage",
    "DiffPublic",
    "ErrorBody",
    "ErrorResponse",
    "HealthPublic",
    "IngestPublic",
    "JobPublic",
    "JobsPublic",
    "PatchCreate",
    "PinCreate",
    "PinPublic",
    "RecipeValidatePublic",
    "SnapshotCreate",
    "SnapshotPublic",
    "SnapshotServing",
    "SnapshotsPublic",
    "SqlColumn",
    "SqlRequest",
    "SqlResult",
    "StepPublic",
    "StepSample",
]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- errors -------------------------------------------------------------------------
class ErrorBody(_Out):
    code: str = Field(description="Machine-readable error name, e.g. not_found, conflict")
    message: str = Field(description="What is wrong, for a human")
    details: dict[str, Any] = Field(description="Context: the field, row, version, ...")


class ErrorResponse(_Out):
    """Every error the API returns has this shape."""

    error: ErrorBody


# -- ingest -------------------------------------------------------------------------
class IngestPublic(_Out):
    """What one ingest batch did. A bad row rejects the whole batch with a 422
    ``invalid_batch`` error naming the row and field; nothing is written then."""

    table: str
    received: int = Field(description="Rows in the request")
    inserted: int
    duplicates: int = Field(description="Rows already present (in the catalog or the batch)")
    eval: int = Field(description="Inserted rows carved to the eval split")
    rejected: int
    near_duplicates: int = 0
    snapshot_id: int | None = Field(
        None, description="The table's Iceberg snapshot after the batch"
    )
    idempotency_key: str | None = Field(
        None, description="The batch's key: the caller's, else sha256:<canonical bytes hash>"
    )
    replayed: bool = Field(
        False,
        description="The key was already recorded: nothing was written, counts are the first run's",
    )


# -- recipes and snapshots ----------------------------------------------------------
class RecipeValidatePublic(_Out):
    valid: bool
    name: str
    sha256: str = Field(description="SHA-256 of the recipe's canonical JSON")
    recipe: dict[str, Any] = Field(description="The normalised recipe")
    pin: dict[str, int | None] = Field(
        description="The catalog pin the recipe was checked at (Iceberg tables, and "
        "'embeddings/<model>': LanceDB table version); a cut now would read this state"
    )


class SnapshotCreate(_In):
    """Start a cut. ``recipe`` is a recipe mapping or its YAML/JSON text.

    Cuts are idempotent on their inputs (recipe SHA-256, resolved catalog pin, code
    version): when a published version has them, it is returned (200) instead of a
    new job; an identical cut already queued or running is joined (202, its job)."""

    recipe: dict[str, Any] | str
    new_version: bool = Field(
        False,
        description="Publish a new version even when one with the same inputs exists "
        "(it will have the same artifacts)",
    )
    executor: str | None = Field(
        None,
        description="Where the selection's join runs: local, local:N, auto or the "
        "server's own ray://host:port (default: the server's cut_executor). The "
        "artifacts do not depend on it",
        max_length=300,
    )
    partitions: int | None = Field(
        None,
        strict=True,  # true or "3" is a mistake of the caller's, not one partition
        ge=1,
        le=65536,
        description="clip_id partitions of the selection's join (default: the server's "
        "cut_partitions); the artifacts do not depend on it",
    )


class SnapshotPublic(_Out):
    """A published snapshot version (summary; ``GET /v1/snapshots/{v}`` returns the
    whole ``snapshot.json``)."""

    version: int
    parent: int | None
    patch_of: int | None
    created_at: str
    recipe_sha256: str
    snapshot_sha256: str
    name: str | None = Field(None, description="The recipe's name")
    num_steps: int | None = None
    plan_rows: int | None = None
    counts: dict[str, Any] = Field(default_factory=dict)
    stream_shares: dict[str, Any] = Field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = Field(default_factory=dict)
    pinned: bool = False
    inputs_sha256: str | None = Field(
        None, description="SHA-256 of the cut's inputs (recipe, resolved pin, code version)"
    )
    contains_erased_data: bool = Field(
        False, description="A hard-takedown erasure blanked rows of this version"
    )
    erasure_ids: list[str] = Field(default_factory=list, description="Erasures that marked it")


class SnapshotsPublic(_Out):
    data: list[SnapshotPublic]
    count: int


class PatchCreate(_In):
    """Exclude samples from a version; the new version keeps every step.

    ``where`` is a SQL predicate over ``manifest.parquet``'s columns (e.g.
    ``stream = 2 AND bucket = 1``), resolved to manifest rows in the SQL sandbox.
    """

    reason: str = Field(min_length=1, max_length=2000)
    exclude_clip_ids: list[str] = Field(default_factory=list, max_length=1_000_000)
    exclude_asset_ids: list[str] = Field(default_factory=list, max_length=1_000_000)
    exclude_rows: list[int] = Field(default_factory=list, max_length=10_000_000)
    where: str | None = Field(None, max_length=10_000)
    by: str | None = Field(
        None,
        max_length=200,
        description="Who asked; recorded only by an open (token-less) service, which "
        "otherwise records the token's name",
    )


class PinCreate(_In):
    reason: str = Field(min_length=1, max_length=2000)


class PinPublic(_Out):
    version: int
    pinned: bool
    changed: bool = Field(description="Whether this request changed the pin state")
    reason: str | None = None
    by: str | None = None
    at: str | None = None


# One definition of the fields: the registry's SnapshotDiff, served as it is (a change
# there is a change of this API, which the committed OpenAPI document's test shows).
class DiffPublic(SnapshotDiff):
    """What changed from version a to version b."""


# -- steps and lineage --------------------------------------------------------------
class StepSample(_Out):
    """One sample of a step, with where it came from."""

    row: int = Field(description="Manifest row number")
    position: int = Field(description="Position in the step's global batch")
    clip_id: str
    asset_id: str
    source: str | None = None
    source_tier: str | None = None
    license_id: str | None = None
    stream: str
    tier: str | None = None
    bucket: int
    num_frames: int
    object_sha256: str
    scores: dict[str, float] = Field(default_factory=dict)


class StepPublic(_Out):
    version: int
    step: int
    phase: int
    bucket: int
    stream_epochs: list[int]
    skipped: int = Field(description="Rows a patch removed from this step")
    count: int
    samples: list[StepSample]


class SnapshotServing(_Out):
    """Where a clip appears in one snapshot version."""

    version: int
    rows: list[int]
    streams: list[str]
    steps: list[int]
    steps_truncated: bool = False
    patch_of: int | None = None


class ClipLineage(_Out):
    clip: dict[str, Any]
    asset: dict[str, Any] | None
    tombstones: list[dict[str, Any]]
    asset_events: list[dict[str, Any]]
    scores: list[dict[str, Any]]
    captions: list[dict[str, Any]]
    latents: list[dict[str, Any]]
    snapshots: list[SnapshotServing]


# -- erasures -------------------------------------------------------------------------
class ErasureCreate(_In):
    """Erase an asset's bytes (a hard takedown). The asset needs a hard tombstone,
    unless ``tombstone`` asks for one to be recorded first."""

    asset_id: str = Field(pattern=r"^[0-9a-f]{64}$", description="The asset to erase")
    reason: str = Field("hard takedown", min_length=1, max_length=1000)
    tombstone: bool = Field(
        False, description="Record a hard tombstone (with this reason) before erasing"
    )


class ErasurePublic(_Out):
    """An erasure: its request, and when done its audit record (what was erased)."""

    erasure_id: str
    asset_id: str
    state: Literal["done", "incomplete"]
    reason: str | None = None
    requested_by: str | None = None
    requested_at: str | None = None
    completed_at: str | None = None
    audit: dict[str, Any] = Field(
        default_factory=dict,
        description="Rows, files, snapshots, objects, vectors and versions erased; "
        "what could not be erased (adopted objects)",
    )


class ErasuresPublic(_Out):
    data: list[ErasurePublic]
    count: int


# -- jobs ---------------------------------------------------------------------------
class JobPublic(_Out):
    id: str
    kind: str
    state: Literal["queued", "running", "succeeded", "failed"]
    stage: str | None
    progress: float = Field(ge=0, le=1)
    params: dict[str, Any]
    result: dict[str, Any] | None
    error: ErrorBody | None
    owner: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None


class JobsPublic(_Out):
    data: list[JobPublic]
    count: int


# -- SQL ----------------------------------------------------------------------------
class SqlRequest(_In):
    """A read-only query. The catalog views are read at ``pin``: ``latest`` (default),
    or explicit Iceberg snapshot ids per table; or at the catalog state snapshot
    version ``snapshot`` was cut from."""

    query: str = Field(description="One SELECT or WITH statement (DuckDB dialect)")
    pin: Literal["latest"] | dict[str, int | None] = "latest"
    snapshot: int | None = Field(None, ge=1, description="Read at this snapshot's catalog pin")
    limit: int | None = Field(None, ge=1, description="Row limit (at most the server's)")


class SqlColumn(_Out):
    name: str
    type: str


class SqlResult(_Out):
    columns: list[SqlColumn]
    rows: list[list[Any]]
    row_count: int
    truncated: bool = Field(description="More rows matched than the row or byte limit returned")
    elapsed_ms: float
    pin: dict[str, int | None]


# -- health -------------------------------------------------------------------------
class HealthPublic(_Out):
    status: Literal["ok", "degraded"]
    version: str
    catalog: str
    auth: Literal["open", "tokens"]
    latest_snapshot: int | None
    jobs: dict[str, int]
