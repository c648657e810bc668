"""Benchmark: verified ``vidlake storage upload`` against plain boto3 ``upload_file``.

Starts a moto S3 server on 127.0.0.1 (fake credentials, nothing leaves the machine),
writes ``--files`` random files of ``--size-kb`` KiB, and uploads them twice with the
same ``--workers``:

* ``plain``: ``boto3`` ``upload_file`` per file in a thread pool (no conditional
  write, no hashing, no verification, no receipts);
* ``vidlake``: :func:`manifests.storage.upload.upload_entries` — identity checks, a
  conditional PUT with a SHA-256 checksum, verification and an fsync'd receipt per
  file. moto stores checksums without checking them, so verification here is a full
  read-back (one GET per object, no HEAD): the floor of a verified upload to such an
  endpoint is about one PUT plus one GET, i.e. ``ratio`` ~0.5-0.6 with a Python server
  on the same cores;
* ``vidlake_proven``: the same into fresh keys with the store told that the endpoint
  checks client checksums (as AWS S3 does; moto cannot prove it): one PUT per new
  object and no read-back, so ``ratio_proven`` is what the upload costs there.

Prints one JSON line: files, bytes, workers, plain_mb_s, vidlake_mb_s, ratio
(vidlake / plain), vidlake_proven_mb_s, ratio_proven (goal >= 0.8 on an endpoint that
checks checksums).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--size-kb", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(_ENV)
    os.environ.pop("AWS_PROFILE", None)

    import logging

    import boto3
    from boto3.s3.transfer import TransferConfig
    from moto.server import ThreadedMotoServer

    from catalog.objects.s3 import S3ObjectStore
    from manifests.storage.inventory import InventoryEntry
    from manifests.storage.upload import upload_entries

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        client = boto3.session.Session().client("s3", endpoint_url=endpoint)
        for bucket in ("plain", "vidlake"):
            client.create_bucket(Bucket=bucket)
        with tempfile.TemporaryDirectory(prefix="vidlake-bench-upload-") as tmp:
            paths = []
            for i in range(args.files):
                p = Path(tmp) / "data" / f"{i:06d}.bin"
                p.parent.mkdir(exist_ok=True)
                p.write_bytes(os.urandom(args.size_kb * 1024))
                paths.append(p)
            total = sum(p.stat().st_size for p in paths)
            # Same single-PUT path on both sides: no multipart below the store's threshold.
            config = TransferConfig(multipart_threshold=64 << 20, use_threads=False)

            entries = [
                InventoryEntry.of("latent", p, hashlib.sha256(p.read_bytes()).hexdigest())
                for p in paths
            ]
            # Alternate the two, each round into fresh keys, and keep each one's best
            # time, so neither profits from going second (warm server, page cache).
            plain_s = ours_s = proven_s = float("inf")
            for round_ in range(args.rounds):

                def plain(p: Path, r: int = round_) -> None:
                    client.upload_file(str(p), "plain", f"r{r}/{p.name}", Config=config)

                t0 = time.perf_counter()
                with ThreadPoolExecutor(args.workers) as pool:
                    list(pool.map(plain, paths))
                plain_s = min(plain_s, time.perf_counter() - t0)

                store = S3ObjectStore("vidlake", f"r{round_}", endpoint_url=endpoint)
                receipts = Path(tmp) / "receipts" / f"r{round_}.jsonl"
                t0 = time.perf_counter()
                report = upload_entries(entries, store, receipts, workers=args.workers)
                ours_s = min(ours_s, time.perf_counter() - t0)
                if not report.ok:
                    raise SystemExit(f"upload failed: {report.failed[:3]}")

                store = S3ObjectStore("vidlake", f"p{round_}", endpoint_url=endpoint)
                store._checksums_proven = True  # what AWS S3 proves; moto cannot
                receipts = Path(tmp) / "receipts" / f"p{round_}.jsonl"
                t0 = time.perf_counter()
                report = upload_entries(entries, store, receipts, workers=args.workers)
                proven_s = min(proven_s, time.perf_counter() - t0)
                if not report.ok:
                    raise SystemExit(f"upload failed: {report.failed[:3]}")
    finally:
        server.stop()
    mb = total / 1e6
    print(
        json.dumps(
            {
                "benchmark": "upload",
                "files": args.files,
                "bytes": total,
                "workers": args.workers,
                "rounds": args.rounds,
                "plain_mb_s": round(mb / plain_s, 2),
                "vidlake_mb_s": round(mb / ours_s, 2),
                "ratio": round(plain_s / ours_s, 3),
                "vidlake_proven_mb_s": round(mb / proven_s, 2),
                "ratio_proven": round(plain_s / proven_s, 3),
                "loadavg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
