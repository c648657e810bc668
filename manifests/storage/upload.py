"""Verified, resumable upload of an inventory to a content-addressed S3 store.

For each entry, in a worker pool:

1. its identity (size, mtime_ns, inode) must equal the inventory's; a receipt for that
   identity in this store means done (no request at all);
2. a file without a known SHA-256 (catalog files) is hashed, then its identity checked
   again; for a content-addressed file the put itself hashes what it sends and refuses
   bytes that do not match the expected address;
3. :meth:`S3ObjectStore.put_file` writes ``P/objects/ab/abcd…`` conditionally
   (``If-None-Match: *``, re-hashing the bytes it sends); an object already there
   (a run killed before its receipt) answers 412 and is checked, never replaced;
4. its identity is checked a third time and the object verified by content
   (:meth:`S3ObjectStore.verify`: a full read and hash, or the endpoint's full-object
   SHA-256 only where the endpoint has proven it checks checksums itself). Where it
   has, a single PUT it accepted needs no second request: the endpoint refused any
   body whose SHA-256 was not the one sent, so one PUT per new object is the whole
   upload (a multipart upload or an object found already there is still verified);
5. a receipt is appended and fsync'd.

A changed file or any error leaves that entry without a receipt and in the report's
``failed`` list; the rest carry on. A rerun skips receipted entries, so a run killed
at any moment is completed by the next one without a second PUT of a verified object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from catalog.errors import ChecksumMismatch, InvalidInput, VidlakeError
from catalog.hashing import sha256_file
from catalog.objects.s3 import S3ObjectStore
from manifests.storage.inventory import InventoryEntry, stat_identity
from manifests.storage.receipts import Receipt, ReceiptLog, read_receipts

__all__ = ["UploadReport", "upload_entries", "upload_file"]

#: ``progress(bytes_done, files_done)`` after each entry.
Progress = Callable[[int, int], None]


@dataclass
class UploadReport:
    """What one run did: files put, found already stored, receipted before, failed."""

    uploaded: int = 0
    existing: int = 0
    skipped: int = 0
    bytes_uploaded: int = 0
    bytes_total: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "uploaded": self.uploaded,
            "existing": self.existing,
            "skipped": self.skipped,
            "bytes_uploaded": self.bytes_uploaded,
            "bytes_total": self.bytes_total,
            "failed": self.failed,
        }


def upload_file(
    entry: InventoryEntry, store: S3ObjectStore, log: ReceiptLog
) -> tuple[str, Receipt]:
    """Upload one entry with the identity checks; return (``put``|``existing``, receipt).

    Raises:
        ChecksumMismatch: the file is not the one listed or changed during the upload
            (``exc.changed``), its bytes are not the expected SHA-256, or the stored
            object is bad.
        StorageError: the endpoint failed.
    """
    path = entry.path

    def check(when: str) -> None:
        now = stat_identity(path)
        if now != entry.identity:
            raise ChecksumMismatch(
                f"{path} changed {when} (size, mtime_ns, inode {entry.identity} -> {now})",
                path=path,
                changed=True,
            )

    check("since it was inventoried")
    if entry.sha256 is None:
        sha, size = sha256_file(path)
        check("while it was hashed")
        if size != entry.size:
            raise ChecksumMismatch(f"{path} changed while it was hashed", path=path, changed=True)
    else:
        # The address is known: put_file hashes exactly the bytes it sends and refuses
        # any that do not match it, so a separate hashing pass would only read twice.
        sha, size = entry.sha256, entry.size
    # No HEAD first: the PUT is conditional, so an object a killed run already stored
    # answers 412 and is checked, never replaced; large files HEAD inside put_file.
    put = store.put_file(path, sha256=sha)
    outcome = "put" if put.created else "existing"
    check("while it was uploaded")
    # A single PUT that an endpoint proven to check client checksums accepted is its
    # own proof of content (it hashed the body against ours); anything else is verified.
    proven = put.created and size <= store.multipart_threshold and store.checksums_proven
    info = put.info if proven else store.verify(sha)
    if info.size != size:
        raise ChecksumMismatch(
            f"stored object {sha} has {info.size} bytes, {path} has {size}",
            sha256=sha,
            path=path,
        )
    receipt = Receipt(
        path=path,
        sha256=sha,
        size=size,
        mtime_ns=entry.mtime_ns,
        inode=entry.inode,
        store=store.url,
        key=store.key_of(sha),
        verified_at=datetime.now(UTC).isoformat(),
        kind=entry.kind,
        name=entry.name,
    )
    log.append(receipt)
    return outcome, receipt


def upload_entries(
    entries: Sequence[InventoryEntry],
    store: S3ObjectStore,
    receipts: str | Path,
    *,
    workers: int = 8,
    progress: Progress | None = None,
) -> UploadReport:
    """Upload every entry not yet receipted (see the module docstring); never raises for
    a single file's failure: it lands in ``report.failed``."""
    if workers < 1:
        raise InvalidInput("workers must be at least 1", field="workers")
    done = read_receipts(receipts)
    log = ReceiptLog(receipts)
    report = UploadReport(bytes_total=sum(e.size for e in entries))
    lock = threading.Lock()
    counters = [0, 0]
    todo: list[InventoryEntry] = []
    for entry in entries:
        r = done.get(entry.path)
        if (
            r is not None
            and r.store == store.url
            and r.identity == entry.identity
            and (entry.sha256 is None or r.sha256 == entry.sha256)
            and _same_identity(entry)
        ):
            report.skipped += 1
            counters[0] += entry.size
            counters[1] += 1
        else:
            todo.append(entry)
    if progress is not None:
        progress(counters[0], counters[1])

    def one(entry: InventoryEntry) -> None:
        try:
            outcome, _ = upload_file(entry, store, log)
        except (VidlakeError, OSError) as exc:
            with lock:
                report.failed.append({"path": entry.path, "kind": entry.kind, "error": str(exc)})
        else:
            with lock:
                if outcome == "put":
                    report.uploaded += 1
                    report.bytes_uploaded += entry.size
                else:
                    report.existing += 1
        with lock:
            counters[0] += entry.size
            counters[1] += 1
            if progress is not None:
                progress(counters[0], counters[1])

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vidlake-upload") as pool:
        list(pool.map(one, todo))
    report.failed.sort(key=lambda f: f["path"])
    return report


def _same_identity(entry: InventoryEntry) -> bool:
    try:
        return stat_identity(entry.path) == entry.identity
    except OSError:
        return False
