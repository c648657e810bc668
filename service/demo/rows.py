"""The synthetic corpus's catalog rows: assets, clips, scores, captions and jobs of a
batch, as Arrow tables (part of :mod:`service.demo.corpus`)."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from catalog.hashing import sha256_bytes

if TYPE_CHECKING:
    from catalog.objects import PutResult

from service.demo.latents import safetensors_bytes
from service.demo.world import (
    ACTIONS,
    CAMERAS,
    EPOCH,
    LIGHTING,
    RES_H,
    RES_W,
    RESOLUTIONS,
    SCENES,
    SPLIT_VERSION,
    SUBJECTS,
    TIERS,
    World,
)

__all__ = ["asset_rows", "caption_rows", "clip_rows", "job_rows", "score_rows"]

_TERMS = {
    "licensed": "commercial model training; no redistribution of source; territory-limited",
    "crawl": "as stated by the hosting page; opt-outs honoured at ingest",
    "synthetic": "generated in-house; all rights held",
}
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
TEXT_EMB_SHAPE = (16, 64)


# -- rows -------------------------------------------------------------------------------
def asset_rows(w: World, lo: int, hi: int, job: str) -> pa.Table:
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
            "fetched_at": (EPOCH + dt.timedelta(seconds=int(w.fetched_s[a]))).isoformat(),
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
            "probe_width": RES_W[res].astype(np.int32),
            "probe_height": RES_H[res].astype(np.int32),
            "probe_fps": w.fps[lo:hi],
            "probe_duration_s": duration,
            "probe_bitrate": w.bitrate[lo:hi],
            "fingerprint": pa.array(w.fingerprints[lo:hi], pa.binary()),
            "split": pa.array(["eval" if h else None for h in w.held_out[lo:hi]], pa.string()),
        }
    )


def clip_rows(w: World, rows: NDArray[np.int64], job: str) -> pa.Table:
    own = w.clip_asset[rows]
    fps = w.fps[own]
    width, height = w.dims(rows)
    meta = [
        json.dumps(
            {
                "scene": SCENES[w.scene[a]],
                "lighting": LIGHTING[w.lighting[a]],
                "subject": SUBJECTS[w.subject[r]],
                "action": ACTIONS[w.action[r]],
                "camera": CAMERAS[w.camera[r]],
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
            "aspect_bucket": [RESOLUTIONS[i][0] for i in w.res[own]],
            "job_id": [job] * len(rows),
            "metadata": meta,
        }
    )


def score_rows(w: World, rows: NDArray[np.int64], job: str, now: dt.datetime) -> pa.Table:
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


def _captions(w: World, r: int, width: int, height: int) -> dict[tuple[str, str], str]:
    """Caption text by (version, kind), templated from the clip's attributes."""
    a = w.clip_asset[r]
    subject, action = SUBJECTS[w.subject[r]].capitalize(), ACTIONS[w.action[r]]
    scene, camera, light = SCENES[w.scene[a]], CAMERAS[w.camera[r]], LIGHTING[w.lighting[a]]
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


def caption_rows(
    w: World,
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
                data = rng.standard_normal(math.prod(TEXT_EMB_SHAPE)).astype("<f2").tobytes()
                meta = {"clip_id": w.clip_ids[r], "kind": kind}
                blob = safetensors_bytes("text_embedding", "F16", TEXT_EMB_SHAPE, data, meta)
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


def job_rows(
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
