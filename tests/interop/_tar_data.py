"""Small TAR-shard datasets for the interop tests, and a loopback HTTP server with Range.

:func:`make_dataset` writes, under a directory:

* ``train-00000{0,1}.tar`` (train) and ``val-000000.tar`` (val): ordered
  ``<id>.pt`` (``torch.save`` of a (16, T, h, w) bfloat16 latent) + ``<id>.json`` pairs;
* ``manifests/v000001.json`` (the two train shards), ``manifests/v000002.json`` and
  ``manifest.json`` (all three, plus ``exclude_sample_ids``);
* ``stray-000099.tar``: a valid TAR no manifest lists;
* optionally one corrupted ``.pt`` member in ``train-000000.tar``: its bytes changed
  after the manifest (shard and member SHA-256) was computed, as bit rot would.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

RUNG = "128p"
TOKENIZER = "tok-v1"


@dataclass
class Dataset:
    root: Path
    train_ids: list[str] = field(default_factory=list)
    val_ids: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    v1_ids: list[str] = field(default_factory=list)
    corrupt_id: str | None = None
    corrupt_sha256: str | None = None
    member_sha: dict[str, str] = field(default_factory=dict)
    shard_sha: dict[str, str] = field(default_factory=dict)
    pt_ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    stray = "stray-000099.tar"


def _pt(seed: int, frames: int, hw: tuple[int, int]) -> bytes:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn((16, frames, *hw), generator=g).to(torch.bfloat16)
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_dataset(
    root: Path,
    *,
    per_shard: int = 4,
    corrupt: bool = True,
    hw: tuple[int, int] = (4, 4),
    frames: tuple[int, ...] = (4, 8),
) -> Dataset:
    """Write the dataset described in the module docstring under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    ds = Dataset(root)
    entries: dict[str, dict[str, Any]] = {}
    n = 0
    for shard, split in (
        ("train-000000", "train"),
        ("train-000001", "train"),
        ("val-000000", "val"),
    ):
        members: list[tuple[str, bytes]] = []
        ids = []
        for _ in range(per_shard):
            sid = f"s{n:04d}"
            t = frames[n % len(frames)]
            data = _pt(n, t, hw)
            side = {
                "width": 64,
                "height": 64,
                "fps": 24.0,
                "num_frames": t * 4,
                "shape": [16, t, *hw],
                "dtype": "bfloat16",
                "caption": f"sample {n} caption",
                "source_tier": "licensed",
                "rung": RUNG,
                "tokenizer_version": TOKENIZER,
                "aesthetic": n / 10,
            }
            members += [(f"{sid}.pt", data), (f"{sid}.json", json.dumps(side).encode())]
            ds.member_sha[sid] = hashlib.sha256(data).hexdigest()
            ids.append(sid)
            n += 1
        raw = bytearray(_tar(members))
        path = f"{shard}.tar"
        sha = hashlib.sha256(raw).hexdigest()
        ds.shard_sha[path] = sha
        ranges = []
        with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tar:
            for info in tar.getmembers():
                if info.name.endswith(".pt"):
                    ranges.append((info.offset_data, info.size))
        ds.pt_ranges[path] = ranges
        if corrupt and shard == "train-000000":
            # Bit rot after publication: the manifest keeps the original hashes.
            off, size = ranges[1]
            raw[off + size // 2] ^= 0xFF
            ds.corrupt_id = ids[1]
            ds.corrupt_sha256 = ds.member_sha[ids[1]]
        (root / path).write_bytes(bytes(raw))
        entries[shard] = {
            "path": path,
            "size": len(raw),
            "sha256": sha,
            "split": split,
            "sample_ids": ids,
            "members": {f"{sid}.pt": {"sha256": ds.member_sha[sid]} for sid in ids},
        }
        (ds.val_ids if split == "val" else ds.train_ids).extend(ids)
    ds.v1_ids = [*entries["train-000000"]["sample_ids"], *entries["train-000001"]["sample_ids"]]
    # v2 excludes one sample that v1 published (the last of train-000001).
    ds.excluded = [entries["train-000001"]["sample_ids"][-1]]
    v1 = {
        "revision": "v000001",
        "parent": None,
        "shards": [entries["train-000000"], entries["train-000001"]],
    }
    v2 = {
        "revision": "v000002",
        "parent": "v000001",
        "shards": list(entries.values()),
        "exclude_sample_ids": ds.excluded,
    }
    (root / "manifests").mkdir(exist_ok=True)
    (root / "manifests" / "v000001.json").write_text(json.dumps(v1))
    (root / "manifests" / "v000002.json").write_text(json.dumps(v2))
    (root / "manifest.json").write_text(json.dumps(v2))
    (root / ds.stray).write_bytes(_tar([("x0000.pt", _pt(999, 4, hw)), ("x0000.json", b"{}")]))
    return ds


# -- a loopback static file server with Range ------------------------------------------------
@dataclass
class Served:
    url: str
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, range
    bytes_sent: int = 0


def _handler(root: Path, served: Served, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self, body: bool) -> None:
            rng = self.headers.get("Range")
            with lock:
                served.requests.append((self.command, self.path, rng))
            path = root / self.path.lstrip("/")
            if not path.is_file() or ".." in self.path:
                self.send_error(404)
                return
            size = path.stat().st_size
            start, end = 0, size - 1
            if rng and rng.startswith("bytes="):
                a, _, b = rng.removeprefix("bytes=").partition("-")
                start, end = int(a), min(int(b) if b else size - 1, size - 1)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            if body:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read(end - start + 1)
                with lock:
                    served.bytes_sent += len(data)
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve(True)

        def do_HEAD(self) -> None:
            self._serve(False)

    return Handler


@contextlib.contextmanager
def http_server(root: Path) -> Iterator[Served]:
    """Serve ``root`` on 127.0.0.1 (a free port) with Range support; count requests."""
    served = Served("")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(root, served, threading.Lock()))
    served.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def upload(root: Path, client: Any, bucket: str, prefix: str) -> None:
    """Copy the dataset files to ``s3://bucket/prefix/``."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.put_object(
                Bucket=bucket,
                Key=f"{prefix}/{path.relative_to(root).as_posix()}",
                Body=path.read_bytes(),
            )
