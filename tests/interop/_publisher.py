"""A TAR-shard training cache exactly as its publisher writes it (no vidlake fields).

The layout of a team's existing cache (a CS:GO gameplay latent cache), which vidlake
must import unchanged (issue 18)::

    manifest.json                      the current verified snapshot (= the newest version)
    manifests/v000001.json             immutable history, one file per version
    manifests/v000002.json
    shards/worker-00/shard-000000.tar  written by worker 00
    shards/worker-01/shard-000000.tar  written by worker 01 (added in v000002)
    shards/worker-01/shard-000001.tar  a TAR no manifest lists (never to be read)

A manifest::

    {"schema": "csgo-latent-cache/v3", "version": 2, "created_at": "…",
     "model_revisions": {"vae": "wan21-vae@3f9a", "text_encoder": "umt5-xxl@77c0"},
     "split": {"key": "match_id", "method": "sha256_mod", "modulus": 100, "val_below": 2},
     "exclude_sample_ids": ["…"],
     "shards": [{"path": "shards/worker-00/shard-000000.tar", "size": …,
                 "sha256": "…", "revision": 1, "num_samples": 6}, …]}

No per-shard sample ids or split: sample ids are the TAR member names, and a sample is
``val`` when ``int(sha256(match_id), 16) % modulus < val_below`` (about 2 % of matches).
Each TAR holds ordered pairs ``<sample_id>.pt`` (``torch.save`` of a dict of tensors:
``latent`` [1, 16, T, H, W] float32, ``text_emb`` [1, L, D] bfloat16, ``state``
[1, T, 5] float32, ``interaction`` [1, T] int64) and ``<sample_id>.json``: metadata
with the member's SHA-256 — at the top level (``sha256``, worker 00) or in a nested
``members`` map keyed by member name (worker 01), as the two workers' code differs.
No sidecar carries ``latent_frames``, ``shape``, ``tokens`` or ``tensor_keys``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SCHEMA = "csgo-latent-cache/v3"
MODEL_REVISIONS = {"vae": "wan21-vae@3f9a", "text_encoder": "umt5-xxl@77c0"}
SPLIT_RULE = {"key": "match_id", "method": "sha256_mod", "modulus": 100, "val_below": 2}
FRAMES = 3
LATENT_HW = (8, 8)
TEXT_LD = (6, 8)
TENSORS = {
    "latent": ((1, 16, FRAMES, *LATENT_HW), torch.float32),
    "text_emb": ((1, *TEXT_LD), torch.bfloat16),
    "state": ((1, FRAMES, 5), torch.float32),
    "interaction": ((1, FRAMES), torch.int64),
}
SHARDS = ("shards/worker-00/shard-000000.tar", "shards/worker-01/shard-000000.tar")
STRAY = "shards/worker-01/shard-000001.tar"


def is_val(match_id: str) -> bool:
    """The publisher's split rule (``SPLIT_RULE``)."""
    digest = int(hashlib.sha256(match_id.encode()).hexdigest(), 16)
    return digest % SPLIT_RULE["modulus"] < SPLIT_RULE["val_below"]  # type: ignore[operator]


def _matches(n_train: int) -> list[str]:
    """One val match first, then ``n_train`` train matches: stable names by rule."""
    val = next(f"match-{k:05d}" for k in range(100_000) if is_val(f"match-{k:05d}"))
    train = [f"match-{k:05d}" for k in range(1000) if not is_val(f"match-{k:05d}")]
    return [val, *train[:n_train]]


@dataclass
class PublishedCache:
    """What the fixture wrote, for the tests to check against."""

    root: Path
    sample_ids: list[str] = field(default_factory=list)  # every sample in the TARs
    val_ids: list[str] = field(default_factory=list)
    v1_ids: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    match_of: dict[str, str] = field(default_factory=dict)
    member_sha: dict[str, str] = field(default_factory=dict)
    shard_sha: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    stray: str = STRAY


def _pt(seed: int) -> tuple[bytes, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for key, (shape, dtype) in TENSORS.items():
        if dtype.is_floating_point:
            out[key] = torch.randn(shape, generator=g).to(dtype)
        else:
            out[key] = torch.randint(0, 64, shape, generator=g, dtype=dtype)
    buf = io.BytesIO()
    torch.save(out, buf)
    return buf.getvalue(), out


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _sidecar(sid: str, match: str, rnd: int, sha: str, size: int, nested: bool) -> bytes:
    side: dict[str, Any] = {
        "sample_id": sid,
        "match_id": match,
        "map": "de_dust2",
        "round": rnd,
        "tick_start": rnd * 1000,
        "tick_end": rnd * 1000 + 48,
        "fps": 16.0,
        "width": 64,
        "height": 64,
        "caption": f"round {rnd} of {match}",
    }
    if nested:
        side["members"] = {f"{sid}.pt": {"sha256": sha, "size": size}}
    else:
        side["sha256"] = sha
    return json.dumps(side).encode()


def write_published_cache(root: Path, *, per_shard: int = 6) -> PublishedCache:
    """Write the cache of the module docstring under ``root``; 2 samples per match."""
    root.mkdir(parents=True, exist_ok=True)
    cache = PublishedCache(root)
    matches = _matches(per_shard * len(SHARDS) // 2)
    entries: list[dict[str, Any]] = []
    n = 0
    for w, path in enumerate(SHARDS):
        members: list[tuple[str, bytes]] = []
        for _ in range(per_shard):
            match, rnd = matches[n // 2], n % 2 + 1
            sid = f"{match}-r{rnd:02d}"
            data, tensors = _pt(n)
            sha = hashlib.sha256(data).hexdigest()
            members += [
                (f"{sid}.pt", data),
                (f"{sid}.json", _sidecar(sid, match, rnd, sha, len(data), w == 1)),
            ]
            cache.sample_ids.append(sid)
            cache.match_of[sid] = match
            cache.member_sha[sid] = sha
            cache.tensors[sid] = tensors
            if is_val(match):
                cache.val_ids.append(sid)
            n += 1
        raw = _tar(members)
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(raw)
        sha = hashlib.sha256(raw).hexdigest()
        cache.shard_sha[path] = sha
        entries.append(
            {"path": path, "size": len(raw), "sha256": sha, "revision": w + 1,
             "num_samples": per_shard}
        )  # fmt: skip
        if w == 0:
            cache.v1_ids = list(cache.sample_ids)
    cache.excluded = [cache.sample_ids[-1]]  # v2 drops one sample (of worker 01)

    def manifest(version: int, shards: list[dict[str, Any]], exclude: list[str]) -> bytes:
        doc = {
            "schema": SCHEMA,
            "version": version,
            "created_at": f"2026-11-0{version}T00:00:00Z",
            "model_revisions": MODEL_REVISIONS,
            "split": SPLIT_RULE,
            "exclude_sample_ids": exclude,
            "shards": shards,
        }
        return json.dumps(doc, indent=2).encode()

    (root / "manifests").mkdir(exist_ok=True)
    v1, v2 = manifest(1, entries[:1], []), manifest(2, entries, cache.excluded)
    (root / "manifests" / "v000001.json").write_bytes(v1)
    (root / "manifests" / "v000002.json").write_bytes(v2)
    (root / "manifest.json").write_bytes(v2)
    stray, _ = _pt(999)
    (root / STRAY).write_bytes(_tar([("x.pt", stray), ("x.json", b"{}")]))
    return cache
