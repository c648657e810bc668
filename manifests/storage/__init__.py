"""Storage operations: inventory, verified upload, seal, restore, cleanup gate, watch.

See ``docs/operations.md``. Everything here works against any S3-compatible endpoint
through :class:`catalog.objects.s3.S3ObjectStore`.
"""

from __future__ import annotations

from manifests.storage.cleanup import cleanup_check
from manifests.storage.inventory import Inventory, InventoryEntry, build_inventory, read_inventory
from manifests.storage.receipts import Receipt, ReceiptLog, read_receipts
from manifests.storage.restore import check_restore, restore
from manifests.storage.seal import seal
from manifests.storage.upload import UploadReport, upload_entries
from manifests.storage.watch import Watcher, WatchStatus

__all__ = [
    "Inventory",
    "InventoryEntry",
    "Receipt",
    "ReceiptLog",
    "UploadReport",
    "WatchStatus",
    "Watcher",
    "build_inventory",
    "check_restore",
    "cleanup_check",
    "read_inventory",
    "read_receipts",
    "restore",
    "seal",
    "upload_entries",
]
