"""A small, deterministic catalog with published snapshots for the service tests.

Eight train assets and two eval assets (forced ``split = eval`` at ingest, so nothing
depends on the random carve-out salt), two clips per asset, a latent object per
clip, two versions of an ``aesthetic`` score, captions, a tombstone, and two
snapshot versions published through the real registry with the artifact schemas of
:mod:`manifests.format` (a stand-in for the cut until ``materializer.cut`` exists).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from manifests.format import FORMAT_VERSION, INDEX_SCHEMA, PLAN_SCHEMA
from manifests.ipc import write_table
from manifests.registry import Registry, SnapshotRecord, canonical_json
from service.auth import hash_token
from service.settings import Settings
from tests.catalog._latents import safetensors_bytes

with warnings.catch_warnings():
    # starlette warns at import that it prefers httpx2; the suite turns warnings into
    # errors, and the deprecation is starlette's, not ours.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient as _TestClient


class TestClient(_TestClient):
    """Starlette's test client, calling from a loopback address (an open service
    refuses any other client; starlette's default client host is ``testclient``)."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        kwargs.setdefault("client", ("127.0.0.1", 50000))
        super().__init__(app, **kwargs)


__all__ = [
    "STREAMS",
    "TOKENS",
    "TestClient",
    "World",
    "artifact_table",
    "assert_error",
    "bearer",
    "build_world",
    "publish_fake_cut",
    "serve",
    "write_fake_cut",
    "write_tokens",
]

STREAMS = ["main", "aux"]
#: token -> scopes of the tokens file :func:`write_tokens` writes.
TOKENS = {
    "tok-read": ["read"],
    "tok-write": ["write"],
    "tok-cut": ["read", "cut"],
    "tok-admin": ["admin"],
    "tok-eval": ["read", "eval"],
}


def write_tokens(path: Path, tokens: dict[str, list[str]] | None = None) -> Path:
    body = {
        hash_token(t): {"name": t, "scopes": scopes} for t, scopes in (tokens or TOKENS).items()
    }
    path.write_text(json.dumps({"tokens": body}))
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is an error of the one shape, with this status (and code)."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    return dict(body["error"])


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class World:
    home: Path
    catalog: VidlakeCatalog
    registry: Registry
    train_assets: list[str]
    eval_assets: list[str]
    clips: dict[str, str] = field(default_factory=dict)  # clip id -> asset id
    clip_split: dict[str, str] = field(default_factory=dict)
    latent_object: dict[str, str] = field(default_factory=dict)  # clip id -> object sha
    tombstoned: str = ""
    versions: list[int] = field(default_factory=list)

    @property
    def train_clips(self) -> list[str]:
        return sorted(c for c, s in self.clip_split.items() if s == "train")

    @property
    def eval_clips(self) -> list[str]:
        return sorted(c for c, s in self.clip_split.items() if s == "eval")

    def settings(self, **overrides: Any) -> Settings:
        return Settings(home=self.home, **overrides)


def build_world(home: Path, *, snapshots: int = 2) -> World:
    """Fill a fresh embedded catalog under ``home`` and publish ``snapshots`` cuts."""
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(home, eval_fraction=0.0))
    registry = Registry(catalog.objects)
    train = [sha(f"asset-{i}") for i in range(8)]
    evals = [sha(f"eval-asset-{i}") for i in range(2)]
    assets = [
        {
            "asset_id": a,
            "uri": f"s3://raw/{a[:8]}.mp4",
            "size": 1000 + i,
            "source": "stock-a" if i % 2 else "stock-b",
            "source_tier": "licensed",
            "license_id": f"lic-{i % 3}",
            "provenance": '{"vendor": "acme", "batch": 7}',
            **({"split": "eval"} if a in evals else {}),
        }
        for i, a in enumerate(train + evals)
    ]
    catalog.add_assets(assets)
    clips = [
        {
            "asset_id": a,
            "t_start_s": float(k * 2),
            "t_end_s": float(k * 2 + 2),
            "split_version": "v1",
            "num_frames": 48,
            "width": 640,
            "height": 360,
            "fps": 24.0,
        }
        for a in train + evals
        for k in range(2)
    ]
    catalog.add_clips(clips)
    table = catalog.scan("clips", include_eval=True, columns=["clip_id", "asset_id", "split"])
    world = World(home, catalog, registry, train, evals)
    for c, a, s in zip(*(table.column(n).to_pylist() for n in table.column_names), strict=True):
        world.clips[c] = a
        world.clip_split[c] = s
    latents = []
    for clip_id in sorted(world.clips):
        latent = safetensors_bytes(
            {"latent": ("BF16", [4, 12, 4, 4])}, header={"__metadata__": {"clip_id": clip_id}}
        )
        put = catalog.objects.put_bytes(latent)
        world.latent_object[clip_id] = put.info.sha256
        latents.append(
            {
                "clip_id": clip_id,
                "rung": "256p",
                "tokenizer_version": "vae-v1",
                "format": "safetensors",
                "object_sha256": put.info.sha256,
                "tensor_keys": ["latent"],
                "latent_frames": 12,
                "tokens": 1024,
            }
        )
    catalog.add_latents(latents)
    catalog.add_scores(
        [
            {"clip_id": c, "filter_name": "aesthetic", "filter_version": v, "score": s}
            for i, c in enumerate(sorted(world.clips))
            for v, s in (("1", 4.0 + i / 10), ("2", 5.0 + i / 10))
        ]
    )
    catalog.add_captions(
        [
            {"clip_id": c, "caption_version": "1", "kind": "dense", "text": f"a clip {c[:6]}"}
            for c in sorted(world.clips)
        ]
    )
    world.tombstoned = train[-1]
    catalog.add_tombstones([{"asset_id": train[-1], "reason": "dmca", "kind": "soft"}])
    for seed in range(snapshots):
        publish_fake_cut(world, home / "cuts" / f"seed{seed}", seed=seed)
    return world


