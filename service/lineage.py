"""Forensics: which samples a step trained on, and where a clip came from and went.

Both directions are answered from a snapshot's artifacts, memory-mapped from a local,
verified, content-addressed copy (:class:`service.snapshot_reader.SnapshotReader`),
plus filtered catalog scans for the handful of clips and assets involved — never by
reading whole tables into Python:

* step → samples (:func:`step_samples`): one record of ``plan.arrow``, its rows
  taken from ``index.arrow`` and ``manifest.parquet``, joined to the assets' source
  and license and the scores the recipe named.
* clip → everything (:func:`clip_lineage`): the clip, its asset (provenance,
  license), tombstones and events, every score (with filter version), caption and
  latent, and every snapshot version, row and step that served it.

Steps of a row come from the cut's ``lineage.arrow`` (one record per manifest row:
``row``, ``steps``) when the version has one; a patch has none (its plan differs from
its base's), so its steps come from a vectorised scan of its ``plan.arrow``
(:meth:`service.snapshot_reader.SnapshotReader.steps_of_rows`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from catalog.errors import Forbidden, InvalidInput, NotFound
from manifests.registry import SnapshotRecord
from service.snapshot_reader import SnapshotReader
from service.sql import to_json_rows

if TYPE_CHECKING:
    from catalog.pins import Pin
    from service.sql import CatalogViews

__all__ = ["MAX_STEPS_PER_VERSION", "clip_lineage", "step_samples"]

log = logging.getLogger("vidlake.service.lineage")

MAX_STEPS_PER_VERSION = 10_000
_CLIP_ID = re.compile(r"^[0-9a-f]{32}$")


def _jsonable_rows(table: pa.Table, drop: Sequence[str] = ()) -> list[dict[str, Any]]:
    keep = [c for c in table.column_names if c not in drop]
    table = table.select(keep)
    return [dict(zip(keep, row, strict=True)) for row in to_json_rows(table)]


def _json_field(row: dict[str, Any], name: str) -> None:
    value = row.get(name)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            row[name] = json.loads(value)


def _snapshot_pin(views: CatalogViews, record: SnapshotRecord, latest: Callable[[], Pin]) -> Pin:
    """The catalog state ``record`` was cut from, or ``latest()`` when that state is not
    readable here (a foreign or expired snapshot id). ``latest`` is called only then:
    the catalog's current state loads every table's metadata, and a per-request load
    of it was the tail of ``GET /v1/snapshots/{v}/steps/{s}`` (issue 16)."""
    from catalog.pins import Pin

    ids = record.snapshot.get("catalog_snapshot_ids")
    if isinstance(ids, Mapping):
        try:
            pin = Pin.from_dict(ids)
            for table in ("assets", "scores"):
                views.dataset(table, pin, include_eval=True)
            return pin
        except (InvalidInput, NotFound):
            pass
    return latest()


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
    latest: Callable[[], Pin],
    sees_eval: bool,
) -> dict[str, Any]:
    """The exact samples of ``step`` of ``version``, each with a lineage summary (the
    assets and scores as of the catalog state the version was cut from; ``latest()``,
    the current state, only where that one is not readable)."""
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
