"""What each column of the catalog's tables means, with an example value.

The companion of :mod:`catalog.tables` (which declares the types, the required
columns, what the catalog fills and the row rules): for every table a sentence, and
for every column a description and an example. ``GET /v1/schemas``, ``vidlake schema``
and ``docs/tables.md`` are generated from the two modules together
(:mod:`service.table_schemas`); a test checks that every column of every table is
described here and that each table's :func:`example_row` passes the catalog's own row
checks, so this page cannot drift from what ingest accepts.

The example rows form one consistent corpus: the clip belongs to the asset, the
latent, score and caption to the clip (its id is ``clip_id(asset_id, t_start_s,
t_end_s, split_version)`` of the example clip).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from catalog.rules import clip_id

__all__ = [
    "COLUMNS",
    "EMBEDDING_COLUMNS",
    "EMBEDDING_DESCRIPTION",
    "TABLE_DESCRIPTIONS",
    "Column",
    "example_row",
]


class Column(NamedTuple):
    """One column's meaning.

    Attributes:
        description: What the value is, for a producer writing it.
        example: A value the catalog accepts (as JSON would carry it).
        in_example_row: Whether :func:`example_row` writes it (columns the catalog
            fills, or that are rarely written, are left out).
    """

    description: str
    example: Any
    in_example_row: bool = True


_ASSET = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
_OTHER_ASSET = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
_OBJECT = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
_CLIP = clip_id(_ASSET, 0.0, 4.0, "pyscenedetect-0.6")
_AT = "2026-11-30T12:00:00Z"
_JOB = "encode-2026-11-30-0007"

TABLE_DESCRIPTIONS: Mapping[str, str] = {
    "assets": "One source video, keyed by the SHA-256 of its bytes: where it lives, its "
    "licence and policy fields, its probe, and its perceptual fingerprint.",
    "asset_events": "Append-only events on an asset: quarantined, released, or linked as a "
    "near-duplicate of a canonical copy.",
    "tombstones": "Takedowns: a soft tombstone hides an asset from every later cut; a hard "
    "one also erases its bytes (vidlake erase).",
    "clips": "Time ranges of an asset cut by a scene splitter; the clip id is derived from "
    "the range.",
    "latents": "Encoded tensors of a clip at one resolution rung, as a byte range of a "
    "content-addressed object (upload the object first).",
    "scores": "One filter's score of a clip (aesthetic, motion, OCR, ...) at a filter "
    "version; recipes threshold and rank on them.",
    "captions": "Text describing a clip, of one kind, at a caption version.",
    "jobs": "What a pipeline job ran: stage, versions, host, counts (lineage of the rows "
    "that name its job_id).",
}

_ASSETS: dict[str, Column] = {
    "asset_id": Column("SHA-256 (lowercase hex) of the asset's bytes.", _ASSET),
    "uri": Column("Where the source video lives (any URI scheme).", "s3://raw/a1/0001.mp4"),
    "size": Column("Bytes of the source video.", 73_400_320),
    "source": Column("The source or vendor name, as recipes' stream predicates use it.", "stock-a"),
    "source_tier": Column("licensed, crawl or synthetic.", "licensed"),
    "license_id": Column("The licence the asset is used under.", "lic-2026-014"),
    "territory": Column("Territory the licence covers.", "worldwide"),
    "opt_out": Column("Whether the rights holder opted out (such assets are never cut).", False),
    "pii_class": Column("Personal-data class given by the producer's review.", "none"),
    "provenance": Column("JSON text: where the asset came from.", '{"vendor": "acme"}'),
    "probe_container": Column("Container format (probe.container).", "mp4"),
    "probe_codec": Column("Video codec (probe.codec).", "h264"),
    "probe_width": Column("Frame width in pixels (probe.width).", 1920),
    "probe_height": Column("Frame height in pixels (probe.height).", 1080),
    "probe_fps": Column("Frames per second (probe.fps).", 24.0),
    "probe_duration_s": Column("Duration in seconds (probe.duration_s).", 62.5),
    "probe_bitrate": Column("Bits per second (probe.bitrate).", 9_400_000),
    "fingerprint": Column(
        "64-bit perceptual frame hashes (a JSON list of unsigned integers, or big-endian "
        "bytes in Arrow); near-duplicates are matched on it.",
        [12_345_678_901_234_567, 12_345_678_901_234_568],
    ),
    "split": Column(
        "train or eval: fixed at ingest by the namespace's eval fraction and salt.",
        "train",
        False,
    ),
    "duplicate_of": Column(
        "The canonical asset this one near-duplicates at ingest (set by the catalog).",
        None,
        False,
    ),
    "near_duplicates": Column(
        "Assets this one matched at ingest (set by the catalog).", [_OTHER_ASSET], False
    ),
    "ingested_at": Column("When the row was ingested (the ingest time when absent).", _AT, False),
}

_ASSET_EVENTS: dict[str, Column] = {
    "asset_id": Column("The asset the event is about.", _ASSET),
    "event": Column("quarantined, released or near_duplicate.", "quarantined"),
    "related_asset_id": Column(
        "For near_duplicate: the canonical copy (required then).", None, False
    ),
    "reason": Column("Why (free text).", "under legal review"),
    "details": Column("JSON text: anything else.", '{"ticket": "LEGAL-42"}'),
    "actor": Column("Who raised the event.", "trust-and-safety"),
    "job_id": Column("The job that raised it, if any.", None, False),
    "at": Column("When it happened (the ingest time when absent).", _AT, False),
}

_TOMBSTONES: dict[str, Column] = {
    "asset_id": Column("The asset taken down.", _ASSET),
    "reason": Column("Why (not blank).", "dmca"),
    "kind": Column("soft (hide from cuts) or hard (also erase its bytes).", "soft"),
    "requested_by": Column("Who asked.", "legal@example.com"),
    "at": Column("When (the ingest time when absent).", _AT, False),
}

_CLIPS: dict[str, Column] = {
    "clip_id": Column(
        "Derived by the catalog: the first 32 hex digits of SHA-256 of "
        '"{asset_id}:{t_start_s:.6f}:{t_end_s:.6f}:{split_version}" '
        "(catalog.rules.clip_id); a given value must equal it.",
        _CLIP,
        False,
    ),
    "asset_id": Column("The clip's asset (must be in the catalog).", _ASSET),
    "t_start_s": Column("Start of the clip in the asset, seconds.", 0.0),
    "t_end_s": Column("End of the clip, seconds (after the start).", 4.0),
    "split_version": Column("Version of the scene splitter that cut it.", "pyscenedetect-0.6"),
    "fps": Column("Frames per second of the clip.", 24.0),
    "num_frames": Column("Frames in the clip.", 96),
    "width": Column("Frame width in pixels.", 1920),
    "height": Column("Frame height in pixels.", 1080),
    "aspect_bucket": Column("The producer's aspect label (informational).", "16:9"),
    "split": Column("The asset's split, copied by the catalog.", "train", False),
    "job_id": Column("The job that cut the clip.", "split-2026-11-30-0003"),
    "metadata": Column("JSON text: importer sidecar fields.", '{"shot": "wide"}'),
    "ingested_at": Column("When the row was ingested.", _AT, False),
}

_LATENTS: dict[str, Column] = {
    "clip_id": Column("The clip encoded (must be in the catalog).", _CLIP),
    "rung": Column("Resolution rung: digits then p.", "256p"),
    "tokenizer_version": Column("Version of the tokenizer (VAE) that encoded it.", "vae-v1"),
    "format": Column("safetensors, pt or npy.", "safetensors"),
    "object_sha256": Column(
        "SHA-256 of the object holding the tensors (upload it first: PUT /v1/objects).",
        _OBJECT,
    ),
    "object_size": Column("Bytes of the whole object (checked against the store).", None, False),
    "offset": Column("Where the member starts in the object (0 when absent).", 0, False),
    "length": Column(
        "Bytes of the member (the whole object from offset when absent).", None, False
    ),
    "member_sha256": Column(
        "SHA-256 of bytes [offset, offset+length) (computed when absent).", None, False
    ),
    "tensor_keys": Column("Names of the tensors in the member.", ["latent"]),
    "shapes": Column("Shape of each tensor, in tensor_keys order.", [[16, 24, 32, 32]]),
    "dtypes": Column("Dtype of each tensor, in tensor_keys order.", ["BF16"]),
    "latent_frames": Column("Latent frames (axis 1 of a (C, T, H, W) latent).", 24),
    "tokens": Column("Tokens the sample costs a step (recipes' token budgets).", 24_576),
    "job_id": Column("The encode job.", _JOB),
    "ingested_at": Column("When the row was ingested.", _AT, False),
}

_SCORES: dict[str, Column] = {
    "clip_id": Column("The clip scored.", _CLIP),
    "filter_name": Column("The filter: lowercase, digits and _.", "aesthetic"),
    "filter_version": Column("The filter's version (recipes pin one).", "2"),
    "score": Column("The score (finite).", 5.25),
    "job_id": Column("The scoring job.", "filter-2026-11-30-0011"),
    "computed_at": Column("When it was computed (the ingest time when absent).", _AT, False),
}

_CAPTIONS: dict[str, Column] = {
    "clip_id": Column("The clip captioned.", _CLIP),
    "caption_version": Column("The captioning run's version (recipes pin one).", "1"),
    "kind": Column("dense, short, ...: lowercase, digits and _.", "dense"),
    "text": Column("The caption (not blank).", "A red kite circles over a green valley."),
    "text_embedding_sha256": Column(
        "SHA-256 of an uploaded text-embedding object, if any.", None, False
    ),
    "model_version": Column("The captioning model.", "captioner-3b-v2"),
    "job_id": Column("The captioning job.", "caption-2026-11-30-0002"),
    "ingested_at": Column("When the row was ingested.", _AT, False),
}

_JOBS: dict[str, Column] = {
    "job_id": Column("The job's id (rows of other tables name it).", _JOB),
    "stage": Column("decode, split, filter, caption, encode, import, ...", "encode"),
    "status": Column("The job's final status.", "succeeded"),
    "code_version": Column("The pipeline's code version.", "pipeline-1.8.2"),
    "model_versions": Column("JSON object: model -> version.", '{"vae": "vae-v1"}'),
    "started_at": Column("When it started.", "2026-11-30T11:00:00Z"),
    "finished_at": Column("When it finished.", "2026-11-30T11:40:00Z"),
    "host": Column("Where it ran.", "gpu-node-17"),
    "counts": Column("JSON object: counts it reports.", '{"clips": 1200}'),
    "provenance": Column("JSON text: anything else.", '{"queue": "nightly"}'),
    "ingested_at": Column("When the row was ingested.", _AT, False),
}

COLUMNS: Mapping[str, Mapping[str, Column]] = {
    "assets": _ASSETS,
    "asset_events": _ASSET_EVENTS,
    "tombstones": _TOMBSTONES,
    "clips": _CLIPS,
    "latents": _LATENTS,
    "scores": _SCORES,
    "captions": _CAPTIONS,
    "jobs": _JOBS,
}


#: The rows of ``POST /v1/embeddings`` (LanceDB, one table per model version).
EMBEDDING_DESCRIPTION = (
    "Clip embeddings in LanceDB, one table per model version; recipes' semantic dedup and "
    "eval decontamination read them. The clip's asset and split come from the catalog."
)
EMBEDDING_COLUMNS: Mapping[str, Column] = {
    "clip_id": Column("The clip embedded (must be in the catalog).", _CLIP),
    "vector": Column("The embedding (one length per model version).", [0.12, -0.5, 0.33]),
    "model_version": Column(
        "The embedding model (or the request's ?model_version= for rows naming none).",
        "siglip-so400m-v1",
    ),
    "asset_id": Column("Ignored (the catalog's).", None, False),
    "split": Column("Ignored (the catalog's).", None, False),
}


def example_row(table: str) -> dict[str, Any]:
    """A row of ``table`` (or ``embeddings``) a producer could send: its
    ``in_example_row`` columns that have an example.

    Raises:
        KeyError: ``table`` is not a catalog table.
    """
    columns = EMBEDDING_COLUMNS if table == "embeddings" else COLUMNS[table]
    return {
        name: col.example
        for name, col in columns.items()
        if col.in_example_row and col.example is not None
    }
