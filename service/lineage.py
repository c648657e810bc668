"""Forensics: which samples a step trained on, and where a clip came from and went.

Both directions are answered from a snapshot's artifacts, memory-mapped from a local,
verified, content-addressed copy (:class:`SnapshotReader`), plus filtered catalog
scans for the handful of clips and assets involved — never by reading whole tables
into Python:

* step → samples (:func:`step_samples`): one record of ``plan.arrow``, its rows
  taken from ``index.arrow`` and ``manifest.parquet``, joined to the assets' source
  and license and the scores the recipe named.
* clip → everything (:func:`clip_lineage`): the clip, its asset (provenance,
  license), tombstones and events, every score (with filter version), caption and
  latent, and every snapshot version, row and step that served it.

Steps of a row come from the cut's ``lineage.arrow`` (one record per manifest row:
``row``, ``steps``) when the version has one; a patch has none (its plan differs from
its base's), so its steps come from a vectorised scan of its ``plan.arrow``
(:meth:`SnapshotReader.steps_of_rows`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from numpy.typing import NDArray

from catalog.atomic import atomic_path
from catalog.errors import ChecksumMismatch, Forbidden, InvalidInput, NotFound
from manifests.artifacts import ArtifactCache
from manifests.format import LINEAGE_NAME
from manifests.ipc import read_table, write_table
from manifests.registry import Registry, SnapshotRecord
from service.sql import to_json_rows

if TYPE_CHECKING:
    from catalog.catalog import Pin
    from service.sql import CatalogViews

__all__ = ["MAX_STEPS_PER_VERSION", "SnapshotReader", "clip_lineage", "step_samples"]

log = logging.getLogger("vidlake.service.lineage")

MAX_STEPS_PER_VERSION = 10_000
#: How long a cached record is trusted before its erasure marks are listed again.
ERASURE_RECHECK_S = 5.0
_SUMMARY_COLUMNS = frozenset({"row", "tier", "source", "source_tier", "license_id"})
_CLIP_ID = re.compile(r"^[0-9a-f]{32}$")


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
        """Manifest rows (and their stream ids) of ``clip_id`` in ``version``."""
        index = self.ipc_table(version, "index.arrow")
        hits = pc.indices_nonzero(pc.equal(index.column("clip_id"), clip_id))
        if not len(hits):
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        taken = index.select(["row", "stream"]).take(hits)
        return (
            taken.column("row").to_numpy().astype(np.int64),
            taken.column("stream").to_numpy().astype(np.int32),
        )

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


def _jsonable_rows(table: pa.Table, drop: Sequence[str] = ()) -> list[dict[str, Any]]:
    keep = [c for c in table.column_names if c not in drop]
    table = table.select(keep)
    return [dict(zip(keep, row, strict=True)) for row in to_json_rows(table)]


def _json_field(row: dict[str, Any], name: str) -> None:
    value = row.get(name)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            row[name] = json.loads(value)


def _snapshot_pin(views: CatalogViews, record: SnapshotRecord, latest: Pin) -> Pin:
    """The catalog state ``record`` was cut from, or ``latest`` when that state is not
    readable here (a foreign or expired snapshot id)."""
    from catalog.catalog import Pin

    ids = record.snapshot.get("catalog_snapshot_ids")
    if isinstance(ids, Mapping):
        try:
            pin = Pin.from_dict(ids)
            for table in ("assets", "scores"):
                views.dataset(table, pin, include_eval=True)
            return pin
        except (InvalidInput, NotFound):
            pass
    return latest


def _score_versions(record: SnapshotRecord) -> dict[str, str]:
    recipe = record.snapshot.get("recipe")
    out: dict[str, str] = {}
    if isinstance(recipe, Mapping):
        for key in ("scores", "filters"):
            for item in recipe.get(key) or ():
                if isinstance(item, Mapping) and "name" in item and "version" in item:
                    out[str(item["name"])] = str(item["version"])
    return out


def _manifest_scores(manifest: pa.Table) -> list[dict[str, float]] | None:
    """Scores carried by manifest rows (a ``scores`` map/struct or ``score_*``
    columns), or None when the manifest carries none."""
    n = manifest.num_rows
    if "scores" in manifest.column_names:
        values = manifest.column("scores").to_pylist()
        out = []
        for v in values:
            pairs = v.items() if isinstance(v, Mapping) else (v or [])
            out.append({str(k): float(s) for k, s in pairs if s is not None})
        return out
    cols = [
        c
        for c in manifest.column_names
        if c.startswith("score_")
        and (
            pa.types.is_floating(manifest.schema.field(c).type)
            or pa.types.is_integer(manifest.schema.field(c).type)
        )
    ]
    if not cols:
        return None
    data = {c.removeprefix("score_"): manifest.column(c).to_pylist() for c in cols}
    return [
        {name: float(vals[i]) for name, vals in data.items() if vals[i] is not None}
        for i in range(n)
    ]


def _catalog_scores(
    views: CatalogViews, pin: Pin, clip_ids: Sequence[str], versions: Mapping[str, str]
) -> dict[str, dict[str, float]]:
    """Latest score per (clip, filter) among ``clip_ids`` at ``pin``, at the recipe's
    versions where it names one."""
    if not clip_ids:
        return {}
    rows = views.lookup("scores", pin, "clip_id", sorted(set(clip_ids)))
    out: dict[str, dict[str, float]] = {}
    best: dict[tuple[str, str], Any] = {}
    for r in rows.to_pylist():
        name = r["filter_name"]
        if name in versions and r["filter_version"] != versions[name]:
            continue
        key = (r["clip_id"], name)
        if key not in best or r["computed_at"] > best[key]:
            best[key] = r["computed_at"]
            out.setdefault(r["clip_id"], {})[name] = float(r["score"])
    return out


# -- step -> samples ------------------------------------------------------------------
def step_samples(
    views: CatalogViews,
    reader: SnapshotReader,
    version: int,
    step: int,
    *,
    latest: Pin,
    sees_eval: bool,
) -> dict[str, Any]:
    """The exact samples of ``step`` of ``version``, each with a lineage summary (the
    assets and scores as of the catalog state the version was cut from)."""
    record = reader.record(version)
    plan = reader.plan_step(version, step)
    rows = [int(r) for r in plan["rows"]]
    index = reader.ipc_table(version, "index.arrow")
    taken = index.take(pa.array(rows, pa.int64())) if rows else index.slice(0, 0)
    manifest = _manifest_rows(reader, version, rows)
    streams = [str(s) for s in record.snapshot.get("streams") or []]
    clip_ids = taken.column("clip_id").to_pylist()
    pin = _snapshot_pin(views, record, latest)
    if not sees_eval and clip_ids:
        # A training cut never holds eval clips; this guard keeps it that way for
        # anything else a registry might hold.
        eval_clips = views.eval_clip_ids(pin)
        if len(eval_clips) and pc.any(pc.is_in(taken.column("clip_id"), eval_clips)).as_py():
            raise Forbidden("this step holds eval material; the eval scope is needed", scope="eval")
    assets = _asset_summaries(views, pin, taken, manifest)
    scores = _manifest_scores(manifest) if manifest is not None else None
    if scores is None:
        by_clip = _catalog_scores(views, pin, clip_ids, _score_versions(record))
        scores = [by_clip.get(c, {}) for c in clip_ids]
    tiers = (
        [None if t is None else str(t) for t in manifest.column("tier").to_pylist()]
        if manifest is not None and "tier" in manifest.column_names
        else [None] * len(rows)
    )
    samples = []
    for i, item in enumerate(taken.to_pylist()):
        asset = assets.get(item["asset_id"], {})
        stream = int(item["stream"])
        samples.append(
            {
                "row": int(item["row"]),
                "position": i,
                "clip_id": item["clip_id"],
                "asset_id": item["asset_id"],
                "source": asset.get("source"),
                "source_tier": asset.get("source_tier"),
                "license_id": asset.get("license_id"),
                "stream": streams[stream] if 0 <= stream < len(streams) else str(stream),
                "tier": tiers[i],
                "bucket": int(item["bucket"]),
                "num_frames": int(item["num_frames"]),
                "object_sha256": item["object_sha256"],
                "scores": scores[i],
            }
        )
    return {
        "version": version,
        "step": step,
        "phase": int(plan["phase"]),
        "bucket": int(plan["bucket"]),
        "stream_epochs": [int(e) for e in plan["stream_epochs"]],
        "skipped": int(plan["skipped"]),
        "count": len(samples),
        "samples": samples,
    }


def _manifest_rows(reader: SnapshotReader, version: int, rows: list[int]) -> pa.Table | None:
    """The summary columns of manifest rows ``rows``, in that order (manifest row
    ``r`` is record ``r``), or None when the manifest does not hold them so."""
    if not rows:
        return None
    summary = reader.manifest_summary(version)
    if "row" not in summary.column_names or max(rows) >= summary.num_rows:
        return None
    got = summary.take(pa.array(rows, pa.int64()))
    if got.column("row").to_pylist() != rows:
        return None
    return got


def _asset_summaries(
    views: CatalogViews, pin: Pin, taken: pa.Table, manifest: pa.Table | None
) -> dict[str, dict[str, Any]]:
    """asset id -> source, source tier and license: from the manifest when it carries
    them (a cut's does), else from the catalog's assets at ``pin``."""
    asset_ids = taken.column("asset_id").to_pylist()
    wanted = ("source", "source_tier", "license_id")
    if manifest is not None and all(c in manifest.column_names for c in wanted):
        columns = [manifest.column(c).to_pylist() for c in wanted]
        return {
            a: dict(zip(wanted, values, strict=True))
            for a, *values in zip(asset_ids, *columns, strict=True)
        }
    if not asset_ids:
        return {}
    found = views.lookup("assets", pin, "asset_id", sorted(set(asset_ids)))
    return {a["asset_id"]: {c: a.get(c) for c in wanted} for a in found.to_pylist()}


# -- clip -> everything ---------------------------------------------------------------
def clip_lineage(
    views: CatalogViews, reader: SnapshotReader, clip_id: str, *, pin: Pin, sees_eval: bool
) -> dict[str, Any]:
    """Everything known about ``clip_id`` at ``pin`` (see the module docstring)."""
    if not isinstance(clip_id, str) or not _CLIP_ID.match(clip_id):
        raise InvalidInput(
            f"a clip id is 32 lowercase hex characters, got {clip_id!r}", field="clip_id"
        )
    clips = views.lookup("clips", pin, "clip_id", [clip_id])
    clip = _jsonable_rows(clips)[0] if clips.num_rows else None
    # An eval clip is absent to a caller without eval (a 404 like a missing clip, so
    # that its existence is not disclosed either).
    if clip is None or (clip.get("split") == "eval" and not sees_eval):
        raise NotFound(f"no clip {clip_id}", clip_id=clip_id)
    _json_field(clip, "metadata")
    asset_id = clip["asset_id"]
    by_asset = ("asset_id", [asset_id])
    by_clip = ("clip_id", [clip_id])
    assets = _jsonable_rows(views.lookup("assets", pin, *by_asset), drop=("fingerprint",))
    asset = assets[0] if assets else None
    if asset is not None:
        _json_field(asset, "provenance")
    events = _jsonable_rows(views.lookup("asset_events", pin, *by_asset))
    for event in events:
        _json_field(event, "details")
    serving = []
    for v in reader.versions():
        rows, streams = reader.clip_rows(v, clip_id)
        if not len(rows):
            continue
        record = reader.record(v)
        names = [str(s) for s in record.snapshot.get("streams") or []]
        steps = sorted(
            {s for found in reader.steps_of_rows(v, rows.tolist()).values() for s in found}
        )
        serving.append(
            {
                "version": v,
                "rows": rows.tolist(),
                "streams": sorted(
                    {names[s] if 0 <= s < len(names) else str(s) for s in streams.tolist()}
                ),
                "steps": steps[:MAX_STEPS_PER_VERSION],
                "steps_truncated": len(steps) > MAX_STEPS_PER_VERSION,
                "patch_of": record.patch_of,
            }
        )
    return {
        "clip": clip,
        "asset": asset,
        "tombstones": _jsonable_rows(views.lookup("tombstones", pin, *by_asset)),
        "asset_events": events,
        "scores": _jsonable_rows(views.lookup("scores", pin, *by_clip)),
        "captions": _jsonable_rows(views.lookup("captions", pin, *by_clip)),
        "latents": _jsonable_rows(views.lookup("latents", pin, *by_clip)),
        "snapshots": serving,
    }
