"""A realistic synthetic corpus, for the demo, integration tests and benchmarks.

:func:`generate_corpus` fills a catalog the way a curation fleet would: assets from
three source tiers with provenance, licences, probes and perceptual fingerprints (a few
near-duplicate re-uploads among them), scene-split clips, VAE latents in the object
store, versioned filter scores, two caption versions, and clip embeddings. Output is a
pure function of the arguments: the same call on two fresh catalogs gives the same
asset ids, clip ids, object SHA-256s, scores, captions and vectors. Only timestamps and
the catalog's own salted eval carve-out (the ``split`` of a few rows) differ.

**Assets.** The bytes are *notional*: ``asset_id = sha256(f"vidlake-synthetic:{seed}:
{assets}:{index}")`` and no raw video is stored. A few assets are *held out* (the
producer forces ``split = eval``, besides the catalog's carve-out), so that even a
small corpus has eval material. A near-duplicate is a crawl re-upload of an original:
the same frame hashes with a bit or two flipped, a lower bitrate and resolution, the
same scene cuts; the catalog links it ``duplicate_of`` the original. One re-upload
copies a held-out asset (an eval near-duplicate that a training cut must drop).

**Latents.** At rung ``Hp`` a clip of ``F`` frames and aspect ratio ``W:H`` becomes,
through the VAE (8x8 spatial, 4x temporal, 16 channels), a ``bfloat16`` tensor
``latent`` of shape ``(16, T, H/8, round(H * W/H / 8))`` with ``T = 1 + (F - 1) // 4``;
the transformer sees ``tokens = T * ceil(h/2) * ceil(w/2)`` (2x2 patches, a ragged
edge padded). See :func:`latent_shape` and :func:`latent_tokens`. The lowest rung is
encoded for every clip, higher rungs only for clips whose ``aesthetic`` v2 score
reaches ``high_rung_min_aesthetic`` (expensive encodes for the keepers), which keeps
the default corpus near 350 MB. ``latents="files"`` stores one safetensors object per
latent. ``latents="packed"`` concatenates members (8-byte aligned) into shared objects
of about ``pack_bytes``, never splitting an asset's members across two, and records
``offset``/``length``/``member_sha256``; ``pack_bytes=1`` makes one object per asset
and rung. A hard takedown must not delete a shared object outright.

**Embeddings.** ``v = sqrt(.35) scene + sqrt(.25) asset + sqrt(.40) clip`` with the
three parts orthogonal unit vectors, so clips of one asset sit ~0.4 apart (cosine
distance), of one scene ~0.65, the rest ~1. Designed structures sit well inside usual
thresholds: a re-upload's clips 0.004 from the original's; per few hundred assets, one
train clip 0.01 from a held-out eval clip (for decontamination); per hundred assets, a
same-scene cluster of two to four clips 0.003-0.012 from its anchor (for semantic
dedup, mostly sim renders, which repeat themselves).

Ingest runs in batches of at most 10k clips: one catalog call per table per batch.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
import struct
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from catalog.errors import Conflict, InvalidInput
from catalog.hashing import sha256_bytes
from catalog.rules import eval_mask

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.config import IngestResult
    from catalog.objects import PutResult

__all__ = [
    "STAGES",
    "CorpusSummary",
    "Progress",
    "generate_corpus",
    "latent_shape",
    "latent_tokens",
    "tombstone_asset",
]

#: ``progress(stage, done, total)`` — called with 0 first, then after each step.
Progress = Callable[[str, int, int], None]

STAGES = ("assets", "clips", "latents", "scores", "captions", "embeddings")
SPLIT_VERSION = "scenecut-adaptive-v3"
LATENT_CHANNELS = 16
_CLIPS_PER_BATCH = 10_000
_PUT_WORKERS = 4  # puts wait on fsync, not on the GIL
_MAX_IN_FLIGHT = 64
_REPORT_EVERY = 256  # latents between progress reports
_ALIGN = 8
_EPOCH = dt.datetime(2026, 7, 1, tzinfo=dt.UTC)  # provenance times are seeded, not clocked

Choices = Mapping[str, tuple[tuple[Any, ...], tuple[float, ...]]]  # key -> (values, weights)
TIERS = ("licensed", "crawl", "synthetic")
_TIER_SHARE = (0.30, 0.55, 0.15)
_SOURCES: Choices = {
    "licensed": (("stock-a", "stock-b"), (0.6, 0.4)),
    "crawl": (("web-crawl-2026-q3",), (1.0,)),
    "synthetic": (("sim-engine-v2",), (1.0,)),
}
_LICENCES: Choices = {
    "stock-a": (("stock-a-enterprise-2025",), (1.0,)),
    "stock-b": (("stock-b-rf-standard", "stock-b-editorial"), (0.7, 0.3)),
    "web-crawl-2026-q3": (("cc-by-4.0", "cc-by-sa-4.0", "cc0-1.0", "platform-tos"), (5, 2, 1, 12)),
    "sim-engine-v2": (("internal-sim-owned",), (1.0,)),
}
_TERRITORIES: Choices = {
    "licensed": (("WW", "US", "EU"), (7, 2, 1)),
    "crawl": (("US", "GB", "DE", "FR", "JP", "BR", "IN", "XX"), (3, 1, 1, 1, 1, 1, 1, 1)),
    "synthetic": (("WW",), (1.0,)),
}
_PII: Choices = {
    "licensed": (("none", "faces_released"), (0.7, 0.3)),
    "crawl": (("none", "faces", "license_plates", "sensitive"), (55, 33, 8, 4)),
    "synthetic": (("none",), (1.0,)),
}
_CODECS: Choices = {  # container/codec
    "licensed": (("mov/prores", "mp4/h264"), (0.4, 0.6)),
    "crawl": (("mp4/h264", "webm/vp9"), (0.75, 0.25)),
    "synthetic": (("mkv/hevc",), (1.0,)),
}
_BITS_PER_PIXEL = {"prores": 2.3, "h264": 0.12, "vp9": 0.08, "hevc": 0.15}
_FPS: Choices = {
    "licensed": ((24.0, 30.0), (0.7, 0.3)),
    "crawl": ((30.0, 24.0), (0.7, 0.3)),
    "synthetic": ((30.0,), (1.0,)),
}
_TERMS = {
    "licensed": "commercial model training; no redistribution of source; territory-limited",
    "crawl": "as stated by the hosting page; opt-outs honoured at ingest",
    "synthetic": "generated in-house; all rights held",
}
# (aspect, width, height, weight); a re-upload drops to the next row of its aspect.
_RESOLUTIONS = (
    ("16:9", 3840, 2160, 8), ("16:9", 1920, 1080, 34), ("16:9", 1280, 720, 13),
    ("4:3", 1440, 1080, 6), ("4:3", 640, 480, 6), ("1:1", 1080, 1080, 8),
    ("1:1", 720, 720, 5), ("9:16", 1080, 1920, 12), ("9:16", 720, 1280, 8),
)  # fmt: skip
_REAL_SCENES = (
    "a city street at rush hour", "a mountain lake", "a busy restaurant kitchen",
    "a forest trail", "a beach at low tide", "a football pitch", "an open-plan office",
    "a night market", "a desert highway", "a snowy village", "a factory floor",
    "a living room",
)  # fmt: skip
SCENES = (
    *_REAL_SCENES,
    "a simulated warehouse", "a driving-simulator intersection", "a rendered robot workcell",
    "a procedurally generated forest", "a synthetic city block", "a physics sandbox",
)  # fmt: skip
_SUBJECTS = (
    "a cyclist", "a group of people", "a dog", "a delivery robot", "a red car", "a chef",
    "a child", "a drone", "a flock of birds", "a forklift", "a runner", "a street performer",
)  # fmt: skip
_ACTIONS = (
    "moving left to right", "walking toward the camera", "turning around",
    "crossing the frame", "standing still", "picking up an object", "speeding past",
    "slowly approaching",
)  # fmt: skip
_CAMERAS = ("static", "panning left", "panning right", "dollying in", "handheld", "orbiting")
_LIGHTING = ("daylight", "overcast", "golden-hour", "night", "tungsten", "studio")
_STYLE = {
    "licensed": "Professional stock footage",
    "crawl": "Amateur web video",
    "synthetic": "A rendered simulation",
}
_CAPTIONERS = {"2": "vlm-captioner-7b-2025-11", "3": "vlm-captioner-13b-2026-05"}
_FILTER_MODELS = {
    "aesthetic": {"1": "laion-aesthetic-mlp-v1", "2": "aesthetic-vit-l14-v2"},
    "motion": {"1": "raft-flow-magnitude-v1"},
    "ocr": {"1": "ocr-text-area-v1"},
}
_JOB_STAGES = ("decode", "split", "filter", "caption", "encode")
_EMB_WEIGHTS = (0.35, 0.25, 0.40)  # scene, asset, clip: shares of a vector's variance
_COPY_DISTANCE, _BLEED_DISTANCE, _CLUSTER_DISTANCE = 0.004, 0.01, (0.003, 0.012)
_TEXT_EMB_SHAPE = (16, 64)


# -- public helpers ---------------------------------------------------------------------
def latent_shape(rung: str, width: int, height: int, num_frames: int) -> tuple[int, int, int, int]:
    """The VAE latent shape ``(16, T, h, w)`` of a clip at ``rung`` (module docstring).

    Args:
        rung: ``"<H>p"`` with ``H`` a multiple of 8.
        width: Clip width in pixels (only the aspect ratio matters).
        height: Clip height in pixels.
        num_frames: Pixel frames of the clip.
    """
    h_px = _rung_height(rung)
    t = 1 + (num_frames - 1) // 4
    return (LATENT_CHANNELS, t, h_px // 8, max(1, round(h_px * width / height / 8)))


def latent_tokens(shape: Sequence[int]) -> int:
    """Transformer tokens of a latent ``(C, T, h, w)``: ``T * ceil(h/2) * ceil(w/2)``."""
    _, t, h, w = shape
    return int(t * math.ceil(h / 2) * math.ceil(w / 2))


@dataclass(frozen=True)
class CorpusSummary:
    """What :func:`generate_corpus` wrote, and a few ids worth looking at.

    Attributes:
        seed: The generator's seed.
        assets, clips, latents, scores, captions: Catalog rows inserted.
        embeddings: Embedding rows inserted.
        latent_objects: Objects holding latents (== ``latents`` in ``files`` mode).
        latent_bytes: Sum of the latents' sizes (members, without pack padding).
        text_embeddings: Text-embedding objects referenced by captions.
        eval_assets: Assets in ``eval`` (held out + the catalog's salted carve-out, so
            the one count that depends on the catalog).
        held_out_assets: Assets the generator forced into ``eval``.
        near_duplicate_pairs: Re-uploads generated.
        linked_near_duplicates: Assets the catalog linked as near-duplicates at ingest.
        tiers: Assets per source tier.
        rungs: Rungs encoded, lowest first (the lowest for every clip).
        jobs: Stage (decode, split, filter, caption, encode) -> job id.
        near_duplicate_pair: ``(copy, original)`` asset ids of a train original.
        eval_asset_id: A held-out asset.
        many_clips_asset_id: An asset with four clips.
        eval_bleed_clip: ``(train clip, eval clip)`` ids 0.01 apart in embedding space.
        semantic_cluster: Clip ids of one designed cluster, anchor first.
    """

    seed: int
    assets: int
    clips: int
    latents: int
    scores: int
    captions: int
    embeddings: int
    latent_objects: int
    latent_bytes: int
    text_embeddings: int
    eval_assets: int
    held_out_assets: int
    near_duplicate_pairs: int
    linked_near_duplicates: int
    tiers: Mapping[str, int]
    rungs: tuple[str, ...]
    jobs: Mapping[str, str]
    near_duplicate_pair: tuple[str, str]
    eval_asset_id: str
    many_clips_asset_id: str
    eval_bleed_clip: tuple[str, str]
    semantic_cluster: tuple[str, ...]


def tombstone_asset(
    catalog: VidlakeCatalog,
    asset_id: str,
    reason: str,
    *,
    kind: Literal["soft", "hard"] = "soft",
    requested_by: str = "demo",
) -> IngestResult:
    """Record the takedown of one asset (``catalog.add_tombstones`` with one row).

    Erasing bytes for a ``hard`` takedown is the caller's job; packed latents share
    objects with other assets.
    """
    row = {"asset_id": asset_id, "reason": reason, "kind": kind, "requested_by": requested_by}
    return catalog.add_tombstones([row])


# -- the world: every attribute drawn up front, vectorised ------------------------------
@dataclass
class _World:
    """Assets (index ``a``) and their clips (row ``r``, asset-major)."""

    asset_ids: list[str]
    tier: NDArray[np.int64]
    source: NDArray[np.object_]
    license_id: NDArray[np.object_]
    territory: NDArray[np.object_]
    pii: NDArray[np.object_]
    codec: NDArray[np.object_]  # container/codec
    opt_out: NDArray[np.bool_]
    res: NDArray[np.int64]  # row of _RESOLUTIONS
    fps: NDArray[np.float64]
    bitrate: NDArray[np.int64]
    total_frames: NDArray[np.int64]
    fingerprints: list[bytes]
    scene: NDArray[np.int64]
    lighting: NDArray[np.int64]
    fetched_s: NDArray[np.int64]
    held_out: NDArray[np.bool_]
    copy_of: NDArray[np.int64]  # the original's index, -1 for an original
    many_clips: int
    clip_asset: NDArray[np.int64]
    clip_first: NDArray[np.int64]  # first row of each asset, then the end
    copy_rows: NDArray[np.int64]  # re-uploads' clip rows, aligned with orig_rows
    orig_rows: NDArray[np.int64]
    start_frame: NDArray[np.int64]
    num_frames: NDArray[np.int64]
    subject: NDArray[np.int64]
    action: NDArray[np.int64]
    camera: NDArray[np.int64]
    clip_ids: list[str]
    aesthetic: NDArray[np.float64]
    aesthetic_v1: NDArray[np.float64]  # NaN: never scored by the retired v1
    motion: NDArray[np.float64]
    ocr: NDArray[np.float64]

    @property
    def n(self) -> int:
        return len(self.asset_ids)

    def dims(self, rows: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Width and height of clip rows (the asset's resolution)."""
        res = self.res[self.clip_asset[rows]]
        return _RES_W[res], _RES_H[res]


