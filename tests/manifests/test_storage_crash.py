"""SIGKILL ``upload`` at random moments, rerun, and check nothing is lost, wrong or doubled."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from catalog.objects.s3 import S3ObjectStore
from manifests.storage.inventory import Inventory, InventoryEntry
from manifests.storage.receipts import read_receipts
from tests.fixtures.s3 import S3RequestCounter

pytestmark = [pytest.mark.s3, pytest.mark.slow]

HELPER = Path(__file__).with_name("_storage_uploader.py")
ROOT = Path(__file__).resolve().parents[2]


def test_sigkilled_uploads_resume_without_double_puts(
    s3_server: str, s3_bucket: str, s3_request_counter: S3RequestCounter, tmp_path: Path
) -> None:
    rng = random.Random(6)
    files = []
    # Enough files that 22 short runs cannot finish the set even on an idle machine.
    for i in range(1500):
        p = tmp_path / "data" / f"{i:04d}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randrange(1, 20_000)))
        files.append(p)
    entries = tuple(
        InventoryEntry.of("latent", p, hashlib.sha256(p.read_bytes()).hexdigest()) for p in files
    )
    inventory = Inventory({"vidlake_inventory": 1}, entries).write(tmp_path / "inv.jsonl")
    receipts = tmp_path / "receipts" / "crash.jsonl"
    store = S3ObjectStore(s3_bucket, "p", endpoint_url=s3_server)
    argv = [
        sys.executable,
        str(HELPER),
        str(inventory),
        str(receipts),
        s3_bucket,
        "p",
        s3_server,
        "2",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Each kill lands after a random short delay; receipts only grow, so the objects
    # verified before a kill must never be PUT again afterwards.
    verified_before: set[str] = set()
    kills = 0
    while kills < 22:
        verified_before |= {r.key for r in read_receipts(receipts).values()}
        mark = len(s3_request_counter.requests)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.6))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        elif proc.wait() == 0:
            break  # finished between kills: the rest of the checks still apply
        proc.wait()
        later = s3_request_counter.requests[mark:]
        doubled = {r.key for r in later if r.op in ("PutObject", "CompleteMultipartUpload")}
        assert not doubled & verified_before, "a verified object was uploaded again"
    assert kills >= 20, f"only {kills} kills landed before the upload finished"
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["ok"]
    got = read_receipts(receipts)
    assert len(got) == len(entries)
    for e in entries:
        r = got[e.path]
        assert r.sha256 == e.sha256 and r.size == e.size
        assert store.get(e.sha256) == Path(e.path).read_bytes()  # verified, not corrupt
    # One complete run more sends no request at all.
    mark = len(s3_request_counter.requests)
    subprocess.run(argv, env=env, capture_output=True, check=True)
    assert len(s3_request_counter.requests) == mark
