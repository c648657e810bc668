"""Cached, verified reads of published snapshots for the service.

:class:`SnapshotReader` caches version records (re-checking erasure marks every
``ERASURE_RECHECK_S``), keeps local verified copies of artifacts
(:class:`manifests.artifacts.ArtifactCache`), memory-maps IPC artifacts
(:mod:`manifests.ipc`), derives a random-access summary of ``manifest.parquet``, and
builds the hive-partitioned datasets behind the SQL views over every version. The
lineage views (:mod:`service.lineage`) and the SQL layer read snapshots through it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from numpy.typing import NDArray

from catalog.atomic import atomic_path
from catalog.errors import ChecksumMismatch, NotFound
from manifests.artifacts import ArtifactCache
from manifests.format import LINEAGE_NAME
from manifests.ipc import read_table, write_table
from manifests.registry import Registry, SnapshotRecord

__all__ = ["ERASURE_RECHECK_S", "SnapshotReader"]

log = logging.getLogger("vidlake.service.snapshot_reader")

#: How long a cached record is trusted before its erasure marks are listed again.
ERASURE_RECHECK_S = 5.0
_SUMMARY_COLUMNS = frozenset({"row", "tier", "source", "source_tier", "license_id"})


class SnapshotReader:
    """Cached, verified reads of published snapshots.

    Records are cached forever (versions are immutable). Artifacts are downloaded
    once into ``cache_dir/objects/<sha>`` (:class:`manifests.artifacts.ArtifactCache`:
    verified before they take their name, re-hashed once per process before first
    use), and memory-mapped.
    """

    def __init__(self, registry: Registry, cache_dir: str | Path) -> None:
        self.registry = registry
        self.cache_dir = Path(cache_dir)
        self._lock = threading.Lock()
        self._records: dict[int, SnapshotRecord] = {}
        self._checked: dict[int, float] = {}
        self._snapshot_bytes: dict[int, bytes] = {}
        self._objects = ArtifactCache(self.cache_dir / "objects", rehash=True)
        self._tables: dict[str, pa.Table] = {}
        self._views: dict[tuple[str, tuple[int, ...]], ds.Dataset] = {}
        self._clip_indexes: dict[str, _ClipIndex] = {}

    # -- records ------------------------------------------------------------------
    def versions(self) -> list[int]:
        return self.registry.versions()

    def record(self, version: int) -> SnapshotRecord:
        """A version's verified record (NotFound when absent).

        Versions are immutable but an erasure can mark one (``manifests.erasure``): a
        cached record is re-checked against the version's erasure marks (one listing)
        at most every ``ERASURE_RECHECK_S`` seconds, and reloaded when one was added.
        """
        now = time.monotonic()
        with self._lock:
            hit = self._records.get(version)
            fresh = now - self._checked.get(version, 0.0) < ERASURE_RECHECK_S
        if hit is not None and (fresh or self.registry.erasure_count(version) == len(hit.erasures)):
            with self._lock:
                self._checked[version] = now
            return hit
        record = self.registry.get(version)
        with self._lock:
            self._records[version] = record
            self._checked[version] = now
        return record

    def forget(self, shas: Sequence[str]) -> None:
        """Drop every cached record and the local copies of objects ``shas`` (artifacts
        an erasure replaced: they hold erased rows and must not outlive it here)."""
        with self._lock:
            self._records.clear()
            self._checked.clear()
            self._views.clear()
            for sha in shas:
                self._tables.pop(sha, None)
                self._clip_indexes.pop(sha, None)
                self._tables.pop(f"summary:{sha}", None)
        for sha in shas:
            self._objects.forget(sha)
            (self.cache_dir / "derived" / f"{sha}.summary.arrow").unlink(missing_ok=True)

    def snapshot_bytes(self, version: int) -> bytes:
        """The version's ``snapshot.json`` exactly as stored (verified by the registry)."""
        with self._lock:
            hit = self._snapshot_bytes.get(version)
        if hit is not None:
            return hit
        data = self.registry.read_artifact(version, "snapshot.json")
        with self._lock:
            self._snapshot_bytes[version] = data
        return data

    # -- artifacts ----------------------------------------------------------------
    def local(self, version: int, name: str) -> Path:
        """A verified local copy of artifact ``name`` of ``version``."""
        refs = self.record(version).artifacts
        if name not in refs:
            raise NotFound(
                f"version {version} has no artifact {name!r}", version=version, name=name
            )
        ref = refs[name]
        store = self.registry.store

        def fetch(tmp: Path) -> tuple[str, int]:
            info = store.download(ref.sha256, tmp)  # hashes while it writes
            return info.sha256, info.size

        return self._objects.get(ref.sha256, ref.size, fetch, what=f"{name} of version {version}")

    def ipc_table(self, version: int, name: str) -> pa.Table:
        """An Arrow IPC file artifact as a memory-mapped table (zero-copy)."""
        ref = self.record(version).artifacts.get(name)
        if ref is None:
            raise NotFound(
                f"version {version} has no artifact {name!r}", version=version, name=name
            )
        with self._lock:
            hit = self._tables.get(ref.sha256)
        if hit is not None:
            return hit
        table = read_table(self.local(version, name), what=name)
        with self._lock:
            self._tables[ref.sha256] = table
        return table

    def manifest_summary(self, version: int) -> pa.Table:
        """The manifest columns a step summary needs (``row``, tier, source, source
        tier, license, numeric ``score_*``), memory-mapped from an Arrow file derived
        once per manifest: Parquet has no cheap random access, a step's rows are
        scattered across it."""
        ref = self.record(version).artifacts["manifest.parquet"]
        key = f"summary:{ref.sha256}"
        with self._lock:
            hit = self._tables.get(key)
        if hit is not None:
            return hit
        path = self.cache_dir / "derived" / f"{ref.sha256}.summary.arrow"
        if not path.is_file():
            source = pq.ParquetFile(str(self.local(version, "manifest.parquet")))
            schema = source.schema_arrow
            names = [f.name for f in schema if _summary_column(f)]
            path.parent.mkdir(parents=True, exist_ok=True)
            batches = source.iter_batches(columns=names, batch_size=1 << 16)
            write_table(path, batches, pa.schema([schema.field(n) for n in names]))
        table = read_table(path, what=f"summary of manifest {ref.sha256}")
        with self._lock:
            self._tables[key] = table
        return table

    # -- plan and index -----------------------------------------------------------
    def plan_step(self, version: int, step: int) -> dict[str, Any]:
        """One record of ``plan.arrow`` as a dict (NotFound past the last step)."""
        plan = self.ipc_table(version, "plan.arrow")
        if step < 0 or step >= plan.num_rows:
            raise NotFound(
                f"version {version} has steps 0..{plan.num_rows - 1}, not {step}",
                version=version,
                step=step,
            )
        record = plan.slice(step, 1).to_pylist()[0]
        if record["step"] != step:  # steps are stored in order; anything else is corrupt
            raise ChecksumMismatch(
                f"plan.arrow of version {version} is out of order", version=version
            )
        return dict(record)

    def clip_rows(self, version: int, clip_id: str) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        """Manifest rows (and their stream ids) of ``clip_id`` in ``version``: a binary
        search of the version's cached clip index (:class:`_ClipIndex`), not a scan."""
        index = self.ipc_table(version, "index.arrow")
        hits = self._clip_index(version).rows(index.column("clip_id"), clip_id)
        if not len(hits):
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        taken = index.select(["row", "stream"]).take(hits)
        return (
            taken.column("row").to_numpy().astype(np.int64),
            taken.column("stream").to_numpy().astype(np.int32),
        )

    def _clip_index(self, version: int) -> _ClipIndex:
        ref = self.record(version).artifacts["index.arrow"]
        with self._lock:
            hit = self._clip_indexes.get(ref.sha256)
        if hit is not None:
            return hit
        made = _ClipIndex(self.ipc_table(version, "index.arrow").column("clip_id"))
        with self._lock:
            self._clip_indexes[ref.sha256] = made
        return made

    def steps_of_rows(self, version: int, rows: Sequence[int]) -> dict[int, list[int]]:
        """Every step of ``version`` whose batch holds each of ``rows``."""
        if not len(rows):
            return {}
        if LINEAGE_NAME in self.record(version).artifacts:
            # The cut's inverted index: one record per manifest row, its steps sorted.
            lineage = self.ipc_table(version, LINEAGE_NAME)
            picked = lineage.take(pa.array(np.asarray(rows, dtype=np.int64)))
            return {
                int(r): [int(s) for s in steps]
                for r, steps in zip(
                    picked.column("row").to_pylist(),
                    picked.column("steps").to_pylist(),
                    strict=True,
                )
            }
        # No inverted index (a patch, or an older cut): scan the plan, vectorised.
        plan = self.ipc_table(version, "plan.arrow")
        wanted = pa.array(np.asarray(rows, dtype=np.int64))
        out: dict[int, list[int]] = {int(r): [] for r in rows}
        for chunk_rows, chunk_steps in zip(
            plan.column("rows").chunks, plan.column("step").chunks, strict=True
        ):
            values = chunk_rows.values
            offsets = chunk_rows.offsets.to_numpy()
            base = int(offsets[0])
            window = values.slice(base, int(offsets[-1]) - base)
            where = np.flatnonzero(
                pc.is_in(window, value_set=wanted).to_numpy(zero_copy_only=False)
            )
            if not len(where):
                continue
            owners = np.searchsorted(offsets, where + base, side="right") - 1
            steps = chunk_steps.to_numpy()[owners]
            hit_rows = window.to_numpy()[where]
            for r, s in zip(hit_rows.tolist(), steps.tolist(), strict=True):
                out[int(r)].append(int(s))
        return {r: sorted(set(s)) for r, s in out.items()}

    # -- SQL views over every version ---------------------------------------------
    def version_dataset(self, name: str, fmt: str, versions: Sequence[int]) -> ds.Dataset:
        """A dataset over artifact ``name`` of ``versions`` with a ``version`` column
        (hive layout of hard links to the verified copies)."""
        key = (name, tuple(versions))
        with self._lock:
            hit = self._views.get(key)
        if hit is not None:
            return hit
        root = self.cache_dir / "views" / name.replace(".", "_")
        paths = []
        for v in versions:
            link = root / f"version={v}" / name
            target = self.local(v, name)
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                # Atomic; a racing writer links the same bytes.
                with atomic_path(link) as tmp:
                    os.link(target, tmp)
            paths.append(str(link))
        partitioning = ds.partitioning(pa.schema([("version", pa.int64())]), flavor="hive")
        if not paths:
            return ds.dataset(pa.table({"version": pa.array([], pa.int64())}))
        schemas = [ds.dataset(p, format=fmt).schema for p in paths]
        schema = pa.unify_schemas([*schemas, pa.schema([("version", pa.int64())])])
        made = ds.dataset(
            paths,
            format=fmt,
            schema=schema,
            partitioning=partitioning,
            partition_base_dir=str(root),
        )
        with self._lock:
            self._views[key] = made
        return made

    def snapshots_table(self) -> pa.Table:
        """One row per published version (the ``snapshots`` SQL view)."""
        rows = []
        for v in self.versions():
            rec = self.record(v)
            snap = rec.snapshot
            recipe = snap.get("recipe") if isinstance(snap.get("recipe"), Mapping) else {}
            rows.append(
                {
                    "version": v,
                    "parent": rec.parent,
                    "patch_of": rec.patch_of,
                    "created_at": rec.entry.created_at,
                    "name": recipe.get("name") if isinstance(recipe, Mapping) else None,
                    "recipe_sha256": rec.entry.recipe_sha256,
                    "seed": snap.get("seed"),
                    "code_version": str(snap.get("code_version")),
                    "num_steps": snap.get("num_steps"),
                    "plan_rows": snap.get("plan_rows"),
                }
            )
        schema = pa.schema(
            [
                ("version", pa.int64()),
                ("parent", pa.int64()),
                ("patch_of", pa.int64()),
                ("created_at", pa.string()),
                ("name", pa.string()),
                ("recipe_sha256", pa.string()),
                ("seed", pa.int64()),
                ("code_version", pa.string()),
                ("num_steps", pa.int64()),
                ("plan_rows", pa.int64()),
            ]
        )
        return pa.Table.from_pylist(rows, schema=schema)


