"""Child process of the crash test: upload a deterministic set of objects, then exit 0.

``python _crash_uploader.py STORE_URL COUNT SCRATCH_DIR [ENDPOINT_URL]``

Object ``i`` has ``object_size(i)`` bytes of ``object_bytes(i)``; every third one goes
through ``put_file`` (via a scratch file), the rest through ``put_bytes``. After each
put, the named key ``done/{i:05d}`` records the object's SHA-256 (create-only: on a
rerun an existing record must agree). The process prints ``ready`` once its imports and
client are up, so the parent's kill lands among the uploads, and is killed with
SIGKILL at random moments; a rerun skips what is recorded and completes the set.

It prints ``start I SIZE`` before and ``done I`` after each object, so that the parent
can aim its kills (and bound each run's progress whatever the machine's speed).
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

# Run as a script: make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.errors import Conflict
from catalog.objects import open_store
from catalog.objects.s3 import S3ObjectStore

MiB = 1024 * 1024


def object_size(i: int, multipart: bool) -> int:
    """Sizes spread log-uniformly over 100 B..256 KiB; with ``multipart`` every 15th
    object is above the 5 MiB multipart threshold."""
    if multipart and i % 15 == 7:
        return 5 * MiB + 1000 + i
    return int(100 * 2 ** random.Random(i).uniform(0, 11.3))


def object_bytes(i: int, size: int) -> bytes:
    out = bytearray()
    block = 0
    while len(out) < size:
        out += hashlib.sha256(f"crash:{i}:{block}".encode()).digest() * 64
        block += 1
    return bytes(out[:size])


def main(url: str, count: int, scratch: Path, endpoint: str | None) -> None:
    multipart = url.startswith("s3://")
    if multipart:
        store = S3ObjectStore.from_url(
            url, endpoint_url=endpoint, multipart_threshold=5 * MiB, part_size=5 * MiB
        )
        _ = store.client  # create the client before saying ready
    else:
        store = open_store(url)  # type: ignore[assignment]  # a LocalObjectStore
    scratch.mkdir(parents=True, exist_ok=True)
    recorded = set(store.list_keys("done/"))
    print("ready", flush=True)
    for i in range(count):
        if f"done/{i:05d}" in recorded:
            continue
        data = object_bytes(i, object_size(i, multipart))
        print("start", i, len(data), flush=True)
        if i % 3 == 0:
            # Rewritten every run: a killed run may have left it half written.
            src = scratch / f"{i}.bin"
            src.write_bytes(data)
            result = store.put_file(src)
        else:
            result = store.put_bytes(data)
        sha = result.info.sha256
        try:
            store.put_key(f"done/{i:05d}", sha.encode())
        except Conflict:
            if store.get_key(f"done/{i:05d}") != sha.encode():
                raise SystemExit(f"done/{i:05d} records another object") from None
        print("done", i, flush=True)


if __name__ == "__main__":
    main(
        sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None
    )