def publish_fake_cut(
    world: World, directory: Path, *, seed: int, with_eval: bool = False
) -> SnapshotRecord:
    """Publish a cut of the world's train clips (not the tombstoned asset's); with
    ``with_eval``, a broken one that holds the eval clips too."""
    paths, snapshot = write_fake_cut(world, directory, seed=seed, with_eval=with_eval)
    record = world.registry.publish(paths, snapshot, parent=world.registry.next_parent())
    world.versions.append(record.version)
    return record


def write_fake_cut(
    world: World, directory: Path, *, seed: int, with_eval: bool = False
) -> tuple[dict[str, Path], dict[str, Any]]:
    """The artifacts and metadata of a cut of the world's train clips."""
    directory.mkdir(parents=True, exist_ok=True)
    clip_ids = [c for c in world.train_clips if world.clips[c] != world.tombstoned]
    if with_eval:
        clip_ids += world.eval_clips
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(clip_ids))
    clip_ids = [clip_ids[i] for i in order]
    n = len(clip_ids)
    rows = np.arange(n, dtype=np.int64)
    index = pa.table(
        {
            "row": rows,
            "clip_id": pa.array(clip_ids, pa.string()),
            "asset_id": pa.array([world.clips[c] for c in clip_ids], pa.string()),
            "stream": (rows % len(STREAMS)).astype(np.int32),
            "bucket": np.zeros(n, np.int32),
            "num_frames": np.full(n, 48, np.int32),
            "tokens": np.full(n, 1024, np.int64),
            "object_sha256": [world.latent_object[c] for c in clip_ids],
            "offset": np.zeros(n, np.int64),
            "length": np.full(n, 100, np.int64),
            "member_sha256": [world.latent_object[c] for c in clip_ids],
            "format": ["safetensors"] * n,
            "tensor_keys": [["latent"]] * n,
            "captions": [[f"a clip {c[:6]}"] for c in clip_ids],
            "text_embedding_sha256": [[sha(f"te-{c}")] for c in clip_ids],
        },
        schema=INDEX_SCHEMA,
    )
    write_table(directory / "index.arrow", index, max_chunksize=5)
    steps = [rng.choice(n, size=4, replace=False).tolist() for _ in range(6)]
    plan = pa.table(
        {
            "step": np.arange(len(steps), dtype=np.int64),
            "phase": np.zeros(len(steps), np.int32),
            "bucket": np.zeros(len(steps), np.int32),
            "stream_epochs": pa.array(
                [[0, i // 3] for i in range(len(steps))], pa.list_(pa.int32())
            ),
            "rows": pa.array(steps, pa.list_(pa.int64())),
            "skipped": np.zeros(len(steps), np.int32),
        },
        schema=PLAN_SCHEMA,
    )
    write_table(directory / "plan.arrow", plan, max_chunksize=4)
    manifest = index.append_column(
        "tier", pa.array(["gold" if i % 2 else "silver" for i in range(n)])
    ).append_column("phase", pa.array(np.zeros(n, np.int32)))
    pq.write_table(manifest, str(directory / "manifest.parquet"), row_group_size=4)
    recipe = {
        "name": f"fake-{seed}",
        "seed": seed,
        "filters": [{"name": "aesthetic", "version": "2"}],
    }
    snapshot = {
        "format": FORMAT_VERSION,
        "recipe": recipe,
        "recipe_sha256": hashlib.sha256(canonical_json(recipe)).hexdigest(),
        "catalog_snapshot_ids": world.catalog.pin().to_dict(),
        "seed": seed,
        "code_version": "test",
        "counts": {"clips": n, "samples": n},
        "drops": {"tombstoned": 2},
        "stream_shares": {"main": 0.5, "aux": 0.5},
        "bucket_histogram": {"0": n},
        "streams": STREAMS,
        "buckets": [{"id": 0, "num_frames": 48, "aspect": "16:9"}],
        "phases": [
            {"name": "p0", "rung": "256p", "first_step": 0, "num_steps": 6, "rank_multiple": 1}
        ],
        "num_steps": len(steps),
        "plan_rows": sum(len(s) for s in steps),
    }
    paths = {name: directory / name for name in ("manifest.parquet", "plan.arrow", "index.arrow")}
    return paths, snapshot


def artifact_table(registry: Registry, version: int, name: str) -> pa.Table:
    """An Arrow IPC file artifact of ``version``, read whole (verified)."""
    return pa.ipc.open_file(pa.BufferReader(registry.read_artifact(version, name))).read_all()


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free loopback port in a thread; yield its URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def world_recipe(name: str, *, seed: int) -> dict[str, Any]:
    """A recipe that fits :func:`build_world`'s catalog (its tokenizer, filter, caption
    version, sources and rung), small enough to cut in a test."""
    return {
        "name": name,
        "seed": seed,
        "tokenizer_version": "vae-v1",
        "filters": [{"name": "aesthetic", "version": "2", "min": 0.0}],
        "streams": [
            {"name": "a", "where": "source = 'stock-a'"},
            {"name": "b", "where": "source = 'stock-b'"},
        ],
        "captions": {"version": "1", "kinds": ["dense"]},
        "buckets": {"latent_frames": [12], "aspect_ratios": ["16:9"]},
        "phases": [
            {
                "name": "p",
                "rung": "256p",
                "weights": {"a": 0.5, "b": 0.5},
                "steps": 5,
                "global_batch": 4,
                "rank_multiple": 1,
            }
        ],
    }