# -- helpers ----------------------------------------------------------------------------
def _summary_column(field: pa.Field) -> bool:
    numeric = pa.types.is_floating(field.type) or pa.types.is_integer(field.type)
    return field.name in _SUMMARY_COLUMNS or (field.name.startswith("score_") and numeric)


def _digest(raw: NDArray[np.uint8]) -> NDArray[np.uint64]:
    """A 64-bit mix of each row of bytes (FNV-style over 8-byte words, wrapping): a
    bucket key for the clip index, checked by equality, never an identity."""
    n, width = raw.shape
    padded = np.zeros((n, -(-width // 8) * 8), np.uint8)
    padded[:, :width] = raw
    words = padded.view("<u8")
    h = np.full(n, 0xCBF29CE484222325, np.uint64)
    for j in range(words.shape[1]):
        h = (h ^ words[:, j]) * np.uint64(0x100000001B3)
    return h


class _ClipIndex:
    """An ``index.arrow``'s clip ids ordered by a 64-bit digest of their bytes, so a
    clip's rows are a binary search plus an equality check of the few candidates, where
    ``pc.equal`` over the column was O(rows) per request (~100 ms at 10M clips). 16
    bytes per row, built once per index (versions are immutable). Ids of unequal widths
    (not the catalog's) fall back to the scan."""

    def __init__(self, ids: pa.ChunkedArray) -> None:
        self.keys: NDArray[np.uint64] | None = None
        self.order = np.zeros(0, np.int64)
        self.width = 0
        arr = ids.combine_chunks().cast(pa.large_string())
        n = len(arr)
        if n == 0 or arr.null_count:
            return
        offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n + 1]
        widths = np.diff(offsets)
        self.width = int(widths[0])
        if self.width < 1 or widths.min() != widths.max():
            return
        raw = np.frombuffer(arr.buffers()[2], np.uint8)[int(offsets[0]) : int(offsets[-1])]
        digest = _digest(raw.reshape(n, self.width))
        self.order = np.argsort(digest, kind="stable").astype(np.int64)
        self.keys = digest[self.order]

    def rows(self, ids: pa.ChunkedArray, clip_id: str) -> NDArray[np.int64]:
        """Positions of ``clip_id`` in ``ids`` (the column this index was built from)."""
        if self.keys is None:
            return np.asarray(pc.indices_nonzero(pc.equal(ids, clip_id)), np.int64)
        text = clip_id.encode("utf-8")
        if len(text) != self.width:
            return np.zeros(0, np.int64)
        key = _digest(np.frombuffer(text, np.uint8).reshape(1, self.width))
        lo, hi = (
            np.searchsorted(self.keys, key, "left")[0],
            np.searchsorted(self.keys, key, "right")[0],
        )
        candidates = np.sort(self.order[lo:hi])
        if not candidates.size:
            return candidates
        same = pc.equal(ids.take(pa.array(candidates)), clip_id).to_numpy(zero_copy_only=False)
        hits: NDArray[np.int64] = candidates[np.asarray(same, dtype=bool)]
        return hits
