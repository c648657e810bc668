"""Adopt a TAR-shard latent dataset by reference: ``vidlake import tar-shards SOURCE``.

The dataset is a directory, ``s3://`` prefix or HTTP(S) base URL holding TAR shards of
ordered ``<sample_id>.pt`` + ``<sample_id>.json`` pairs and a manifest
(``manifest.json``, or the immutable ``manifests/vNNNNNN.json`` of a pinned
revision) in the format ``docs/interop.md`` describes (parsed and checked by
:mod:`interop.tar_manifest`)::

    {"revision": "v000002", "parent": "v000001",
     "shards": [{"path": "train-000000.tar", "size": 1536000, "sha256": "…",
                 "split": "train", "sample_ids": ["a1", …],
                 "members": {"a1.pt": {"size": …, "sha256": "…"}, …}}],
     "exclude_sample_ids": ["…"]}

What the import does, and why:

* Reads the manifest at the revision asked for, and only the shards it lists (no
  listing, so an unlisted TAR is never opened).
* Indexes each shard by its headers (:mod:`interop.tar_index`): member offsets
  and lengths, plus the small sidecar ``.json`` members inline.
* Registers each shard as an external object (:mod:`catalog.objects.refs`) under its
  manifest SHA-256 and size: not a byte is copied.
* **One asset per sample.** A shard is a packing unit, not provenance; governance
  (takedown, quarantine, eval carve-out) acts per sample. ``asset_id`` is the
  sidecar's ``asset_id`` when it is a SHA-256 (vidlake's own exports carry it), else
  the declared SHA-256 of the sample's latent member. Each sample becomes an asset, a
  clip (sidecar fields kept in ``clips.metadata``), a latent (``format`` from the
  member suffix, offset, length, member SHA-256) and its captions and scores.
* A publisher's manifest is read as published (:mod:`interop.tar_samples`): sample
  ids from the TAR headers, member hashes from the sidecars, the split from the
  manifest's rule (:mod:`interop.tar_split`), every tensor of a ``.pt`` member from
  its header (:mod:`interop.pt_header`); ``schema``, ``model_revisions`` (``vae`` is
  the latents' ``tokenizer_version``) and each shard's ``revision`` are recorded.
* Samples of a non-``train`` split (``val``, ``eval``, ``test``) become ``eval`` assets;
  vidlake's own carve-out still applies to the rest. ``exclude_sample_ids`` are not
  imported, and samples a later revision excludes are quarantined.
* The job row records the manifest revision and SHA-256 as provenance. Ingest is
  idempotent: re-importing a newer revision adds only its new samples (the rest are
  reported as duplicates).

Verification happens at read time: the loader checks each member's SHA-256 before
``torch.load``; :func:`verify_shards` (and any whole-object download through a
reference) checks a whole shard, and :func:`quarantine_failed` quarantines the samples
of every shard that failed.

Why this module is a little over 500 lines: the import is one resumable pipeline
(check, register, ingest, verify) whose steps share the run's state; the manifest
format and the shard index live in their own modules.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from catalog.errors import ChecksumMismatch
from catalog.hashing import is_sha256
from catalog.objects.refs import ObjectRef, RefStore, get_ref, list_failed, put_ref
from catalog.reads import one_of
from interop.sources import RangeSource, open_range_source
from interop.tar_index import index_tar
from interop.tar_manifest import SourceManifest, bad_manifest, read_manifest
from interop.tar_samples import Sample, samples_of, tensor_facts

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog

__all__ = [
    "ImportOptions",
    "ImportReport",
    "import_tar_shards",
    "quarantine_failed",
    "verify_shards",
]

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class ImportOptions:
    """Defaults for fields a sidecar does not carry.

    Attributes:
        rung: Resolution rung of the latents.
        tokenizer_version: The VAE that made them.
        source_tier: ``licensed | crawl | synthetic`` of the assets.
        split_version: Scene-split version of the clips.
        caption_version: Version of captions taken from the sidecars.
        caption_kind: Kind of a sidecar's single ``caption`` string.
        score_version: Version of sidecar scores given as bare numbers.
        window: Bytes read at each uncovered TAR header.
    """

    rung: str = "256p"
    tokenizer_version: str = "imported"
    source_tier: str = "crawl"
    split_version: str = "tar-import-v1"
    caption_version: str = "import"
    caption_kind: str = "dense"
    score_version: str = "import"
    window: int = 2048


@dataclass
class ImportReport:
    """What an import did (``--json`` prints it)."""

    source: str
    revision: str | None
    manifest_sha256: str
    job_id: str
    shards: int = 0
    samples_listed: int = 0
    excluded: int = 0
    imported: int = 0
    duplicates: int = 0
    eval: int = 0
    quarantined: int = 0
    refs_created: int = 0
    shard_bytes: int = 0
    index_bytes_read: int = 0
    index_requests: int = 0
    header_bytes_read: int = 0  #: of the ``.pt`` members' tensor headers
    header_requests: int = 0
    ingest: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def index_read_fraction(self) -> float:
        return self.index_bytes_read / self.shard_bytes if self.shard_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "index_read_fraction": self.index_read_fraction}


def _num(value: Any, kind: type, default: Any = None) -> Any:
    if value is None or isinstance(value, bool):
        return default
    try:
        return kind(value)
    except (TypeError, ValueError):
        return default


def _rows(
    s: Sample, manifest: SourceManifest, src: RangeSource, opts: ImportOptions, job: str
) -> dict[str, Any]:
    """Asset, clip, latent, caption and score rows of one sample."""
    sc = s.sidecar
    asset_id = sc["asset_id"] if is_sha256(sc.get("asset_id")) else s.member_sha256
    facts = tensor_facts(s)
    shape = facts.latent_shape if len(facts.latent_shape) >= 2 else None
    latent_frames = facts.latent_frames
    fps = _num(sc.get("fps"), float)
    num_frames = _num(sc.get("num_frames"), int) or latent_frames or 1
    width = _num(sc.get("width"), int) or (shape[-1] if shape else None)
    height = _num(sc.get("height"), int) or (shape[-2] if shape else None)
    if not width or not height:
        raise bad_manifest(f"sample {s.sample_id}: the sidecar gives no width/height or shape")
    t0 = _num(sc.get("t_start_s"), float, 0.0)
    t1 = _num(sc.get("t_end_s"), float) or t0 + (num_frames / fps if fps else 1.0)
    shard_url = src.url_of(s.shard.path)
    meta = {
        "sample_id": s.sample_id,
        "shard": s.shard.path,
        "shard_sha256": s.shard.sha256,
        "revision": manifest.revision,
        "shard_revision": s.shard.revision,
        "split": s.split,
        "schema": manifest.schema,
        "model_revisions": dict(manifest.model_revisions),
        "sidecar": sc,
    }
    from catalog import rules

    split_version = str(sc.get("split_version") or opts.split_version)
    clip_id = rules.clip_id(asset_id, t0, t1, split_version)
    asset = {
        "asset_id": asset_id,
        "uri": f"{shard_url}#{s.name}",
        "size": s.length,
        "source": str(sc.get("source") or src.base),
        "source_tier": str(sc.get("source_tier") or opts.source_tier),
        "license_id": sc.get("license_id"),
        "territory": sc.get("territory"),
        "provenance": json.dumps(
            {"import": "tar-shards", "source": src.base, "revision": manifest.revision},
            sort_keys=True,
        ),
        "split": "eval" if s.is_eval else None,
    }
    clip = {
        "clip_id": clip_id,
        "asset_id": asset_id,
        "t_start_s": t0,
        "t_end_s": t1,
        "split_version": split_version,
        "fps": fps,
        "num_frames": num_frames,
        "width": width,
        "height": height,
        "aspect_bucket": sc.get("aspect_bucket"),
        "job_id": job,
        "metadata": json.dumps(meta, sort_keys=True, default=str),
    }
    latent = {
        "clip_id": clip_id,
        "rung": str(sc.get("rung") or opts.rung),
        "tokenizer_version": str(
            sc.get("tokenizer_version")
            or manifest.model_revisions.get("vae")
            or opts.tokenizer_version
        ),
        "format": s.fmt,
        "object_sha256": s.shard.sha256,
        "object_size": s.shard.size,
        "offset": s.offset,
        "length": s.length,
        "member_sha256": s.member_sha256,
        "tensor_keys": facts.keys,
        "shapes": facts.shapes,
        "dtypes": facts.dtypes,
        "latent_frames": latent_frames,
        "tokens": facts.tokens,
        "job_id": job,
    }
    captions = []
    texts = sc.get("captions")
    if isinstance(texts, dict):
        pairs = [(str(k), v) for k, v in texts.items()]
    else:
        pairs = [(opts.caption_kind, sc.get("caption"))]
    cap_version = str(sc.get("caption_version") or opts.caption_version)
    for kind, text in pairs:
        if isinstance(text, str) and text.strip():
            captions.append(
                {
                    "clip_id": clip_id,
                    "caption_version": cap_version,
                    "kind": kind,
                    "text": text,
                    "job_id": job,
                }
            )
    scores = []
    for name, value in (sc.get("scores") or {}).items():
        version, score = opts.score_version, value
        if isinstance(value, dict):
            version, score = str(value.get("version", version)), value.get("score")
        if _num(score, float) is not None:
            scores.append(
                {
                    "clip_id": clip_id,
                    "filter_name": str(name),
                    "filter_version": version,
                    "score": float(score),
                    "job_id": job,
                }
            )
    return {"asset": asset, "clip": clip, "latent": latent, "captions": captions, "scores": scores}


# -- the import ---------------------------------------------------------------------------
def import_tar_shards(
    catalog: VidlakeCatalog,
    source: str | Path | RangeSource,
    *,
    revision: str | int | None = None,
    options: ImportOptions | None = None,
    progress: Progress | None = None,
) -> ImportReport:
    """Adopt the dataset at ``source`` (see the module docstring).

    Args:
        catalog: The catalog to import into (its object store holds the references).
        source: Directory, ``s3://`` prefix, HTTP(S) base URL, or an open source.
        revision: ``vNNNNNN`` (or int) to read ``manifests/vNNNNNN.json``; None reads
            ``manifest.json``.
        options: Defaults for fields the sidecars do not carry.
        progress: Called with ``(stage, fraction)``: ``manifest``, ``index``, ``ingest``.

    Raises:
        InvalidInput: a malformed manifest, sidecar or shard (nothing is written).
        IntegrityError: a corrupt TAR header (nothing is written).
    """
    opts = options or ImportOptions()
    report_progress = progress or (lambda stage, fraction: None)
    src = open_range_source(source, catalog.objects.s3_connection)
    report_progress("manifest", 0.0)
    manifest = read_manifest(src, revision)
    report_progress("manifest", 1.0)
    job = f"tar-import-{manifest.sha256[:16]}"
    report = ImportReport(src.base, manifest.revision, manifest.sha256, job)
    report.shards = len(manifest.shards)
    started = dt.datetime.now(dt.UTC)

    # Index every listed shard first: a bad shard fails the import before any write.
    samples: list[Sample] = []
    excluded: list[Sample] = []
    for i, shard in enumerate(manifest.shards):
        index = index_tar(
            functools.partial(src.read_range, shard.path),
            shard.size,
            window=opts.window,
            what=shard.path,
        )
        report.shard_bytes += shard.size
        report.index_bytes_read += index.bytes_read
        report.index_requests += index.requests
        read = functools.partial(src.read_range, shard.path)
        before = (src.requests, src.bytes_read)
        for s in samples_of(shard, index, manifest, read):
            (excluded if s.sample_id in manifest.exclude_sample_ids else samples).append(s)
        report.header_requests += src.requests - before[0]
        report.header_bytes_read += src.bytes_read - before[1]
        report_progress("index", (i + 1) / max(1, len(manifest.shards)))
    _check_unique(samples + excluded)
    report.samples_listed = len(samples) + len(excluded)
    report.excluded = len(excluded)
    rows = [_rows(s, manifest, src, opts, job) for s in samples]
    gone = [_rows(s, manifest, src, opts, job)["asset"]["asset_id"] for s in excluded]

    report_progress("ingest", 0.0)
    store = catalog.objects
    for shard in manifest.shards:
        report.refs_created += put_ref(
            store, ObjectRef(shard.sha256, shard.size, src.url_of(shard.path))
        )
    steps: list[tuple[str, Callable[[Any], Any], list[dict[str, Any]]]] = [
        ("assets", catalog.add_assets, [r["asset"] for r in rows]),
        ("clips", catalog.add_clips, [r["clip"] for r in rows]),
        ("latents", catalog.add_latents, [r["latent"] for r in rows]),
        ("captions", catalog.add_captions, [c for r in rows for c in r["captions"]]),
        ("scores", catalog.add_scores, [c for r in rows for c in r["scores"]]),
    ]
    for k, (name, add, batch) in enumerate(steps):
        if batch:
            report.ingest[name] = add(batch).to_dict()
        report_progress("ingest", (k + 1) / (len(steps) + 1))
    latents = report.ingest.get("latents", {})
    # A replayed batch (the same rows, imported before) added nothing in this run.
    fresh = not latents.get("replayed", False)
    n_latents = len(steps[2][2])
    report.imported = int(latents.get("inserted", 0)) if fresh else 0
    report.duplicates = int(latents.get("duplicates", 0)) if fresh else n_latents
    assets = report.ingest.get("assets", {})
    report.eval = int(assets.get("eval", 0)) if not assets.get("replayed", False) else 0
    report.quarantined = _quarantine(
        catalog, gone, f"excluded by source manifest {manifest.revision}", job, {}
    )
    catalog.add_jobs(
        [
            {
                "job_id": job,
                "stage": "import",
                "status": "succeeded",
                "started_at": started,
                "finished_at": dt.datetime.now(dt.UTC),
                "counts": json.dumps(
                    {k: v for k, v in report.to_dict().items() if isinstance(v, int)}
                ),
                "provenance": json.dumps(
                    {
                        "kind": "tar-shards",
                        "source": src.base,
                        "revision": manifest.revision,
                        "parent_revision": manifest.parent,
                        "manifest_sha256": manifest.sha256,
                    },
                    sort_keys=True,
                ),
            }
        ]
    )
    report_progress("ingest", 1.0)
    return report


def _check_unique(samples: Sequence[Sample]) -> None:
    """A sample id names one sample across every shard (headers may repeat one)."""
    where: dict[str, str] = {}
    for s in samples:
        other = where.setdefault(s.sample_id, s.shard.path)
        if other != s.shard.path:
            raise bad_manifest(
                f"sample {s.sample_id!r} is stored in both {other} and {s.shard.path}",
                sample_id=s.sample_id,
            )


def _quarantine(
    catalog: VidlakeCatalog,
    asset_ids: Sequence[str],
    reason: str,
    job: str,
    details: Mapping[str, Any],
) -> int:
    """Quarantine those of ``asset_ids`` that are in the catalog and not quarantined
    already; return how many were newly quarantined."""
    if not asset_ids:
        return 0
    have = catalog.scan(
        "assets",
        columns=["asset_id"],
        row_filter=one_of("asset_id", sorted(set(asset_ids))),
        include_eval=True,
    )
    ids = sorted(set(have["asset_id"].to_pylist()))
    if ids:
        # Already quarantined (and not released since): nothing to add, so repeating
        # a verification or an import does not pile up events.
        status = catalog.asset_status(include_eval=True)
        held = set(
            status.filter(pc.fill_null(status["quarantined"], False))["asset_id"].to_pylist()
        )
        ids = [a for a in ids if a not in held]
    if ids:
        catalog.add_asset_events(
            [
                {
                    "asset_id": a,
                    "event": "quarantined",
                    "reason": reason,
                    "details": json.dumps(dict(details), sort_keys=True),
                    "actor": "vidlake import tar-shards",
                    "job_id": job,
                }
                for a in ids
            ]
        )
    return len(ids)


def _assets_in(catalog: VidlakeCatalog, shard_shas: Sequence[str]) -> list[str]:
    """Assets whose latents point into any of ``shard_shas``."""
    lat = catalog.scan(
        "latents",
        columns=["clip_id"],
        row_filter=one_of("object_sha256", shard_shas),
        include_eval=True,
    )
    if lat.num_rows == 0:
        return []
    clips = catalog.scan("clips", columns=["clip_id", "asset_id"], include_eval=True)
    mine = clips.filter(pc.is_in(clips["clip_id"], value_set=pc.unique(lat["clip_id"])))
    return sorted(set(mine["asset_id"].to_pylist()))


def quarantine_failed(catalog: VidlakeCatalog) -> dict[str, int]:
    """Quarantine the samples of every referenced shard recorded as failing its full
    SHA-256 check (:func:`catalog.objects.refs.list_failed`); return shard → assets."""
    out: dict[str, int] = {}
    for sha in list_failed(catalog.objects):
        assets = _assets_in(catalog, [sha])
        out[sha] = _quarantine(
            catalog,
            assets,
            "TAR shard failed its full SHA-256 check",
            f"tar-verify-{sha[:16]}",
            {"shard_sha256": sha},
        )
    return out


def verify_shards(
    catalog: VidlakeCatalog,
    shas: Sequence[str] | None = None,
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Hash whole referenced shards (streamed) and quarantine the samples of any that
    fail. ``shas`` defaults to every object the catalog's latents reference.

    Returns:
        ``{"verified": [...], "failed": [...], "quarantined": {sha: assets}}``.
    """
    report = progress or (lambda stage, fraction: None)
    store = catalog.objects
    if shas is None:
        lat = catalog.scan("latents", columns=["object_sha256"], include_eval=True)
        shas = sorted(set(lat["object_sha256"].to_pylist()))
    refs = RefStore(store)
    ok, failed = [], []
    todo = [s for s in shas if store.head(s) is None and get_ref(store, s) is not None]
    for i, sha in enumerate(todo):
        try:
            refs.verify(sha)
            ok.append(sha)
        except ChecksumMismatch:
            failed.append(sha)
        report("verify", (i + 1) / max(1, len(todo)))
    quarantined = quarantine_failed(catalog) if failed else {}
    return {"verified": ok, "failed": failed, "quarantined": quarantined}
