"""Synthetic snapshots for loader tests, written in the exact format of ``manifests.format``.

:func:`write_snapshot` publishes a small snapshot into any object store — latent
objects (standalone or packed), ``plan.arrow``, ``index.arrow``, ``manifest.parquet``,
``snapshot.json`` and the registry key — so loader tests need no materializer.

Every latent of manifest row ``r`` holds tensors filled with ``float(r)`` (shape set by
its bucket), so a test can tell from a batch which rows it got. Text embeddings, when
asked for, hold ``r * 100 + variant``. Steps are bucket-pure; each bucket walks its own
seeded permutation of its rows, one epoch after another.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray
from safetensors.numpy import save as st_save

from catalog.hashing import sha256_bytes
from catalog.objects import ObjectStore, open_store
from loader.source import SnapshotSource, StoreSource
from manifests.format import FORMAT_VERSION, INDEX_SCHEMA, PLAN_SCHEMA, registry_key

__all__ = [
    "CorruptingSource",
    "CountingSource",
    "SynthSnapshot",
    "serve_http",
    "write_big_snapshot",
    "write_snapshot",
]

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
        return str(self.snapshot["artifacts"]["plan.arrow"]["sha256"])


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
    raise ValueError(fmt)


def _ipc_bytes(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return bytes(sink.getvalue())


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
    """Publish a synthetic snapshot as ``version`` into ``store``.

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
    """
    store = store if isinstance(store, ObjectStore) else open_store(str(store))
    rng = np.random.default_rng(seed)
    rows = np.arange(num_rows, dtype=np.int64)
    bucket_of = (rows % num_buckets).astype(np.int32)
    stream_of = ((rows // num_buckets) % num_streams).astype(np.int32)

    # Latent members, packed `pack` to an object (built group by group: bounded memory).
    fmts: list[str] = []
    object_sha: list[str] = []
    offsets: list[int] = []
    lengths: list[int] = []
    member_sha: dict[int, str] = {}
    for start in range(0, num_rows, pack):
        group: list[bytes] = []
        for r in range(start, min(start + pack, num_rows)):
            fmt = formats[r % len(formats)]
            shape = list(latent_shape or BUCKET_SHAPES[bucket_of[r] % len(BUCKET_SHAPES)])
            shape[-1] *= latent_scale
            keys = tensor_keys[:1] if fmt == "npy" else tensor_keys
            tensors = {k: np.full(shape, r + i * 0.5, np.float32) for i, k in enumerate(keys)}
            group.append(_encode(fmt, tensors))
            fmts.append(fmt)
            member_sha[r] = sha256_bytes(group[-1])
        sha = store.put_bytes(b"".join(group)).info.sha256
        pos = 0
        for m in group:
            object_sha.append(sha)
            offsets.append(pos)
            lengths.append(len(m))
            pos += len(m)

    captions = [[f"caption {r} v{v}" for v in range(1 + r % caption_variants)] for r in rows]
    embeds: list[list[str]] = []
    for r in range(num_rows):
        shas = []
        if text_embeddings:
            for v in range(len(captions[r])):
                data = st_save({"embedding": np.full(4, r * 100 + v, np.float32)})
                shas.append(store.put_bytes(data).info.sha256)
        embeds.append(shas)

    index = pa.table(
        {
            "row": rows,
            "clip_id": [f"clip-{r:06d}" for r in rows],
            "asset_id": [sha256_bytes(f"asset {r // 3}".encode()) for r in rows],
            "stream": stream_of,
            "bucket": bucket_of,
            "num_frames": pa.array([9 + 8 * int(b) for b in bucket_of], pa.int32()),
            "tokens": pa.array([128 * (1 + int(b)) for b in bucket_of], pa.int64()),
            "object_sha256": object_sha,
            "offset": pa.array(offsets, pa.int64()),
            "length": pa.array(lengths, pa.int64()),
            "member_sha256": [member_sha[r] for r in range(num_rows)],
            "format": fmts,
            "tensor_keys": [list(tensor_keys[:1] if f == "npy" else tensor_keys) for f in fmts],
            "captions": captions,
            "text_embedding_sha256": embeds,
        },
        schema=INDEX_SCHEMA,
    )

    # The plan: each bucket walks seeded permutations of its rows, epoch after epoch.
    skip = skip or {}
    cursors = {b: 0 for b in range(num_buckets)}
    epochs = {b: 0 for b in range(num_buckets)}
    perms = {b: rng.permutation(rows[bucket_of == b]) for b in range(num_buckets)}
    plan: list[NDArray[np.int64]] = []
    stream_epochs: list[list[int]] = []
    for s in range(num_steps):
        b = s % num_buckets
        take: list[int] = []
        while len(take) < batch_size:
            if cursors[b] == len(perms[b]):
                perms[b] = rng.permutation(rows[bucket_of == b])
                cursors[b], epochs[b] = 0, epochs[b] + 1
            take.append(int(perms[b][cursors[b]]))
            cursors[b] += 1
        kept = np.array(take[: batch_size - skip.get(s, 0)], dtype=np.int64)
        plan.append(kept)
        stream_epochs.append([epochs[b] + k for k in range(num_streams)])
    buckets = [s % num_buckets for s in range(num_steps)]
    skipped = [skip.get(s, 0) for s in range(num_steps)]
    plan_batches = [
        pa.record_batch(
            {
                "step": pa.array(range(a, z), pa.int64()),
                "phase": pa.array([0] * (z - a), pa.int32()),
                "bucket": pa.array(buckets[a:z], pa.int32()),
                "stream_epochs": pa.array(stream_epochs[a:z], pa.list_(pa.int32())),
                "rows": pa.array([p.tolist() for p in plan[a:z]], pa.list_(pa.int64())),
                "skipped": pa.array(skipped[a:z], pa.int32()),
            },
            schema=PLAN_SCHEMA,
        )
        for a, z in _chunks(num_steps, steps_per_batch)
    ]
    plan_bytes = _ipc_bytes(PLAN_SCHEMA, plan_batches)
    index_batches = [
        index.slice(a, z - a).combine_chunks().to_batches()[0]
        for a, z in _chunks(num_rows, index_rows_per_batch)
    ]
    index_bytes = _ipc_bytes(INDEX_SCHEMA, index_batches)
    with tempfile.TemporaryFile() as tmp:
        pq.write_table(index, tmp)
        tmp.seek(0)
        manifest_bytes = tmp.read()

    artifacts = {}
    for name, data in (
        ("manifest.parquet", manifest_bytes),
        ("plan.arrow", plan_bytes),
        ("index.arrow", index_bytes),
    ):
        artifacts[name] = {"sha256": store.put_bytes(data).info.sha256, "size": len(data)}
    snapshot = {
        "format": FORMAT_VERSION,
        "version": version,
        "parent": version - 1 if version > 1 else None,
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
        "plan_rows": int(sum(len(p) for p in plan)),
        "artifacts": artifacts,
    }
    doc = json.dumps(snapshot, sort_keys=True).encode()
    snap_sha = store.put_bytes(doc).info.sha256
    entry = {
        "version": version,
        "parent": snapshot["parent"],
        "snapshot_sha256": snap_sha,
        "snapshot_size": len(doc),
        "recipe_sha256": snapshot["recipe_sha256"],
        "patch_of": None,
        "created_at": "2025-01-01T00:00:00Z",
    }
    store.put_key(registry_key(version), json.dumps(entry, sort_keys=True).encode())
    return SynthSnapshot(
        store=store,
        version=version,
        plan=plan,
        skipped=skipped,
        buckets=buckets,
        stream_epochs=stream_epochs,
        index=index,
        snapshot=snapshot,
        snapshot_sha256=snap_sha,
        member_sha=member_sha,
    )


class CountingSource(StoreSource):
    """A store source that appends one line per artifact download to ``log_path``.

    Importable by spawned processes, so several of them can share the count.
    """

    def __init__(self, url: str, log_path: str) -> None:
        super().__init__(open_store(url))
        self.log_path = log_path

    def download_artifact(self, version: int, name: str, sha256: str, dest: Path) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{name}\n")
        super().download_artifact(version, name, sha256, dest)


class CorruptingSource(StoreSource):
    """A store source that flips one byte of every object, artifact or range it serves.

    With ``artifacts=False`` the plan and index come through intact, so the snapshot
    opens and only latents are corrupt.
    """

    def __init__(self, inner: SnapshotSource | ObjectStore, *, artifacts: bool = True) -> None:
        store = inner.store if isinstance(inner, StoreSource) else inner
        assert isinstance(store, ObjectStore)
        super().__init__(store)
        self.artifacts = artifacts

    def download_artifact(self, version: int, name: str, sha256: str, dest: Path) -> None:
        if self.artifacts:
            self.fetch_object(sha256, dest)
        else:
            StoreSource.fetch_object(self, sha256, dest)

    def read_range(self, sha256: str, offset: int, length: int) -> bytes:
        data = bytearray(super().read_range(sha256, offset, length))
        data[len(data) // 2] ^= 0xFF
        return bytes(data)

    def fetch_object(self, sha256: str, dest: Path) -> None:
        super().fetch_object(sha256, dest)
        data = bytearray(Path(dest).read_bytes())
        data[len(data) // 2] ^= 0xFF
        Path(dest).write_bytes(bytes(data))


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
    snapshot and the local plan file (for baselines that read it another way).
    """
    store = store if isinstance(store, ObjectStore) else open_store(str(store))
    small = write_snapshot(
        store,
        version=version + 1_000_000,
        num_rows=num_rows,
        num_steps=1,
        batch_size=1,
        num_buckets=1,
        num_streams=1,
    )
    work = Path(workdir or tempfile.mkdtemp())
    plan_path = work / f"plan-v{version}.arrow"
    # A full-period affine scatter: row = (a*i + c) mod num_rows over the global position i.
    a = 2 * (num_rows // 3) + 1 if num_rows > 2 else 1
    while np.gcd(a, num_rows) != 1:
        a += 2
    with pa.OSFile(str(plan_path), "wb") as sink, pa.ipc.new_file(sink, PLAN_SCHEMA) as writer:
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
    plan_put = store.put_file(plan_path)
    index_sha = small.snapshot["artifacts"]["index.arrow"]
    snapshot = dict(small.snapshot)
    snapshot.update(
        version=version,
        parent=None,
        num_steps=num_steps,
        plan_rows=num_steps * batch_size,
        streams=["stream0"],
        artifacts={
            "manifest.parquet": small.snapshot["artifacts"]["manifest.parquet"],
            "plan.arrow": {"sha256": plan_put.info.sha256, "size": plan_put.info.size},
            "index.arrow": index_sha,
        },
    )
    doc = json.dumps(snapshot, sort_keys=True).encode()
    snap_sha = store.put_bytes(doc).info.sha256
    entry = {
        "version": version,
        "parent": None,
        "snapshot_sha256": snap_sha,
        "snapshot_size": len(doc),
        "recipe_sha256": snapshot["recipe_sha256"],
        "patch_of": None,
        "created_at": "2025-01-01T00:00:00Z",
    }
    store.put_key(registry_key(version), json.dumps(entry, sort_keys=True).encode())
    small.version, small.snapshot, small.snapshot_sha256 = version, snapshot, snap_sha
    small.plan, small.skipped, small.buckets, small.stream_epochs = [], [], [], []
    return small, plan_path


class _Handler(BaseHTTPRequestHandler):
    """The loader-facing endpoints of the vidlake service, served from a store."""

    store: ObjectStore
    corrupt_header = False
    requests: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        self.requests.append(f"{self.command} {self.path} {self.headers.get('Range', '')}")
        parts = self.path.strip("/").split("/")
        try:
            if parts[:2] == ["v1", "objects"] and len(parts) == 3:
                data, sha = self.store.get(parts[2]), parts[2]
            elif parts[:2] == ["v1", "snapshots"] and len(parts) in (3, 5):
                entry = json.loads(self.store.get_key(registry_key(int(parts[2]))))
                doc = self.store.get(entry["snapshot_sha256"])
                if len(parts) == 3:
                    data, sha = doc, entry["snapshot_sha256"]
                else:
                    sha = json.loads(doc)["artifacts"][parts[4]]["sha256"]
                    data = self.store.get(sha)
            else:
                raise KeyError(self.path)
        except Exception:
            self.send_error(404)
            return
        status, body = 200, data
        rng = self.headers.get("Range")
        if rng:
            start_s, end_s = rng.removeprefix("bytes=").split("-")
            start, end = int(start_s), min(int(end_s), len(data) - 1)
            status, body = 206, data[start : end + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Vidlake-SHA256", "0" * 64 if self.corrupt_header else sha)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(body)


@contextlib.contextmanager
def serve_http(
    store: ObjectStore, *, corrupt_header: bool = False
) -> Iterator[tuple[str, list[str]]]:
    """Serve ``store`` on a loopback port the way the vidlake service does for loaders.

    Yields ``(base_url, requests)``; ``requests`` logs every request line.
    """
    requests: list[str] = []
    handler = type(
        "Handler",
        (_Handler,),
        {"store": store, "corrupt_header": corrupt_header, "requests": requests},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
