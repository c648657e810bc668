"""Helper for the crash test: upload an inventory (run as a subprocess, then SIGKILLed)."""

from __future__ import annotations

import json
import sys

from catalog.objects.s3 import S3ObjectStore
from manifests.storage.inventory import read_inventory
from manifests.storage.upload import upload_entries


def main() -> None:
    inventory, receipts, bucket, prefix, endpoint, workers = sys.argv[1:7]
    store = S3ObjectStore(bucket, prefix, endpoint_url=endpoint)
    report = upload_entries(
        read_inventory(inventory).entries, store, receipts, workers=int(workers)
    )
    print(json.dumps(report.to_dict()))


if __name__ == "__main__":
    main()