_RES_W = np.array([r[1] for r in _RESOLUTIONS], dtype=np.int64)
_RES_H = np.array([r[2] for r in _RESOLUTIONS], dtype=np.int64)


def _pick(rng: np.random.Generator, n: int, weights: Sequence[float]) -> NDArray[np.int64]:
    p = np.asarray(weights, dtype=np.float64)
    return rng.choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def _draw(rng: np.random.Generator, keys: NDArray[np.object_], table: Choices) -> NDArray[Any]:
    """For each row, a value drawn from ``table[key of the row]``."""
    out = np.empty(len(keys), dtype=object)
    for key, (values, weights) in table.items():
        at = np.flatnonzero(keys == key)
        out[at] = np.asarray(values, dtype=object)[_pick(rng, len(at), weights)]
    return out


def _rows_of(first: NDArray[np.int64], assets: NDArray[np.int64]) -> NDArray[np.int64]:
    parts = [np.arange(first[a], first[a + 1]) for a in assets]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def _world(seed: int, n: int, flips: int) -> _World:
    rng = np.random.default_rng([seed, 1])
    n_copies, n_held = max(2, n // 150), max(1, n // 200)
    n0 = n - n_copies
    held = np.sort(rng.choice(n0, n_held, replace=False))
    others = np.setdiff1d(np.arange(n0), held)
    originals = np.concatenate([np.sort(rng.choice(others, n_copies - 1, replace=False)), held[:1]])
    copies = np.arange(n0, n)
    copy_of = np.full(n, -1, dtype=np.int64)
    copy_of[copies] = originals
    plain = np.ones(n, dtype=bool)
    plain[held] = plain[originals] = plain[copies] = False
    many_clips = int(np.flatnonzero(plain)[0])

    tier = _pick(rng, n, _TIER_SHARE)
    tier[copies] = TIERS.index("crawl")
    names = np.asarray(TIERS, dtype=object)[tier]
    source = _draw(rng, names, _SOURCES)
    codec = _draw(rng, names, _CODECS)
    res = _pick(rng, n, [r[3] for r in _RESOLUTIONS])
    synthetic = tier == TIERS.index("synthetic")
    n_real = len(_REAL_SCENES)
    scene = np.where(
        synthetic, n_real + rng.integers(0, len(SCENES) - n_real, n), rng.integers(0, n_real, n)
    )
    lighting = rng.integers(0, len(_LIGHTING), n)
    fps = _draw(rng, names, _FPS).astype(np.float64)
    n_clips = _pick(rng, n, (0.45, 0.3, 0.15, 0.1)) + 1
    n_clips[many_clips] = 4
    fp_len = rng.integers(8, 17, n)
    frames = rng.integers(0, np.iinfo(np.uint64).max, (n, 16), dtype=np.uint64, endpoint=True)
    # A re-upload is the same video (content, cuts, frame hashes) in worse bits.
    for arr in (scene, lighting, fps, n_clips, fp_len, frames):
        arr[copies] = arr[originals]
    for _ in range(flips):
        bit = rng.integers(0, 64, (n_copies, 16)).astype(np.uint64)
        frames[copies] ^= np.left_shift(np.uint64(1), bit)
    same_aspect_next = [
        i + 1 < len(_RESOLUTIONS) and _RESOLUTIONS[i + 1][0] == r[0]
        for i, r in enumerate(_RESOLUTIONS)
    ]
    res[copies] = res[originals] + np.asarray(same_aspect_next)[res[originals]]
    bpp = np.array([_BITS_PER_PIXEL[c.split("/")[1]] for c in codec])
    bitrate = (_RES_W[res] * _RES_H[res] * fps * bpp * rng.lognormal(0.0, 0.25, n)).astype(np.int64)
    bitrate[copies] = (bitrate[originals] * 0.4).astype(np.int64)  # the original is canonical

    # Clips: 4k+1 frames (whole latent frames), mostly short; cuts on frame boundaries.
    clip_asset = np.repeat(np.arange(n), n_clips)
    clip_first = np.concatenate([[0], np.cumsum(n_clips)]).astype(np.int64)
    c = len(clip_asset)
    num_frames = 4 * (4 + np.minimum(12, rng.geometric(0.45, c) - 1)) + 1
    gaps = np.round(rng.uniform(0.5, 6.0, c) * fps[clip_asset]).astype(np.int64)
    lead, tail = (np.round(rng.uniform(0.0, 3.0, n) * fps).astype(np.int64) for _ in range(2))
    subject, action, camera = (rng.integers(0, len(v), c) for v in (_SUBJECTS, _ACTIONS, _CAMERAS))
    copy_rows, orig_rows = _rows_of(clip_first, copies), _rows_of(clip_first, originals)
    for arr in (num_frames, gaps, subject, action, camera):
        arr[copy_rows] = arr[orig_rows]
    lead[copies], tail[copies] = lead[originals], tail[originals]
    span = num_frames + gaps
    ends = np.cumsum(span)
    start_frame = np.repeat(lead - (ends - span)[clip_first[:-1]], n_clips) + ends - span
    total_frames = lead + np.add.reduceat(span, clip_first[:-1]) + tail

    # Scores: asset quality by tier plus clip noise; a re-upload a little worse.
    quality = (
        np.array([6.3, 4.6, 5.6])[tier] + rng.normal(0, 1, n) * np.array([1.0, 1.3, 0.8])[tier]
    )
    quality[copies] = quality[originals] - 0.6
    aesthetic = np.clip(quality[clip_asset] + rng.normal(0, 0.4, c), 0, 10)
    v1 = np.clip(0.8 * aesthetic + 1.0 + rng.normal(0, 0.7, c), 0, 10)  # another scale
    aesthetic_v1 = np.where(rng.random(c) < 0.4, v1, np.nan)
    ct = tier[clip_asset]
    motion = np.choose(ct, [rng.beta(2, 5, c), rng.beta(1.5, 4, c), rng.beta(3, 3, c)])
    motion *= np.where(camera == 0, 0.5, 1.0) * np.where(
        (ct == 1) & (rng.random(c) < 0.05), 0.03, 1.0
    )
    ocr = np.choose(ct, [rng.beta(1, 25, c), rng.beta(1, 25, c), rng.beta(1, 60, c)])
    ocr = np.where((ct == 1) & (rng.random(c) < 0.3), rng.beta(2, 4, c), ocr)  # subtitles
    for arr in (motion, ocr):
        arr[copy_rows] = np.clip(arr[orig_rows] + rng.normal(0, 0.01, len(copy_rows)), 0, 1)

    asset_ids = [sha256_bytes(f"vidlake-synthetic:{seed}:{n}:{i}".encode()) for i in range(n)]
    t0, t1 = start_frame / fps[clip_asset], (start_frame + num_frames) / fps[clip_asset]
    clip_ids = [  # rules.clip_id, inlined: a million calls add up
        hashlib.sha256(f"{asset_ids[a]}:{s:.6f}:{e:.6f}:{SPLIT_VERSION}".encode()).hexdigest()[:32]
        for a, s, e in zip(clip_asset.tolist(), t0.tolist(), t1.tolist(), strict=True)
    ]
    return _World(
        asset_ids=asset_ids, tier=tier, source=source, license_id=_draw(rng, source, _LICENCES),
        territory=_draw(rng, names, _TERRITORIES), pii=_draw(rng, names, _PII), codec=codec,
        opt_out=(tier == TIERS.index("crawl")) & (rng.random(n) < 0.02), res=res, fps=fps,
        bitrate=bitrate, total_frames=total_frames,
        fingerprints=[frames[i, : fp_len[i]].astype(">u8").tobytes() for i in range(n)],
        scene=scene, lighting=lighting, fetched_s=rng.integers(0, 90 * 86400, n),
        held_out=np.isin(np.arange(n), held), copy_of=copy_of, many_clips=many_clips,
        clip_asset=clip_asset, clip_first=clip_first, copy_rows=copy_rows, orig_rows=orig_rows,
        start_frame=start_frame, num_frames=num_frames, subject=subject, action=action,
        camera=camera, clip_ids=clip_ids, aesthetic=np.round(aesthetic, 4),
        aesthetic_v1=np.round(aesthetic_v1, 4).astype(np.float64),
        motion=np.round(motion, 4), ocr=np.round(ocr, 4),
    )  # fmt: skip


# -- embeddings -------------------------------------------------------------------------
def _unit(x: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
    out: NDArray[np.float32] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return out


def _orthogonal(g: NDArray[np.float32], *bases: NDArray[np.float32]) -> NDArray[np.float32]:
    """Rows of ``g`` made orthogonal to the (orthonormal) rows of ``bases``, unit length."""
    for b in bases:
        g = g - np.sum(g * b, axis=1, keepdims=True) * b
    return _unit(g)


def _away(
    rng: np.random.Generator, u: NDArray[np.float32], d: NDArray[np.float64]
) -> NDArray[np.float32]:
    """Unit vectors at cosine distance ``d`` from the unit rows ``u``."""
    g = _orthogonal(rng.standard_normal(u.shape).astype(np.float32), u)
    cos = (1.0 - d)[:, None]
    return _unit(cos * u + np.sqrt(1.0 - cos**2) * g)


@dataclass
class _Designed:
    bleed: list[tuple[int, int]]  # (train clip row, held-out clip row)
    clusters: list[list[int]]  # clip rows, anchor first


def _embeddings(seed: int, w: _World, dim: int) -> tuple[NDArray[np.float32], _Designed]:
    rng = np.random.default_rng([seed, 2])
    ws, wa, wc = (math.sqrt(x) for x in _EMB_WEIGHTS)
    scene = _unit(rng.standard_normal((len(SCENES), dim)))[w.scene]
    asset = _orthogonal(rng.standard_normal((w.n, dim)).astype(np.float32), scene)
    vectors = np.empty((len(w.clip_ids), dim), dtype=np.float32)
    for lo in range(0, len(vectors), 1 << 16):  # bounds the temporaries
        own = w.clip_asset[lo : lo + (1 << 16)]
        s, a = scene[own], asset[own]
        g = _orthogonal(rng.standard_normal((len(own), dim)).astype(np.float32), s, a)
        vectors[lo : lo + len(own)] = _unit(ws * s + wa * a + wc * g)
    vectors[w.copy_rows] = _away(
        rng, vectors[w.orig_rows], np.full(len(w.copy_rows), _COPY_DISTANCE)
    )

    # Designed neighbours come from plain assets, one clip each, so none overlap.
    plain = (w.copy_of < 0) & ~w.held_out & ~np.isin(np.arange(w.n), w.copy_of)
    plain[w.many_clips] = False
    pool = w.clip_first[rng.permutation(np.flatnonzero(plain))].tolist()
    held_first = w.clip_first[np.flatnonzero(w.held_out)]
    bleed = []
    for k in range(min(max(1, w.n // 300), len(pool))):
        train, held = int(pool.pop()), int(held_first[k % len(held_first)])
        vectors[train] = _away(rng, vectors[[held]], np.array([_BLEED_DISTANCE]))[0]
        bleed.append((train, held))
    pool.sort(key=lambda r: bool(w.tier[w.clip_asset[r]] != TIERS.index("synthetic")))
    clusters: list[list[int]] = []
    while len(clusters) < max(1, w.n // 100) and pool:
        anchor = int(pool.pop(0))
        scene_of = w.scene[w.clip_asset[anchor]]
        members = [r for r in pool if w.scene[w.clip_asset[r]] == scene_of][
            : int(rng.integers(1, 4))
        ]
        if members:
            pool = [r for r in pool if r not in members]
            d = rng.uniform(*_CLUSTER_DISTANCE, len(members))
            vectors[members] = _away(rng, np.repeat(vectors[[anchor]], len(members), axis=0), d)
            clusters.append([anchor, *members])
    return vectors, _Designed(bleed, clusters)


# -- rows -------------------------------------------------------------------------------
def _asset_rows(w: _World, lo: int, hi: int, job: str) -> pa.Table:
    duration = w.total_frames[lo:hi] / w.fps[lo:hi]
    provenance, uris = [], []
    for a in range(lo, hi):
        aid, tier, source = w.asset_ids[a], TIERS[w.tier[a]], w.source[a]
        origin = {
            "licensed": f"https://{source}.example.com/clips/{aid[:12]}",
            "crawl": f"https://video.example.org/watch?v={aid[:11]}",
            "synthetic": f"sim://{source}/scenes/{w.scene[a]}/{aid[:12]}",
        }[tier]
        doc: dict[str, Any] = {
            "origin_url": origin,
            "fetched_at": (_EPOCH + dt.timedelta(seconds=int(w.fetched_s[a]))).isoformat(),
            "license": {"id": w.license_id[a], "territory": w.territory[a], "terms": _TERMS[tier]},
            "bytes": "notional: vidlake synthetic corpus",
            "decode_job": job,
        }
        if w.held_out[a]:
            doc["held_out"] = "vidlake-eval-bench-v1"
        provenance.append(json.dumps(doc, sort_keys=True))
        uris.append(f"s3://vidlake-raw/{source}/{aid[:2]}/{aid}.{w.codec[a].split('/')[0]}")
    res = w.res[lo:hi]
    return pa.table(
        {
            "asset_id": w.asset_ids[lo:hi],
            "uri": uris,
            "size": (w.bitrate[lo:hi] * duration / 8).astype(np.int64),
            "source": w.source[lo:hi].tolist(),
            "source_tier": [TIERS[t] for t in w.tier[lo:hi]],
            "license_id": w.license_id[lo:hi].tolist(),
            "territory": w.territory[lo:hi].tolist(),
            "opt_out": w.opt_out[lo:hi],
            "pii_class": w.pii[lo:hi].tolist(),
            "provenance": provenance,
            "probe_container": [c.split("/")[0] for c in w.codec[lo:hi]],
            "probe_codec": [c.split("/")[1] for c in w.codec[lo:hi]],
            "probe_width": _RES_W[res].astype(np.int32),
            "probe_height": _RES_H[res].astype(np.int32),
            "probe_fps": w.fps[lo:hi],
            "probe_duration_s": duration,
            "probe_bitrate": w.bitrate[lo:hi],
            "fingerprint": pa.array(w.fingerprints[lo:hi], pa.binary()),
            "split": pa.array(["eval" if h else None for h in w.held_out[lo:hi]], pa.string()),
        }
    )


def _clip_rows(w: _World, rows: NDArray[np.int64], job: str) -> pa.Table:
    own = w.clip_asset[rows]
    fps = w.fps[own]
    width, height = w.dims(rows)
    meta = [
        json.dumps(
            {
                "scene": SCENES[w.scene[a]],
                "lighting": _LIGHTING[w.lighting[a]],
                "subject": _SUBJECTS[w.subject[r]],
                "action": _ACTIONS[w.action[r]],
                "camera": _CAMERAS[w.camera[r]],
            }
        )
        for r, a in zip(rows.tolist(), own.tolist(), strict=True)
    ]
    return pa.table(
        {
            "clip_id": [w.clip_ids[r] for r in rows],
            "asset_id": [w.asset_ids[a] for a in own],
            "t_start_s": w.start_frame[rows] / fps,
            "t_end_s": (w.start_frame[rows] + w.num_frames[rows]) / fps,
            "split_version": [SPLIT_VERSION] * len(rows),
            "fps": fps,
            "num_frames": w.num_frames[rows].astype(np.int32),
            "width": width.astype(np.int32),
            "height": height.astype(np.int32),
            "aspect_bucket": [_RESOLUTIONS[i][0] for i in w.res[own]],
            "job_id": [job] * len(rows),
            "metadata": meta,
        }
    )


def _score_rows(w: _World, rows: NDArray[np.int64], job: str, now: dt.datetime) -> pa.Table:
    ids = np.asarray(w.clip_ids, dtype=object)[rows]
    v1 = ~np.isnan(w.aesthetic_v1[rows])
    old = now - dt.timedelta(days=120)  # the retired v1 model: "latest" must not pick it
    parts = [
        ("aesthetic", "2", ids, w.aesthetic[rows], now),
        ("motion", "1", ids, w.motion[rows], now),
        ("ocr", "1", ids, w.ocr[rows], now),
        ("aesthetic", "1", ids[v1], w.aesthetic_v1[rows][v1], old),
    ]
    names = ("clip_id", "filter_name", "filter_version", "score", "computed_at", "job_id")
    cols: dict[str, list[Any]] = {k: [] for k in names}
    for name, version, clip_ids, score, at in parts:
        k = len(clip_ids)
        for col, values in zip(
            names,
            (clip_ids.tolist(), [name] * k, [version] * k, score.tolist(), [at] * k, [job] * k),
            strict=True,
        ):
            cols[col] += values
    return pa.table(cols)


def _captions(w: _World, r: int, width: int, height: int) -> dict[tuple[str, str], str]:
    """Caption text by (version, kind), templated from the clip's attributes."""
    a = w.clip_asset[r]
    subject, action = _SUBJECTS[w.subject[r]].capitalize(), _ACTIONS[w.action[r]]
    scene, camera, light = SCENES[w.scene[a]], _CAMERAS[w.camera[r]], _LIGHTING[w.lighting[a]]
    return {
        ("2", "short"): f"{subject} {action} in {scene}.",
        ("2", "dense"): f"{subject} {action} in {scene}, {light} light, {camera} camera.",
        ("3", "short"): f"{subject} {action}, {scene}, camera {camera}.",
        ("3", "dense"): (
            f"{_STYLE[TIERS[w.tier[a]]]} of {subject.lower()} {action} in {scene}. "
            f"{light.capitalize()} lighting; the camera is {camera}. "
            f"{w.num_frames[r] / w.fps[a]:.1f} s at {w.fps[a]:g} fps, {width}x{height}."
        ),
    }


def _caption_rows(
    w: _World,
    rows: NDArray[np.int64],
    job: str,
    now: dt.datetime,
    put: Callable[[bytes], Future[PutResult]],
    rng: np.random.Generator,
    fraction: float,
) -> tuple[pa.Table, list[Future[PutResult]]]:
    """Caption rows (v2 ingested before v3) and text-embedding puts for a subset."""
    with_emb = rng.random(len(rows)) < fraction
    width, height = w.dims(rows)
    names = (
        "clip_id",
        "caption_version",
        "kind",
        "text",
        "text_embedding_sha256",
        "model_version",
        "ingested_at",
        "job_id",
    )
    cols: dict[str, list[Any]] = {k: [] for k in names}
    puts = []
    for k, r in enumerate(rows.tolist()):
        for (version, kind), text in _captions(w, r, int(width[k]), int(height[k])).items():
            emb = None
            if version == "3" and with_emb[k]:
                data = rng.standard_normal(math.prod(_TEXT_EMB_SHAPE)).astype("<f2").tobytes()
                meta = {"clip_id": w.clip_ids[r], "kind": kind}
                blob = _safetensors("text_embedding", "F16", _TEXT_EMB_SHAPE, data, meta)
                emb = sha256_bytes(blob)
                puts.append(put(blob))
            at = now if version == "3" else now - dt.timedelta(days=60)
            for col, value in zip(
                names,
                (w.clip_ids[r], version, kind, text, emb, _CAPTIONERS[version], at, job),
                strict=True,
            ):
                cols[col].append(value)
    return pa.table(cols), puts


def _job_rows(
    jobs: Mapping[str, str],
    status: str,
    started: dt.datetime,
    finished: dt.datetime | None,
    counts: Mapping[str, int],
    provenance: Mapping[str, Any],
) -> list[dict[str, Any]]:
    models: dict[str, Any] = {
        "decode": {"probe": "ffprobe-7.1", "fingerprint": "phash-dct-64-v1"},
        "split": {"scene_detector": SPLIT_VERSION},
        "filter": _FILTER_MODELS,
        "caption": _CAPTIONERS,
        "encode": {"vae": provenance["tokenizer_version"]},
    }
    return [
        {
            "job_id": job,
            "stage": stage,
            "status": status,
            "code_version": "vidlake-synthetic/1",
            "model_versions": json.dumps(models[stage], sort_keys=True),
            "started_at": started,
            "finished_at": finished,
            "host": "synthetic",
            "counts": json.dumps({"rows": counts[stage]} if stage in counts else {}),
            "provenance": json.dumps(dict(provenance), sort_keys=True),
        }
        for stage, job in jobs.items()
    ]


# -- latents ----------------------------------------------------------------------------
def _safetensors(
    key: str, dtype: str, shape: Sequence[int], data: bytes, meta: Mapping[str, str]
) -> bytes:
    """One tensor in the safetensors layout: u64 header length, JSON header, data."""
    entry = {"dtype": dtype, "shape": list(shape), "data_offsets": [0, len(data)]}
    header = json.dumps(
        {"__metadata__": dict(meta), key: entry}, separators=(",", ":"), sort_keys=True
    ).encode()
    header += b" " * (-len(header) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(header)) + header + data


def _bf16_noise(rng: np.random.Generator, n: int) -> bytes:
    # bfloat16 is the upper half of a float32 (truncation is fine for noise).
    return (rng.standard_normal(n, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


class _LatentWriter:
    """Makes the latents of a batch's clips at one rung, stores them, returns their rows."""

    def __init__(
        self,
        put: Callable[[bytes], Future[PutResult]],
        packed: bool,
        pack_bytes: int,
        tokenizer: str,
        job: str,
        report: Callable[[int], None],
    ) -> None:
        self.put, self.packed, self.pack_bytes = put, packed, pack_bytes
        self.tokenizer, self.job, self.report = tokenizer, job, report
        self.objects = self.bytes = 0

    def write(
        self, rng: np.random.Generator, w: _World, rung: str, rows: NDArray[np.int64]
    ) -> pa.Table:
        width, height = w.dims(rows)
        shapes, lengths, members = [], [], []
        stored: list[tuple[Future[PutResult], int]] = []  # (put, members in the object)
        pack: list[bytes] = []
        pack_size = 0
        for k, r in enumerate(rows.tolist()):
            shape = latent_shape(rung, int(width[k]), int(height[k]), int(w.num_frames[r]))
            meta = {"clip_id": w.clip_ids[r], "rung": rung, "tokenizer_version": self.tokenizer}
            data = _safetensors("latent", "BF16", shape, _bf16_noise(rng, math.prod(shape)), meta)
            shapes.append(shape)
            lengths.append(len(data))
            members.append(sha256_bytes(data) if self.packed else "")
            if not self.packed:
                stored.append((self.put(data), 1))
            else:
                pack.append(data + b"\0" * (-len(data) % _ALIGN))
                pack_size += len(pack[-1])
                asset_done = k + 1 == len(rows) or w.clip_asset[rows[k + 1]] != w.clip_asset[r]
                if asset_done and (pack_size >= self.pack_bytes or k + 1 == len(rows)):
                    stored.append((self.put(b"".join(pack)), len(pack)))
                    pack, pack_size = [], 0
            if (k + 1) % _REPORT_EVERY == 0:
                self.report(_REPORT_EVERY)
        self.report(len(rows) % _REPORT_EVERY)
        objects: list[str] = []
        sizes: list[int] = []
        offsets: list[int] = []
        for put, count in stored:
            info = put.result().info
            start = len(offsets)
            at = 0
            for length in lengths[start : start + count]:
                objects.append(info.sha256)
                sizes.append(info.size)
                offsets.append(at)
                at += length + (-length % _ALIGN)
        self.objects += len(stored)
        self.bytes += sum(lengths)
        n = len(rows)
        return pa.table(
            {
                "clip_id": [w.clip_ids[r] for r in rows],
                "rung": [rung] * n,
                "tokenizer_version": [self.tokenizer] * n,
                "format": ["safetensors"] * n,
                "object_sha256": objects,
                "object_size": pa.array(sizes, pa.int64()),
                "offset": pa.array(offsets, pa.int64()),
                "length": pa.array(lengths, pa.int64()),
                "member_sha256": members if self.packed else objects,
                "tensor_keys": [["latent"]] * n,
                "shapes": pa.array([[list(s)] for s in shapes], pa.list_(pa.list_(pa.int64()))),
                "dtypes": [["bfloat16"]] * n,
                "latent_frames": pa.array([s[1] for s in shapes], pa.int32()),
                "tokens": pa.array([latent_tokens(s) for s in shapes], pa.int64()),
                "job_id": [self.job] * n,
            }
        )


# -- the driver -------------------------------------------------------------------------
def _rung_height(rung: str) -> int:
    m = re.fullmatch(r"([1-9][0-9]*)p", rung) if isinstance(rung, str) else None
    if m is None or int(m.group(1)) % 8:
        raise InvalidInput(f"a rung is '<H>p' with H a multiple of 8, got {rung!r}", field="rungs")
    return int(m.group(1))


def _batches(clip_first: NDArray[np.int64], per_batch: int) -> Iterator[tuple[int, int]]:
    """Asset ranges ``[lo, hi)`` holding at most ``per_batch`` clips (or one asset)."""
    n, lo = len(clip_first) - 1, 0
    while lo < n:
        hi = int(np.searchsorted(clip_first, clip_first[lo] + per_batch, side="right")) - 1
        hi = min(n, max(hi, lo + 1))
        yield lo, hi
        lo = hi


def _int_arg(name: str, value: object, low: int, high: int = 2**63) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise InvalidInput(
            f"{name} must be an integer in [{low}, {high}), got {value!r}", field=name
        )


def _check_args(args: Mapping[str, Any]) -> tuple[str, ...]:
    _int_arg("assets", args["assets"], 10)
    _int_arg("seed", args["seed"], 0)
    _int_arg("embedding_dim", args["embedding_dim"], 8, 1 << 16)
    _int_arg("pack_bytes", args["pack_bytes"], 1)
    rungs = args["rungs"]
    if isinstance(rungs, str) or not isinstance(rungs, Sequence) or not rungs:
        raise InvalidInput(
            "rungs must be a non-empty sequence such as ('128p', '256p')", field="rungs"
        )
    ordered = tuple(sorted(rungs, key=_rung_height))
    if len(set(ordered)) != len(ordered):
        raise InvalidInput(f"rungs repeat: {list(rungs)}", field="rungs")
    if args["latents"] not in ("files", "packed"):
        raise InvalidInput(
            f"latents is 'files' or 'packed', got {args['latents']!r}", field="latents"
        )
    for name in ("tokenizer_version", "embedding_model"):
        if not isinstance(args[name], str) or not args[name].strip():
            raise InvalidInput(f"{name} must be a non-empty string", field=name)
    fraction = args["text_embeddings"]
    if not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
        raise InvalidInput(
            f"text_embeddings is a fraction in [0, 1], got {fraction!r}", field="text_embeddings"
        )
    gate = args["high_rung_min_aesthetic"]
    if not isinstance(gate, int | float) or not math.isfinite(gate):
        raise InvalidInput(
            f"high_rung_min_aesthetic must be finite, got {gate!r}", field="high_rung_min_aesthetic"
        )
    return ordered


def generate_corpus(
    catalog: VidlakeCatalog,
    *,
    assets: int = 1500,
    seed: int = 0,
    rungs: Sequence[str] = ("128p", "256p"),
    tokenizer_version: str = "vae-8x8x4-c16-v1",
    embedding_model: str = "siglip-demo-v1",
    embedding_dim: int = 64,
    latents: Literal["files", "packed"] = "files",
    progress: Progress | None = None,
    high_rung_min_aesthetic: float = 6.5,
    pack_bytes: int = 64 << 20,
    text_embeddings: float = 0.1,
) -> CorpusSummary:
    """Generate a synthetic corpus into ``catalog`` (see the module docstring).

    Args:
        catalog: An open catalog; its object store receives latents and text embeddings.
        assets: Assets to generate (>= 10), re-uploads included.
        seed: Everything but timestamps and the catalog's own carve-out follows from it.
        rungs: Resolution rungs ``"<H>p"``; the lowest is encoded for every clip.
        tokenizer_version: Recorded on every latent.
        embedding_model: The embedding model version (LanceDB table) to fill.
        embedding_dim: Embedding dimension.
        latents: ``files`` (an object per latent) or ``packed`` (shared objects).
        progress: ``progress(stage, done, total)`` for each of :data:`STAGES`.
        high_rung_min_aesthetic: Higher rungs are encoded only for clips whose
            aesthetic v2 score reaches this (0 encodes every rung for every clip).
        pack_bytes: Target size of a packed object.
        text_embeddings: Fraction of clips whose v3 captions get a float16 text
            embedding object (0 for none).

    Raises:
        InvalidInput: A bad argument; nothing was written.
        Conflict: This corpus (seed and size) is already in the catalog.
    """
    rungs = _check_args(locals())
    report = progress or (lambda stage, done, total: None)
    w = _world(seed, assets, min(2, catalog.config.near_dup_hamming))
    first = w.asset_ids[0]
    if catalog.scan(
        "assets", columns=["asset_id"], row_filter=f"asset_id = '{first}'", include_eval=True
    ).num_rows:
        raise Conflict(
            f"the synthetic corpus of seed {seed} with {assets} assets is already in the catalog",
            asset_id=first,
        )
    vectors, designed = _embeddings(seed, w, embedding_dim)
    is_eval = w.held_out | eval_mask(w.asset_ids, catalog.eval_salt, catalog.eval_fraction)
    high = w.aesthetic >= high_rung_min_aesthetic
    c, v1 = len(w.clip_ids), int((~np.isnan(w.aesthetic_v1)).sum())
    totals = {
        "assets": assets,
        "clips": c,
        "latents": c + int(high.sum()) * (len(rungs) - 1),
        "scores": 3 * c + v1,
        "captions": 4 * c,
        "embeddings": c,
    }
    done = dict.fromkeys(STAGES, 0)

    def advance(stage: str, k: int) -> None:
        done[stage] += k
        report(stage, done[stage], totals[stage])

    for stage in STAGES:
        report(stage, 0, totals[stage])
    now = dt.datetime.now(dt.UTC)
    jobs = {
        s: f"synth-{s}-{sha256_bytes(f'{seed}:{assets}:{s}'.encode())[:16]}" for s in _JOB_STAGES
    }
    about = {
        "generator": "catalog.synthetic",
        "seed": seed,
        "assets": assets,
        "tokenizer_version": tokenizer_version,
    }
    catalog.add_jobs(_job_rows(jobs, "running", now, None, {}, about))
    store, index = catalog.objects, catalog.embeddings(embedding_model)
    results: dict[str, list[IngestResult]] = {s: [] for s in STAGES[:-1]}
    n_text = n_emb = 0
    in_flight = threading.BoundedSemaphore(_MAX_IN_FLIGHT)  # bounds the bytes held for puts
    with ThreadPoolExecutor(_PUT_WORKERS) as pool:

        def put(data: bytes) -> Future[PutResult]:
            in_flight.acquire()
            future = pool.submit(store.put_bytes, data)
            future.add_done_callback(lambda _: in_flight.release())
            return future

        writer = _LatentWriter(
            put,
            latents == "packed",
            pack_bytes,
            tokenizer_version,
            jobs["encode"],
            lambda k: advance("latents", k),
        )
        for b, (lo, hi) in enumerate(_batches(w.clip_first, _CLIPS_PER_BATCH)):
            rows = np.arange(w.clip_first[lo], w.clip_first[hi], dtype=np.int64)
            results["assets"].append(catalog.add_assets(_asset_rows(w, lo, hi, jobs["decode"])))
            advance("assets", hi - lo)
            results["clips"].append(catalog.add_clips(_clip_rows(w, rows, jobs["split"])))
            advance("clips", len(rows))
            rng = np.random.default_rng([seed, 3, b])
            parts = [
                writer.write(rng, w, rung, rows if i == 0 else rows[high[rows]])
                for i, rung in enumerate(rungs)
            ]
            results["latents"].append(catalog.add_latents(pa.concat_tables(parts)))
            scores = _score_rows(w, rows, jobs["filter"], now)
            results["scores"].append(catalog.add_scores(scores))
            advance("scores", scores.num_rows)
            rng = np.random.default_rng([seed, 4, b])
            captions, puts = _caption_rows(w, rows, jobs["caption"], now, put, rng, text_embeddings)
            n_text += len([p.result() for p in puts])  # stored before the rows that name them
            results["captions"].append(catalog.add_captions(captions))
            advance("captions", captions.num_rows)
            own = w.clip_asset[rows]
            added = index.add(
                [w.clip_ids[r] for r in rows],
                [w.asset_ids[a] for a in own],
                np.where(is_eval[own], "eval", "train").tolist(),
                vectors[rows],
            )
            n_emb += added.inserted
            advance("embeddings", len(rows))
    inserted = {k: sum(r.inserted for r in v) for k, v in results.items()}
    stage_tables = {"decode": "assets", "split": "clips", "filter": "scores"}
    stage_tables |= {"caption": "captions", "encode": "latents"}
    counts = {stage: inserted[table] for stage, table in stage_tables.items()}
    catalog.add_jobs(_job_rows(jobs, "succeeded", now, dt.datetime.now(dt.UTC), counts, about))
    copies = np.flatnonzero(w.copy_of >= 0)
    train, held = designed.bleed[0]
    return CorpusSummary(
        seed=seed,
        assets=inserted["assets"],
        clips=inserted["clips"],
        latents=inserted["latents"],
        scores=inserted["scores"],
        captions=inserted["captions"],
        embeddings=n_emb,
        latent_objects=writer.objects,
        latent_bytes=writer.bytes,
        text_embeddings=n_text,
        eval_assets=sum(r.eval for r in results["assets"]),
        held_out_assets=int(w.held_out.sum()),
        near_duplicate_pairs=len(copies),
        linked_near_duplicates=sum(r.near_duplicates for r in results["assets"]),
        tiers={t: int((w.tier == i).sum()) for i, t in enumerate(TIERS)},
        rungs=rungs,
        jobs=jobs,
        near_duplicate_pair=(w.asset_ids[copies[0]], w.asset_ids[w.copy_of[copies[0]]]),
        eval_asset_id=w.asset_ids[int(np.flatnonzero(w.held_out)[0])],
        many_clips_asset_id=w.asset_ids[w.many_clips],
        eval_bleed_clip=(w.clip_ids[train], w.clip_ids[held]),
        semantic_cluster=tuple(w.clip_ids[r] for r in designed.clusters[0])
        if designed.clusters
        else (),
    )
