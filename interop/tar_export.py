"""Write a snapshot as TAR shards with a manifest: ``vidlake export tar-shards``.

Teams that consume WebDataset-style shards can train on a vidlake cut unchanged:

* **Bucket-pure shards in plan order.** Samples are written in the order the plan
  first serves them (the write-time scatter is the plan's order, so it is kept), one
  open shard per bucket; a shard closes when it holds ``samples_per_shard`` samples.
  Manifest rows no step serves follow in manifest order.
* Each sample is ``<sample_id>.<format>`` (the latent's bytes, verified against their
  member SHA-256 before they are written) and ``<sample_id>.json`` (the sidecar: every
  field an import needs to recreate the same clip ids, captions and scores, so that
  export → import → cut the same recipe gives the same sample sequence).
* ``manifest.json`` and ``manifests/v000001.json``: the format
  :mod:`interop.tar_manifest` defines (size and SHA-256 per shard and per member),
  written after every shard.

Writes never overwrite: local files are written to a temp name, fsync'd and linked
into place (failing if the name exists); S3 objects use ``If-None-Match: *``. TAR
headers are deterministic (mtime 0, uid/gid 0, mode 0644), so exporting a snapshot
twice gives byte-identical shards.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow.compute as pc
import pyarrow.parquet as pq

from catalog.errors import ChecksumMismatch, Conflict, InvalidInput
from catalog.hashing import sha256_bytes, sha256_file
from catalog.objects.refs import RefStore
from catalog.objects.s3_client import S3Connection, guarded, shared_client, split_s3_url

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from manifests.registry import Registry

__all__ = ["ExportReport", "export_tar_shards"]

Progress = Callable[[str, float], None]
_SUFFIX = {"pt": ".pt", "safetensors": ".safetensors", "npy": ".npy"}


@dataclass
class ExportReport:
    """What an export wrote."""

    out: str
    snapshot: int
    revision: str
    shards: int
    samples: int
    bytes: int
    manifest_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _plan_order(registry: Registry, version: int, num_rows: int) -> list[int]:
    """Manifest rows in the order the plan first serves them, then the unserved ones
    (the plan is read by the loader's reader, as a training rank would)."""
    from loader.plan import open_plan
    from loader.source import StoreSource

    seen = bytearray(num_rows)
    order: list[int] = []
    with (
        tempfile.TemporaryDirectory(prefix="vidlake-export-plan-") as cache,
        open_plan(StoreSource(registry.store), version, cache) as plan,
    ):
        for step in range(plan.num_steps):
            for r in plan.global_rows(step).tolist():
                if not seen[r]:
                    seen[r] = 1
                    order.append(r)
    order.extend(r for r in range(num_rows) if not seen[r])
    return order


class _Sink:
    """Create-only files under a local directory or an ``s3://`` prefix."""

    def __init__(self, out: str, s3_connection: S3Connection) -> None:
        self.out = out.rstrip("/")
        self.s3 = out.startswith("s3://")
        self.s3_connection = s3_connection
        if not self.s3:
            Path(self.out).mkdir(parents=True, exist_ok=True)

    def put_file(self, name: str, path: Path) -> None:
        if self.s3:
            url = f"{self.out}/{name}"
            bucket, key = split_s3_url(url)
            client = shared_client(self.s3_connection)
            with open(path, "rb") as f:
                try:
                    guarded(
                        "put",
                        url,
                        lambda: client.put_object(Bucket=bucket, Key=key, Body=f, IfNoneMatch="*"),
                        key=name,
                    )
                except Conflict:  # a 412 (or a concurrent write): the name is taken
                    raise Conflict(f"{url} already exists", key=name) from None
            return
        dest = Path(self.out) / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)  # atomic, and fails when the name exists
        except FileExistsError:
            raise Conflict(
                f"{dest} already exists; export into an empty place", path=str(dest)
            ) from None

    def put_bytes(self, name: str, data: bytes) -> None:
        with _temp_file(Path(tempfile.gettempdir()) if self.s3 else Path(self.out)) as (tmp, f):
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            f.close()
            self.put_file(name, tmp)


