"""The synthetic corpus's world: every attribute of every asset and clip drawn up front
(vectorised), and the designed embedding geometry.

Part of :mod:`service.demo.corpus` (whose docstring describes the corpus); a pure
function of ``(seed, assets)``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from catalog.hashing import sha256_bytes

__all__ = [
    "ACTIONS",
    "CAMERAS",
    "EPOCH",
    "LIGHTING",
    "RESOLUTIONS",
    "RES_H",
    "RES_W",
    "SCENES",
    "SPLIT_VERSION",
    "SUBJECTS",
    "TIERS",
    "Designed",
    "World",
    "draw_embeddings",
    "draw_world",
]

SPLIT_VERSION = "scenecut-adaptive-v3"
EPOCH = dt.datetime(2026, 7, 1, tzinfo=dt.UTC)  # provenance times are seeded, not clocked
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
# (aspect, width, height, weight); a re-upload drops to the next row of its aspect.
RESOLUTIONS = (
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
SUBJECTS = (
    "a cyclist", "a group of people", "a dog", "a delivery robot", "a red car", "a chef",
    "a child", "a drone", "a flock of birds", "a forklift", "a runner", "a street performer",
)  # fmt: skip
ACTIONS = (
    "moving left to right", "walking toward the camera", "turning around",
    "crossing the frame", "standing still", "picking up an object", "speeding past",
    "slowly approaching",
)  # fmt: skip
CAMERAS = ("static", "panning left", "panning right", "dollying in", "handheld", "orbiting")
LIGHTING = ("daylight", "overcast", "golden-hour", "night", "tungsten", "studio")
_EMB_WEIGHTS = (0.35, 0.25, 0.40)  # scene, asset, clip: shares of a vector's variance
_COPY_DISTANCE, _BLEED_DISTANCE, _CLUSTER_DISTANCE = 0.004, 0.01, (0.003, 0.012)


# -- the world: every attribute drawn up front, vectorised ------------------------------
@dataclass
class World:
    """Assets (index ``a``) and their clips (row ``r``, asset-major)."""

    asset_ids: list[str]
    tier: NDArray[np.int64]
    source: NDArray[np.object_]
    license_id: NDArray[np.object_]
    territory: NDArray[np.object_]
    pii: NDArray[np.object_]
    codec: NDArray[np.object_]  # container/codec
    opt_out: NDArray[np.bool_]
    res: NDArray[np.int64]  # row of RESOLUTIONS
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
        return RES_W[res], RES_H[res]


RES_W = np.array([r[1] for r in RESOLUTIONS], dtype=np.int64)
RES_H = np.array([r[2] for r in RESOLUTIONS], dtype=np.int64)


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


def draw_world(seed: int, n: int, flips: int) -> World:
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
    res = _pick(rng, n, [r[3] for r in RESOLUTIONS])
    synthetic = tier == TIERS.index("synthetic")
    n_real = len(_REAL_SCENES)
    scene = np.where(
        synthetic, n_real + rng.integers(0, len(SCENES) - n_real, n), rng.integers(0, n_real, n)
    )
    lighting = rng.integers(0, len(LIGHTING), n)
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
        i + 1 < len(RESOLUTIONS) and RESOLUTIONS[i + 1][0] == r[0]
        for i, r in enumerate(RESOLUTIONS)
    ]
    res[copies] = res[originals] + np.asarray(same_aspect_next)[res[originals]]
    bpp = np.array([_BITS_PER_PIXEL[c.split("/")[1]] for c in codec])
    bitrate = (RES_W[res] * RES_H[res] * fps * bpp * rng.lognormal(0.0, 0.25, n)).astype(np.int64)
    bitrate[copies] = (bitrate[originals] * 0.4).astype(np.int64)  # the original is canonical

    # Clips: 4k+1 frames (whole latent frames), mostly short; cuts on frame boundaries.
    clip_asset = np.repeat(np.arange(n), n_clips)
    clip_first = np.concatenate([[0], np.cumsum(n_clips)]).astype(np.int64)
    c = len(clip_asset)
    num_frames = 4 * (4 + np.minimum(12, rng.geometric(0.45, c) - 1)) + 1
    gaps = np.round(rng.uniform(0.5, 6.0, c) * fps[clip_asset]).astype(np.int64)
    lead, tail = (np.round(rng.uniform(0.0, 3.0, n) * fps).astype(np.int64) for _ in range(2))
    subject, action, camera = (rng.integers(0, len(v), c) for v in (SUBJECTS, ACTIONS, CAMERAS))
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
    return World(
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
class Designed:
    bleed: list[tuple[int, int]]  # (train clip row, held-out clip row)
    clusters: list[list[int]]  # clip rows, anchor first


def draw_embeddings(seed: int, w: World, dim: int) -> tuple[NDArray[np.float32], Designed]:
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
    return vectors, Designed(bleed, clusters)
