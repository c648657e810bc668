"""Synthetic snapshots published through the real writers, for tests and benchmarks.

:func:`write_snapshot` stores small latent objects (standalone or packed) in an object
store, writes ``plan.arrow`` and ``index.arrow`` with :mod:`manifests.ipc` and
``manifest.parquet``, and publishes them with :meth:`manifests.registry.Registry.publish`
— the same code a cut uses — so the loader's tests and benchmarks need no catalog and
no materializer, and no second snapshot writer exists. :func:`write_big_snapshot`
publishes a large plan over a small index, streamed to disk.

Every latent of manifest row ``r`` holds tensors filled with ``float(r)`` (shape set by
its bucket), so a test can tell from a batch which rows it got. Text embeddings, when
asked for, hold ``r * 100 + variant``. Steps are bucket-pure; each bucket walks its own
seeded permutation of its rows, one epoch after another.

Reason this lives in the package rather than under ``tests/``: ``benchmarks/`` and the
loader's import-isolation check run it, and benchmarks do not import ``tests``. It
imports no pyiceberg, DuckDB or FastAPI (torch only for ``pt`` latents, lazily).

Why this module is a little over 500 lines: the small and the big snapshot share
the object layout and the publication; splitting them would copy that code.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray
from safetensors.numpy import save as st_save

from catalog.hashing import sha256_bytes
from catalog.objects import ObjectStore, open_store
from manifests.format import (
    FORMAT_VERSION,
    INDEX_NAME,
    INDEX_SCHEMA,
    MANIFEST_NAME,
    PLAN_NAME,
    PLAN_SCHEMA,
)
from manifests.ipc import ipc_writer, write_table
from manifests.registry import Registry, SnapshotRecord

__all__ = ["BUCKET_SHAPES", "SynthSnapshot", "write_big_snapshot", "write_snapshot"]

#: Latent shape per bucket (same within a bucket, different across buckets).
BUCKET_SHAPES = [(2, 3, 4), (3, 2, 2), (1, 4, 4)]


@dataclass
class SynthSnapshot:
    """What :func:`write_snapshot` published, for tests to check against."""

    store: ObjectStore
    version: int
    plan: list[NDArray[np.int64]]  # global rows per step (after skipping)
    skipped: list[int]
    buckets: list[int]  # bucket per step
    stream_epochs: list[list[int]]
    index: pa.Table
    snapshot: dict[str, Any]
    snapshot_sha256: str
    member_sha: dict[int, str] = field(default_factory=dict)  # row -> member sha256

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def plan_sha256(self) -> str:
        return str(self.snapshot["artifacts"][PLAN_NAME]["sha256"])


@dataclass
class _Latents:
    formats: list[str]
    object_sha: list[str]
    offsets: list[int]
    lengths: list[int]
    member_sha: dict[int, str]


@dataclass
class _Plan:
    rows: list[NDArray[np.int64]]
    skipped: list[int]
    buckets: list[int]
    stream_epochs: list[list[int]]


def _encode(fmt: str, tensors: dict[str, NDArray[np.float32]]) -> bytes:
    if fmt == "safetensors":
        return st_save(tensors)
    if fmt == "pt":
        import torch  # only here: plan tests and their child processes stay torch-free

        buf = io.BytesIO()
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, buf)
        return buf.getvalue()
    if fmt == "npy":
        (only,) = tensors.values()
        buf = io.BytesIO()
        np.save(buf, only, allow_pickle=False)
        return buf.getvalue()
    raise ValueError(f"unknown latent format {fmt!r}")


def _chunks(n: int, sizes: int | list[int]) -> list[tuple[int, int]]:
    """Split ``0..n`` into (start, stop) runs of the given size(s), the last one cycling."""
    out: list[tuple[int, int]] = []
    start, i = 0, 0
    seq = [sizes] if isinstance(sizes, int) else sizes
    while start < n:
        size = seq[min(i, len(seq) - 1)]
        out.append((start, min(n, start + size)))
        start += size
        i += 1
    return out


def _store_latents(
    store: ObjectStore,
    bucket_of: NDArray[np.int32],
    *,
    formats: tuple[str, ...],
    tensor_keys: tuple[str, ...],
    pack: int,
    latent_scale: int,
    latent_shape: tuple[int, ...] | None,
) -> _Latents:
    """Latent members, packed ``pack`` to an object (built group by group: bounded memory)."""
    out = _Latents([], [], [], [], {})
    num_rows = len(bucket_of)
    for start in range(0, num_rows, pack):
        group: list[bytes] = []
        for r in range(start, min(start + pack, num_rows)):
            fmt = formats[r % len(formats)]
            shape = list(latent_shape or BUCKET_SHAPES[bucket_of[r] % len(BUCKET_SHAPES)])
            shape[-1] *= latent_scale
            keys = tensor_keys[:1] if fmt == "npy" else tensor_keys
            tensors = {k: np.full(shape, r + i * 0.5, np.float32) for i, k in enumerate(keys)}
            group.append(_encode(fmt, tensors))
            out.formats.append(fmt)
            out.member_sha[r] = sha256_bytes(group[-1])
        sha = store.put_bytes(b"".join(group)).info.sha256
        pos = 0
        for m in group:
            out.object_sha.append(sha)
            out.offsets.append(pos)
            out.lengths.append(len(m))
            pos += len(m)
    return out


def _index_table(
    store: ObjectStore,
    latents: _Latents,
    bucket_of: NDArray[np.int32],
    stream_of: NDArray[np.int32],
    *,
    tensor_keys: tuple[str, ...],
    text_embeddings: bool,
    caption_variants: int,
) -> pa.Table:
    num_rows = len(bucket_of)
    rows = np.arange(num_rows, dtype=np.int64)
    captions = [[f"caption {r} v{v}" for v in range(1 + r % caption_variants)] for r in rows]
    embeds: list[list[str]] = []
    for r in range(num_rows):
        shas = []
        if text_embeddings:
            for v in range(len(captions[r])):
                data = st_save({"embedding": np.full(4, r * 100 + v, np.float32)})
                shas.append(store.put_bytes(data).info.sha256)
        embeds.append(shas)
    fmts = latents.formats
    return pa.table(
        {
            "row": rows,
            "clip_id": [f"clip-{r:06d}" for r in rows],
            "asset_id": [sha256_bytes(f"asset {r // 3}".encode()) for r in rows],
            "stream": stream_of,
            "bucket": bucket_of,
            "num_frames": pa.array([9 + 8 * int(b) for b in bucket_of], pa.int32()),
            "tokens": pa.array([128 * (1 + int(b)) for b in bucket_of], pa.int64()),
            "object_sha256": latents.object_sha,
            "offset": pa.array(latents.offsets, pa.int64()),
            "length": pa.array(latents.lengths, pa.int64()),
            "member_sha256": [latents.member_sha[r] for r in range(num_rows)],
            "format": fmts,
            "tensor_keys": [list(tensor_keys[:1] if f == "npy" else tensor_keys) for f in fmts],
            "captions": captions,
            "text_embedding_sha256": embeds,
        },
        schema=INDEX_SCHEMA,
    )


def _walk_plan(
    bucket_of: NDArray[np.int32],
    *,
    num_steps: int,
    batch_size: int,
    num_buckets: int,
    num_streams: int,
    skip: dict[int, int],
    seed: int,
) -> _Plan:
    """Each bucket walks seeded permutations of its rows, epoch after epoch."""
    rng = np.random.default_rng(seed)
    rows = np.arange(len(bucket_of), dtype=np.int64)
    cursors = {b: 0 for b in range(num_buckets)}
    epochs = {b: 0 for b in range(num_buckets)}
    perms = {b: rng.permutation(rows[bucket_of == b]) for b in range(num_buckets)}
    plan = _Plan([], [skip.get(s, 0) for s in range(num_steps)], [], [])
    for s in range(num_steps):
        b = s % num_buckets
        take: list[int] = []
        while len(take) < batch_size:
            if cursors[b] == len(perms[b]):
                perms[b] = rng.permutation(rows[bucket_of == b])
                cursors[b], epochs[b] = 0, epochs[b] + 1
            take.append(int(perms[b][cursors[b]]))
            cursors[b] += 1
        plan.rows.append(np.array(take[: batch_size - skip.get(s, 0)], dtype=np.int64))
        plan.buckets.append(b)
        plan.stream_epochs.append([epochs[b] + k for k in range(num_streams)])
    return plan


def _plan_batches(plan: _Plan, steps_per_batch: int | list[int]) -> list[pa.RecordBatch]:
    return [
        pa.record_batch(
            {
                "step": pa.array(range(a, z), pa.int64()),
                "phase": pa.array([0] * (z - a), pa.int32()),
                "bucket": pa.array(plan.buckets[a:z], pa.int32()),
                "stream_epochs": pa.array(plan.stream_epochs[a:z], pa.list_(pa.int32())),
                "rows": pa.array([p.tolist() for p in plan.rows[a:z]], pa.list_(pa.int64())),
                "skipped": pa.array(plan.skipped[a:z], pa.int32()),
            },
            schema=PLAN_SCHEMA,
        )
        for a, z in _chunks(len(plan.rows), steps_per_batch)
    ]


def _metadata(
    *, num_rows: int, num_steps: int, num_buckets: int, num_streams: int, plan_rows: int, seed: int
) -> dict[str, Any]:
    """The ``snapshot.json`` keys a cut would set (the registry adds the rest)."""
    return {
        "format": FORMAT_VERSION,
        "recipe": {"name": "synthetic", "seed": seed},
        "recipe_sha256": sha256_bytes(b"synthetic"),
        "catalog_snapshot_ids": {},
        "seed": seed,
        "code_version": "synth",
        "counts": {"rows": num_rows},
        "drops": {},
        "stream_shares": {},
        "bucket_histogram": {},
        "streams": [f"stream{k}" for k in range(num_streams)],
        "buckets": [
            {"id": b, "num_frames": 9 + 8 * b, "aspect": "16:9"} for b in range(num_buckets)
        ],
        "phases": [
            {"name": "p0", "rung": "256p", "first_step": 0, "num_steps": num_steps}
            | {"rank_multiple": 1}
        ],
        "num_steps": num_steps,
        "plan_rows": plan_rows,
    }


def _publish(
    store: ObjectStore, version: int, paths: dict[str, Path], meta: dict[str, Any]
) -> SnapshotRecord:
    """Publish as ``version``: its parent must be the latest version (or none)."""
    parent = version - 1 if version > 1 else None
    return Registry(store).publish(paths, meta, parent=parent)


@dataclass(frozen=True)
class _Options:
    num_rows: int = 96
    num_steps: int = 20
    batch_size: int = 8
    num_buckets: int = 2
    num_streams: int = 2
    formats: tuple[str, ...] = ("safetensors",)
    tensor_keys: tuple[str, ...] = ("latent",)
    pack: int = 1
    steps_per_batch: int | list[int] = 7
    index_rows_per_batch: int | list[int] = 40
    skip: dict[int, int] | None = None
    text_embeddings: bool = False
    caption_variants: int = 3
    latent_scale: int = 1
    latent_shape: tuple[int, ...] | None = None
    seed: int = 0


@dataclass
class _Built:
    paths: dict[str, Path]
    meta: dict[str, Any]
    plan: _Plan
    index: pa.Table
    member_sha: dict[int, str]


def _build(store: ObjectStore, work: Path, o: _Options) -> _Built:
    """Store the latents; write the artifacts into ``work``; return what to publish."""
    rows = np.arange(o.num_rows, dtype=np.int64)
    bucket_of = (rows % o.num_buckets).astype(np.int32)
    stream_of = ((rows // o.num_buckets) % o.num_streams).astype(np.int32)
    latents = _store_latents(
        store,
        bucket_of,
        formats=o.formats,
        tensor_keys=o.tensor_keys,
        pack=o.pack,
        latent_scale=o.latent_scale,
        latent_shape=o.latent_shape,
    )
    index = _index_table(
        store,
        latents,
        bucket_of,
        stream_of,
        tensor_keys=o.tensor_keys,
        text_embeddings=o.text_embeddings,
        caption_variants=o.caption_variants,
    )
    plan = _walk_plan(
        bucket_of,
        num_steps=o.num_steps,
        batch_size=o.batch_size,
        num_buckets=o.num_buckets,
        num_streams=o.num_streams,
        skip=o.skip or {},
        seed=o.seed,
    )
    meta = _metadata(
        num_rows=o.num_rows,
        num_steps=o.num_steps,
        num_buckets=o.num_buckets,
        num_streams=o.num_streams,
        plan_rows=int(sum(len(p) for p in plan.rows)),
        seed=o.seed,
    )
    paths = {name: work / name for name in (MANIFEST_NAME, PLAN_NAME, INDEX_NAME)}
    write_table(paths[PLAN_NAME], _plan_batches(plan, o.steps_per_batch), PLAN_SCHEMA)
    index_batches = (
        index.slice(a, z - a).combine_chunks().to_batches()[0]
        for a, z in _chunks(o.num_rows, o.index_rows_per_batch)
    )
    write_table(paths[INDEX_NAME], index_batches, INDEX_SCHEMA)
    pq.write_table(index, str(paths[MANIFEST_NAME]))
    return _Built(paths, meta, plan, index, latents.member_sha)


def _result(store: ObjectStore, built: _Built, record: SnapshotRecord) -> SynthSnapshot:
    return SynthSnapshot(
        store=store,
        version=record.version,
        plan=built.plan.rows,
        skipped=built.plan.skipped,
        buckets=built.plan.buckets,
        stream_epochs=built.plan.stream_epochs,
        index=built.index,
        snapshot=record.snapshot,
        snapshot_sha256=record.entry.snapshot_sha256,
        member_sha=built.member_sha,
    )


def write_snapshot(
    store: ObjectStore | str | Path,
    *,
    version: int = 1,
    num_rows: int = 96,
    num_steps: int = 20,
    batch_size: int = 8,
    num_buckets: int = 2,
    num_streams: int = 2,
    formats: tuple[str, ...] = ("safetensors",),
    tensor_keys: tuple[str, ...] = ("latent",),
    pack: int = 1,
    steps_per_batch: int | list[int] = 7,
    index_rows_per_batch: int | list[int] = 40,
    skip: dict[int, int] | None = None,
    text_embeddings: bool = False,
    caption_variants: int = 3,
    latent_scale: int = 1,
    latent_shape: tuple[int, ...] | None = None,
    seed: int = 0,
) -> SynthSnapshot:
    """Publish a synthetic snapshot as ``version`` into ``store`` (whose latest version
    must be ``version - 1``).

    Args:
        store: an object store or its URL.
        num_rows: manifest rows; row ``r`` is in bucket ``r % num_buckets`` and stream
            ``(r // num_buckets) % num_streams``.
        num_steps: global steps; step ``s`` is bucket ``s % num_buckets``.
        batch_size: global batch per step (before skipping).
        formats: latent formats, assigned to rows round-robin.
        tensor_keys: tensor names in each latent (``npy`` allows only one).
        pack: members per packed object (1: standalone objects).
        steps_per_batch: steps per plan record batch (a list makes uneven batches).
        index_rows_per_batch: rows per index record batch.
        skip: step -> rows a "patch" removed from the end of that step.
        text_embeddings: store one embedding object per caption variant.
        latent_scale: multiplies the latent shape's last dimension (bigger objects).
        latent_shape: one shape for every bucket (overrides the per-bucket shapes).
        seed: permutation seed.

    Raises:
        Conflict: ``version - 1`` is not the store's latest version.
    """
    store = store if isinstance(store, ObjectStore) else open_store(str(store))
    options = _Options(
        num_rows=num_rows,
        num_steps=num_steps,
        batch_size=batch_size,
        num_buckets=num_buckets,
        num_streams=num_streams,
        formats=formats,
        tensor_keys=tensor_keys,
        pack=pack,
        steps_per_batch=steps_per_batch,
        index_rows_per_batch=index_rows_per_batch,
        skip=skip,
        text_embeddings=text_embeddings,
        caption_variants=caption_variants,
        latent_scale=latent_scale,
        latent_shape=latent_shape,
        seed=seed,
    )
    with tempfile.TemporaryDirectory(prefix="vidlake-synth-") as tmp:
        built = _build(store, Path(tmp), options)
        return _result(store, built, _publish(store, version, built.paths, built.meta))


def _write_big_plan(
    path: Path, *, num_steps: int, batch_size: int, num_rows: int, steps_per_batch: int
) -> None:
    """A full-period affine scatter: row = (a*i + c) mod num_rows over global position i."""
    a = 2 * (num_rows // 3) + 1 if num_rows > 2 else 1
    while np.gcd(a, num_rows) != 1:
        a += 2
    with ipc_writer(path, PLAN_SCHEMA) as writer:
        for first in range(0, num_steps, steps_per_batch):
            n = min(steps_per_batch, num_steps - first)
            pos = np.arange(first * batch_size, (first + n) * batch_size, dtype=np.int64)
            rows = (a * pos + 7) % num_rows
            offsets = pa.array(np.arange(0, n * batch_size + 1, batch_size, dtype=np.int32))
            epochs = pa.ListArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32)),
                pa.array(((first + np.arange(n)) * batch_size // num_rows).astype(np.int32)),
            )
            writer.write_batch(
                pa.record_batch(
                    [
                        pa.array(np.arange(first, first + n, dtype=np.int64)),
                        pa.array(np.zeros(n, dtype=np.int32)),
                        pa.array(np.zeros(n, dtype=np.int32)),
                        epochs,
                        pa.ListArray.from_arrays(offsets, pa.array(rows)),
                        pa.array(np.zeros(n, dtype=np.int32)),
                    ],
                    schema=PLAN_SCHEMA,
                )
            )


def write_big_snapshot(
    store: ObjectStore | str | Path,
    *,
    version: int = 1,
    num_steps: int,
    batch_size: int,
    num_rows: int = 64,
    steps_per_batch: int = 1024,
    workdir: str | Path | None = None,
) -> tuple[SynthSnapshot, Path]:
    """Publish a snapshot with a large plan, written vectorised and streamed to disk.

    The plan's rows are a fixed scatter of ``num_rows`` manifest rows (many epochs over
    a small index); the index holds one standalone latent per row. Returns the
    snapshot and the local plan file (for baselines that read it another way), which
    stays in ``workdir`` (a fresh temp dir by default).
    """
    store = store if isinstance(store, ObjectStore) else open_store(str(store))
    work = Path(workdir or tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    options = _Options(num_rows=num_rows, num_steps=1, batch_size=1, num_buckets=1, num_streams=1)
    with tempfile.TemporaryDirectory(prefix="vidlake-synth-", dir=work) as tmp:
        built = _build(store, Path(tmp), options)
        plan_path = work / f"plan-v{version}.arrow"
        _write_big_plan(
            plan_path,
            num_steps=num_steps,
            batch_size=batch_size,
            num_rows=num_rows,
            steps_per_batch=steps_per_batch,
        )
        built.paths[PLAN_NAME] = plan_path
        built.meta.update(num_steps=num_steps, plan_rows=num_steps * batch_size)
        built.meta["phases"][0]["num_steps"] = num_steps
        record = _publish(store, version, built.paths, built.meta)
    built.plan = _Plan([], [], [], [])
    return _result(store, built, record), plan_path
