"""A table's metadata JSON, its snapshots encoded once per process, not once per commit.

pyiceberg writes a commit's metadata file with ``TableMetadata.model_dump_json``, which
encodes every snapshot the table holds, each through a Python-level serializer (its
summary's): linear in the snapshot count, on every commit. A table fed by 10k-clip
batches holds hundreds of snapshots until expiry (160 at 16M clips in
``benchmarks/ingest_scale.py``: 0.86 ms a commit, 0.16 ms spliced; decision 058).

:func:`encode` returns the same bytes: the metadata encoded without its snapshots, and
the snapshot list spliced in from fragments, each the snapshot's own
``model_dump_json`` (what the whole-model encoding writes for it: tested), kept per
table and snapshot id. A snapshot never changes once committed, so a fragment stays
true; the cache holds only the snapshots of each table's latest metadata (what that
metadata holds in memory already). Format v1 tables (whose snapshots are encoded
without their sequence number) and pyiceberg's ``legacy-current-snapshot-id`` setting
take pyiceberg's own path.
"""

from __future__ import annotations

import threading

from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor, ToOutputFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.config import Config

__all__ = ["encode", "write"]

#: The empty snapshot list in the encoding without snapshots, replaced by the list.
_EMPTY = '"snapshots":[]'
#: Per table uuid: snapshot id -> its encoded snapshot.
_FRAGMENTS: dict[str, dict[int, str]] = {}
_LOCK = threading.Lock()
#: Tables whose fragments are kept (the oldest entry goes first: a process commits to
#: a few tables; a test session creates thousands).
_TABLES = 64


def encode(metadata: TableMetadata) -> bytes | None:
    """``metadata``'s JSON as pyiceberg writes it (uncompressed); None where pyiceberg's
    own path must write it (format v1, the legacy snapshot id setting)."""
    if metadata.format_version == 1 or Config().get_bool("legacy-current-snapshot-id"):
        return None
    head = metadata.model_copy(update={"snapshots": []}).model_dump_json()
    if head.count(_EMPTY) != 1:  # cannot happen (no other key is named so): be safe
        return None
    table = str(metadata.table_uuid)
    with _LOCK:
        known = _FRAGMENTS.get(table, {})
    fresh = {
        s.snapshot_id: known.get(s.snapshot_id) or s.model_dump_json() for s in metadata.snapshots
    }
    with _LOCK:
        _FRAGMENTS.pop(table, None)
        _FRAGMENTS[table] = fresh
        while len(_FRAGMENTS) > _TABLES:
            del _FRAGMENTS[next(iter(_FRAGMENTS))]
    listed = ",".join(fresh[s.snapshot_id] for s in metadata.snapshots)
    return head.replace(_EMPTY, f'"snapshots":[{listed}]').encode()


def write(metadata: TableMetadata, io: FileIO, location: str) -> None:
    """Write ``metadata`` to a new file at ``location``, as
    ``ToOutputFile.table_metadata`` does (compressed by the location's suffix)."""
    data = encode(metadata)
    if data is None:
        ToOutputFile.table_metadata(metadata, io.new_output(location))
        return
    data = Compressor.get_compressor(location).bytes_compressor()(data)
    with io.new_output(location).create(overwrite=False) as out:
        out.write(data)
