"""One maintain run in a child process, for the kill -9 loop of
``test_maintenance_crash.py``: prints ``ready`` once the catalog is open (the parent
starts its kill timer then) and ``done`` when maintenance finished.

argv: the catalog config JSON path, then ``table=snapshot_id`` pairs to keep.
"""

from __future__ import annotations

import sys
from pathlib import Path

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.maintenance import MaintainOptions, maintain


def main() -> None:
    config = CatalogConfig.model_validate_json(Path(sys.argv[1]).read_text())
    keep: dict[str, set[int]] = {}
    for pair in sys.argv[2:]:
        table, sid = pair.split("=")
        keep.setdefault(table, set()).add(int(sid))
    catalog = VidlakeCatalog.open(config)
    print("ready", flush=True)
    maintain(catalog, keep, MaintainOptions(retention_s=0, orphan_age_s=0))
    print("done", flush=True)


if __name__ == "__main__":
    main()