@contextlib.contextmanager
def _temp_file(where: Path) -> Iterator[tuple[Path, BinaryIO]]:
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".vidlake-export-{uuid.uuid4().hex}.tmp"
    f = open(tmp, "xb")  # noqa: SIM115 - closed below
    try:
        yield tmp, f
    finally:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    info.uname = info.gname = ""
    return info


class _Shard:
    """One TAR being written to a temp file, and the manifest entry it becomes."""

    def __init__(self, where: Path, path: str, bucket: str) -> None:
        self.ctx = _temp_file(where)
        self.tmp, self.f = self.ctx.__enter__()
        self.tar = tarfile.open(  # noqa: SIM115 - closed in close()
            fileobj=self.f, mode="w", format=tarfile.USTAR_FORMAT
        )
        self.path, self.bucket = path, bucket
        self.sample_ids: list[str] = []
        self.members: dict[str, dict[str, Any]] = {}

    def add(self, name: str, data: bytes) -> None:
        self.tar.addfile(_info(name, len(data)), io.BytesIO(data))
        self.members[name] = {"size": len(data), "sha256": sha256_bytes(data)}

    def discard(self) -> None:
        """Drop the temp file of a shard that will not be published."""
        with contextlib.suppress(Exception):
            self.tar.close()
        self.ctx.__exit__(None, None, None)

    def close(self, sink: _Sink) -> dict[str, Any]:
        try:
            self.tar.close()
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            sha, size = sha256_file(self.tmp)
            sink.put_file(self.path, self.tmp)
        finally:
            self.ctx.__exit__(None, None, None)
        return {
            "path": self.path,
            "size": size,
            "sha256": sha,
            "split": "train",
            "bucket": self.bucket,
            "sample_ids": self.sample_ids,
            "members": self.members,
        }


def _sidecar(rec: dict[str, Any], clip: dict[str, Any], snap: dict[str, Any]) -> dict[str, Any]:
    recipe = snap["recipe"]
    kinds = list(recipe["captions"]["kinds"])
    versions = json.loads(rec.get("score_versions") or "{}")
    scores = {
        name: {"version": str(v), "score": rec[f"score_{name}"]}
        for name, v in versions.items()
        if rec.get(f"score_{name}") is not None
    }
    texts = rec.get("captions") or []
    side: dict[str, Any] = {
        "sample_id": None,
        "clip_id": rec["clip_id"],
        "asset_id": rec["asset_id"],
        "t_start_s": rec["t_start_s"],
        "t_end_s": rec["t_end_s"],
        "split_version": clip["split_version"],
        "fps": rec.get("fps"),
        "num_frames": rec["num_frames"],
        "width": rec["width"],
        "height": rec["height"],
        "rung": rec["rung"],
        "tokenizer_version": recipe["tokenizer_version"],
        "format": rec["format"],
        "tensor_keys": list(rec["tensor_keys"]),
        "latent_frames": rec["latent_frames"],
        "tokens": rec["tokens"],
        "sha256": rec["member_sha256"],
        "source": rec.get("source"),
        "source_tier": rec.get("source_tier"),
        "license_id": rec.get("license_id"),
        "territory": rec.get("territory"),
        "caption_version": rec.get("caption_version") or recipe["captions"]["version"],
        "captions": dict(zip(kinds, texts, strict=False)),
        "scores": scores,
        "stream": rec.get("stream_name"),
        "bucket": rec.get("bucket_key"),
        "tier": rec.get("tier"),
        "snapshot_row": rec["row"],
    }
    return side


