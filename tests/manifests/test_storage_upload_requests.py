"""What a verified upload costs in S3 requests per object (issue 16: one HEAD too many)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from catalog.objects.s3 import S3ObjectStore
from manifests.storage.inventory import InventoryEntry
from manifests.storage.upload import upload_entries
from tests.fixtures.s3 import S3RequestCounter

pytestmark = pytest.mark.s3

FILES = 4


def _entries(tmp_path: Path) -> list[InventoryEntry]:
    out = []
    for i in range(FILES):
        p = tmp_path / "data" / f"{i}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(os.urandom(1000 + i))
        out.append(InventoryEntry.of("latent", p, hashlib.sha256(p.read_bytes()).hexdigest()))
    return out


def _object_requests(counter: S3RequestCounter) -> dict[str, int]:
    """Requests on ``objects/`` keys (the once-per-store checksum probe left out)."""
    ops: dict[str, int] = {}
    for r in counter.requests:
        if "/objects/" in f"/{r.key}":
            ops[r.op] = ops.get(r.op, 0) + 1
    return ops


def test_unproven_endpoint_puts_then_reads_back_without_a_head(
    tmp_path: Path, s3_server: str, s3_bucket: str, s3_request_counter: S3RequestCounter
) -> None:
    store = S3ObjectStore(s3_bucket, "b", endpoint_url=s3_server)
    assert not store.checksums_proven  # moto stores whatever checksum it is sent
    s3_request_counter.reset()
    report = upload_entries(_entries(tmp_path), store, tmp_path / "r.jsonl", workers=2)
    assert report.ok and report.uploaded == FILES
    # The read-back is the proof here; a HEAD before it proved nothing more.
    assert _object_requests(s3_request_counter) == {"PutObject": FILES, "GetObject": FILES}


def test_proven_endpoint_needs_one_put_per_new_object(
    tmp_path: Path, s3_server: str, s3_bucket: str, s3_request_counter: S3RequestCounter
) -> None:
    store = S3ObjectStore(s3_bucket, "b", endpoint_url=s3_server)
    store._checksums_proven = True  # as AWS S3, which refuses a body with a wrong SHA-256
    entries = _entries(tmp_path)
    s3_request_counter.reset()
    report = upload_entries(entries, store, tmp_path / "r.jsonl", workers=2)
    assert report.ok and report.uploaded == FILES
    assert _object_requests(s3_request_counter) == {"PutObject": FILES}
    # Already there (a run killed before its receipts): the 412 is checked and verified.
    s3_request_counter.reset()
    again = upload_entries(entries, store, tmp_path / "r2.jsonl", workers=2)
    assert again.ok and again.existing == FILES
    ops = _object_requests(s3_request_counter)
    assert ops["PutObject"] == FILES and ops["HeadObject"] >= FILES
