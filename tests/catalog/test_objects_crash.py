"""Crash test: a child uploading many objects is killed with SIGKILL at random moments.

After every kill, everything visible is whole: each object hashes to its key, each
``done/`` record names a stored object, and no stray file or key sits among the
objects. A final uninterrupted run completes the set. Runs on the local store and on
the S3 server (where kills also land inside multipart uploads).
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from catalog.objects.base import ObjectStore
from catalog.objects.local import LocalObjectStore
from catalog.objects.s3 import S3ObjectStore
from tests.catalog._crash_uploader import object_bytes, object_size
from tests.fixtures.s3 import s3_client

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("_crash_uploader.py")
KILLS = 20
#: A run is killed by the time it has started this many objects (or earlier), so the
#: set (larger than kills * this) cannot finish before the last kill on any machine.
MAX_STARTS_PER_RUN = 12
MiB = 1024 * 1024


def _start(url: str, count: int, scratch: Path, endpoint: str | None) -> subprocess.Popen[str]:
    args = [sys.executable, str(CHILD), url, str(count), str(scratch)]
    return subprocess.Popen(
        [*args, *([endpoint] if endpoint else [])],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


def _wait_ready(proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the uploader did not start"
    assert proc.stdout.readline().strip() == "ready"


def _check_consistent(
    store: ObjectStore, count: int, multipart: bool, verified: set[str] | None = None
) -> int:
    """Assert that everything visible is whole; return how many records exist.

    ``verified``: objects an earlier check hashed whole, which are not downloaded
    again (stored objects are immutable; the final check passes none and hashes all).
    """
    stored = {info.sha256: info.size for info in store.iter_objects()}
    for sha256, size in stored.items():
        if verified is not None and sha256 in verified:
            continue
        assert store.verify(sha256).size == size  # hashes to its key
        if verified is not None:
            verified.add(sha256)
    records = store.list_keys("done/")
    for key in records:
        sha256 = store.get_key(key).decode()
        assert sha256 == _expected_sha(int(key.rpartition("/")[2]), multipart)
        assert sha256 in stored, f"{key} names a missing object"
    assert len(records) <= count
    return len(records)


@functools.cache
def _expected_sha(i: int, multipart: bool) -> str:
    return hashlib.sha256(object_bytes(i, object_size(i, multipart))).hexdigest()


def _raw_object_keys(store: ObjectStore) -> list[str]:
    """Every file or key in the objects area, as the backend lists it."""
    if isinstance(store, LocalObjectStore):
        return [p.name for p in (store.root / "objects").rglob("*") if p.is_file()]
    assert isinstance(store, S3ObjectStore)
    pages = s3_client(store.client.meta.endpoint_url).get_paginator("list_objects_v2")
    prefix = f"{store.prefix}/objects/"
    return [
        item["Key"].rpartition("/")[2]
        for page in pages.paginate(Bucket=store.bucket, Prefix=prefix)
        for item in page.get("Contents", [])
    ]


def _kill_at_random(proc: subprocess.Popen[str], rng: random.Random, multipart: bool) -> None:
    """SIGKILL the child at a random moment: after a random number of started objects
    (so each run's progress is bounded), a random delay into the next one. With
    ``multipart``, every third kill aims at a multipart upload."""
    assert proc.stdout is not None
    target_multipart = multipart and rng.random() < 1 / 3
    starts = rng.randint(1, MAX_STARTS_PER_RUN)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        line = proc.stdout.readline() if ready else ""
        if ready and not line:
            break  # the child finished (or died) on its own
        if not line.startswith("start"):
            continue
        starts -= 1
        if target_multipart and int(line.split()[2]) >= 5 * MiB:
            time.sleep(rng.uniform(0.005, 0.08))
            break
        if starts <= 0 and not target_multipart:
            time.sleep(rng.uniform(0.0, 0.01))
            break
    proc.kill()
    proc.communicate(timeout=30)


def _crash_loop(
    store: ObjectStore, count: int, scratch: Path, endpoint: str | None, kills: int = KILLS
) -> None:
    assert kills * MAX_STARTS_PER_RUN < count  # the set cannot finish before the last kill
    seed = int(time.time())
    rng = random.Random(seed)
    multipart = isinstance(store, S3ObjectStore)
    mid_run = 0
    progress = [0]
    verified: set[str] = set()
    for _ in range(kills):
        proc = _start(store.url, count, scratch, endpoint)
        _wait_ready(proc)
        _kill_at_random(proc, rng, multipart)
        mid_run += proc.returncode == -signal.SIGKILL
        progress.append(_check_consistent(store, count, multipart, verified))
        names = _raw_object_keys(store)
        assert sorted(names) == sorted(i.sha256 for i in store.iter_objects()), "stray object"
    print(f"seed {seed}: records after each kill {progress}", file=sys.stderr)
    assert mid_run == kills, f"only {mid_run} kills landed mid-run (seed {seed})"
    assert progress[-1] < count, f"the set finished before the last kill (seed {seed})"

    # A rerun completes the set.
    proc = _start(store.url, count, scratch, endpoint)
    _wait_ready(proc)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert _check_consistent(store, count, multipart) == count
    expected = {_expected_sha(i, multipart) for i in range(count)}
    assert {info.sha256 for info in store.iter_objects()} == expected


def test_local_uploads_survive_sigkill(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    _crash_loop(store, count=300, scratch=tmp_path / "scratch", endpoint=None)
    # Killed writers leave temp files only in .tmp/, which clean_tmp clears.
    store.clean_tmp(older_than_s=0)
    assert list((store.root / ".tmp").iterdir()) == []


@pytest.mark.s3
def test_s3_uploads_survive_sigkill(s3_server: str, s3_bucket: str, tmp_path: Path) -> None:
    store = S3ObjectStore(s3_bucket, "crash", endpoint_url=s3_server)
    # Fewer kills and objects than on the local store: moto takes ~1 s per 5 MiB
    # multipart object, and 10 of these 150 are multipart.
    _crash_loop(store, count=150, scratch=tmp_path / "scratch", endpoint=s3_server, kills=12)
    # Kills inside multipart uploads leave unfinished uploads behind, never objects.
    uploads = s3_client(s3_server).list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    print(f"{len(uploads)} unfinished multipart uploads", file=sys.stderr)