def export_tar_shards(
    catalog: VidlakeCatalog,
    registry: Registry,
    version: int,
    out: str | Path,
    *,
    samples_per_shard: int = 64,
    progress: Progress | None = None,
) -> ExportReport:
    """Write snapshot ``version`` as TAR shards and a manifest under ``out``.

    Args:
        catalog: The catalog the snapshot was cut from (clip rows at its pin).
        registry: Where the snapshot is published.
        version: The snapshot version.
        out: A local directory or ``s3://bucket/prefix``; nothing there is overwritten.
        samples_per_shard: Samples per TAR.
        progress: Called with ``(stage, fraction)``: ``read``, ``write``.

    Raises:
        ChecksumMismatch: a latent's bytes do not match their member SHA-256.
        Conflict: a file of the export already exists at ``out``.
    """
    if samples_per_shard < 1:
        raise InvalidInput("samples_per_shard must be >= 1", field="samples_per_shard")
    from catalog.pins import Pin

    report = progress or (lambda stage, fraction: None)
    record = registry.get(version)
    snap = dict(record.snapshot)
    report("read", 0.0)
    with registry.local_artifact(version, "manifest.parquet") as mpath:
        manifest = pq.read_table(mpath)
    order = _plan_order(registry, version, manifest.num_rows)
    pin = Pin.from_dict(snap["catalog_snapshot_ids"])
    clips = catalog.scan("clips", pin, ["clip_id", "split_version"])
    clips = clips.filter(pc.is_in(clips["clip_id"], value_set=pc.unique(manifest["clip_id"])))
    clip_of = {r["clip_id"]: r for r in clips.to_pylist()}
    report("read", 1.0)

    sink = _Sink(str(out), catalog.objects.s3_connection)
    staging = Path(tempfile.gettempdir()) if sink.s3 else Path(sink.out)
    store = RefStore(catalog.objects)
    open_shards: dict[str, _Shard] = {}
    entries: list[dict[str, Any]] = []
    counter = 0
    total = 0
    try:
        records = manifest.to_pylist()
        for k, row in enumerate(order):
            rec = records[row]
            bucket = str(rec.get("bucket_key") or rec["bucket"])
            shard = open_shards.get(bucket)
            if shard is None:
                shard = open_shards[bucket] = _Shard(staging, f"shard-{counter:06d}.tar", bucket)
                counter += 1
            data = store.get_range(rec["object_sha256"], rec["offset"], rec["length"])
            if sha256_bytes(data) != rec["member_sha256"]:
                raise ChecksumMismatch(
                    f"latent of {rec['clip_id']} does not match its member SHA-256",
                    sha256=rec["member_sha256"],
                    clip_id=rec["clip_id"],
                )
            sid = f"{rec['clip_id']}-{rec['rung']}"
            side = _sidecar(rec, clip_of[rec["clip_id"]], snap)
            side["sample_id"] = sid
            shard.add(sid + _SUFFIX[rec["format"]], data)
            shard.add(sid + ".json", json.dumps(side, sort_keys=True, default=str).encode())
            shard.sample_ids.append(sid)
            total += len(data)
            if len(shard.sample_ids) >= samples_per_shard:
                entries.append(open_shards.pop(bucket).close(sink))
            report("write", (k + 1) / max(1, len(order)))
        for bucket in list(open_shards):
            entries.append(open_shards.pop(bucket).close(sink))
    except BaseException:
        for shard in open_shards.values():
            shard.discard()
        raise
    entries.sort(key=lambda e: e["path"])
    doc = {
        "format": "vidlake-tar-shards/1",
        "revision": "v000001",
        "parent": None,
        "vidlake_snapshot": version,
        "shards": entries,
        "exclude_sample_ids": [],
    }
    body = json.dumps(doc, sort_keys=True, indent=1).encode()
    sink.put_bytes("manifests/v000001.json", body)
    sink.put_bytes("manifest.json", body)
    return ExportReport(
        str(out), version, "v000001", len(entries), len(order), total, sha256_bytes(body)
    )
