"""What a catalog is opened with, and what one ingest call answers.

:class:`CatalogConfig` says where the catalog lives (catalog URI, warehouse, object
store, LanceDB) and the rules it applies (eval carve-out, near-duplicate thresholds).
It reads no environment: :mod:`service.settings` is the one place that does, and
passes the values down. :class:`IngestResult` is the answer of one ``add_*`` call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from catalog import idempotency, rules

__all__ = ["CatalogConfig", "IngestResult"]


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
        reference_fraction: Fraction of train assets in the drift reference slice
            (:mod:`catalog.reference`); None: the frozen value (0.001 when freezing).
        near_dup_hamming: Hamming threshold per 64-bit frame hash.
        near_dup_min_frames: Matching aligned frames that make a near-duplicate.
        near_dup_window: Leading frames compared.
        s3_endpoint_url: S3-compatible endpoint of an ``s3://`` warehouse (None: AWS).
        s3_path_style: Path-style S3 addressing.
        s3_region: Region of the warehouse bucket (None: ``us-east-1`` with a custom
            endpoint, else pyiceberg's own lookup).
        iceberg_properties: Extra pyiceberg catalog / FileIO properties, passed through
            (``s3.access-key-id``, ``s3.secret-access-key``, ``token``, …).
        key_index: Local file of ingest's key index (:mod:`catalog.key_index`, a
            cache of committed keys rebuilt when missing). None: ``key-index.sqlite``
            beside a SQLite catalog's file, else under ``.vidlake/key-index/``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str = "sqlite:///.vidlake/catalog.db"
    warehouse: str = ".vidlake/warehouse"
    namespace: str = Field(default="vidlake", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    objects: str = ".vidlake/objects"
    lance: str = ".vidlake/lance"
    eval_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    eval_salt: str | None = None
    reference_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    near_dup_hamming: int = Field(default=4, ge=0, le=31)
    near_dup_min_frames: int = Field(default=6, ge=1)
    near_dup_window: int = Field(default=8, ge=1, le=1024)
    s3_endpoint_url: str | None = None
    s3_path_style: bool | None = None
    s3_region: str | None = None
    iceberg_properties: dict[str, str] = Field(default_factory=dict)
    key_index: str | None = None

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
