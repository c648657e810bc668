"""A dry run of a cut: everything up to the step plan, in a temporary directory,
reported and then thrown away; nothing is published.

:func:`plan_cut` resolves and checks the pin as a cut does
(:func:`materializer.cut.checked_pin`), runs the selection and, when something is
selected, the scatter and the step plan (:func:`materializer.cut.plan_samples`), and
reports the numbers a cut would record in ``snapshot.json`` (from the same
:func:`materializer.cut.snapshot_doc`), plus what a recipe author tunes by:

- ``candidates`` and ``drops`` (candidate samples dropped, by reason: a missing score
  version, ``missing_score:<name>@<version>``, apart from ``filter:<name>``, a score
  outside the bounds);
- ``backfill``: the candidate clips lacking each score and caption version
  (:mod:`materializer.coverage`); a coverage below the recipe's ``min_coverage`` is a
  problem;
- ``counts``: kept samples per stream, per source tier and per bucket, clips, assets;
- ``phases``: steps, plan rows, tokens, target and realized shares per phase;
- ``coverage``: per stream, the share of its selected samples the plan draws at
  least once, and ``stream_epochs``; eval ``decontamination`` coverage when the recipe
  has it;
- ``quality``: the plan quality report's headline numbers
  (:func:`materializer.quality.quality_summary`); a recipe threshold it exceeds is a
  problem, as the cut would fail on it.

A recipe that selects nothing, or whose plan cannot be drawn (a phase without
samples for a weighted stream, a pool smaller than its per-step quota), is not an
error here: the report says ``publishable: false`` with the ``problems`` a cut would
fail on, beside the same counts. Errors in the recipe itself (an unknown filter
version, rung or tokenizer; a stream matching nothing) are raised as the cut raises
them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.errors import InvalidInput, InvalidRecipe
from manifests.ipc import iter_batches
from materializer.coverage import check_min_coverage
from materializer.cut import (
    Progress,
    check_plan_fits,
    checked_pin,
    embedding_facts,
    plan_samples,
    record_repeats,
    snapshot_doc,
)
from materializer.cut_artifacts import sample_counts
from materializer.quality import check_quality, plan_quality, quality_summary
from materializer.recipe import Recipe
from materializer.select import Selection, check_pools, select

if TYPE_CHECKING:
    import os

    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin

__all__ = ["describe_drops", "plan_cut", "selection_counts"]

#: snapshot.json's fields a dry run reports as they are.
_FROM_SNAPSHOT = (
    "stream_shares",
    "bucket_histogram",
    "stream_epochs",
    "phases",
    "num_steps",
    "plan_rows",
    "tokens",
    "decontamination",
    "repeats_in_step",
)


def plan_cut(
    catalog: VidlakeCatalog,
    recipe: Recipe,
    *,
    pin: Pin | None = None,
    workdir: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """What cutting ``recipe`` would select and plan at its pin; publishes nothing.

    Raises:
        InvalidRecipe: As :func:`materializer.cut.build_artifacts` raises it for the
            recipe itself (an unknown name at the pin, a stream matching nothing, a
            plan that cannot fit on the disk).
    """
    report = progress or (lambda stage, fraction: None)
    check_plan_fits(recipe, workdir or tempfile.gettempdir())
    report("pin", 0.0)
    pin = checked_pin(catalog, recipe, pin)
    report("pin", 1.0)
    selection = select(catalog, recipe, pin, progress=report)
    result: dict[str, Any] = {
        "name": recipe.name,
        "recipe_sha256": recipe.sha256(),
        "catalog_snapshot_ids": pin.to_dict(),
        "candidates": selection.candidates,
        "drops": selection.drops,
        "counts": selection_counts(recipe, selection),
        "backfill": selection.backfill.to_dict() if selection.backfill else None,
        "problems": [],
    }
    problem = _unplannable(recipe, selection)
    if problem is None:
        with tempfile.TemporaryDirectory(prefix="vidlake-plan-", dir=workdir) as tmp:
            problem = _plan(recipe, pin, selection, Path(tmp), result, report)
    if problem is not None:
        result["problems"].append(problem)
    result["publishable"] = not result["problems"]
    return result


def _unplannable(recipe: Recipe, selection: Selection) -> dict[str, Any] | None:
    """The problem a cut would stop on before planning (None: it would plan)."""
    try:
        check_min_coverage(recipe, selection.backfill)
    except InvalidRecipe as exc:
        return _problem(exc)
    if selection.samples.num_rows == 0:
        text = "the recipe selects no samples at this catalog state: " + describe_drops(
            selection.candidates, selection.drops
        )
        return {"code": "invalid_input", "message": text, "path": None}
    try:
        check_pools(recipe, selection.samples)
    except InvalidInput as exc:
        return _problem(exc)
    return None


def _plan(
    recipe: Recipe,
    pin: Pin,
    selection: Selection,
    out: Path,
    result: dict[str, Any],
    report: Progress,
) -> dict[str, Any] | None:
    """Plan into ``out`` and fill ``result`` with the plan's numbers (or return the
    problem a cut would fail on)."""
    try:
        samples, summary, plan_path = plan_samples(recipe, selection.samples, out, progress=report)
    except (InvalidRecipe, InvalidInput) as exc:
        return _problem(exc)
    counts = sample_counts(samples, len(selection.stream_names))
    doc = snapshot_doc(recipe, pin, selection, counts, summary)
    doc.update(embedding_facts(recipe, pin, selection))
    record_repeats(doc, summary)
    result.update({k: doc.get(k) for k in _FROM_SNAPSHOT})
    result["coverage"] = _coverage(plan_path, samples, selection.stream_names)
    quality = plan_quality(plan_path, samples, recipe)
    result["quality"] = quality_summary(quality)
    try:
        check_quality(quality)
    except InvalidInput as exc:
        return _problem(exc)
    return None


def _problem(exc: InvalidInput | InvalidRecipe) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "path": exc.details.get("path")}


def selection_counts(recipe: Recipe, selection: Selection) -> dict[str, Any]:
    """Kept samples per stream, source tier and bucket (by the recipe's names), and the
    distinct clips and assets."""
    samples = selection.samples
    keys = recipe.buckets.bucket_keys()
    names = selection.stream_names

    def by(column: str, label: Any) -> dict[str, int]:
        if samples.num_rows == 0:
            return {}
        counts = pc.value_counts(samples[column]).to_pylist()
        found = {label(c["values"]): int(c["counts"]) for c in counts}
        return dict(sorted(found.items()))

    return {
        "samples": samples.num_rows,
        "clips": _distinct(samples, "clip_id"),
        "assets": _distinct(samples, "asset_id"),
        "per_stream": {n: 0 for n in names} | by("stream", lambda s: names[int(s)]),
        "per_tier": by("tier", str),
        "per_bucket": by("bucket", lambda b: keys[int(b)]),
    }


def _distinct(samples: pa.Table, column: str) -> int:
    if samples.num_rows == 0:
        return 0
    return int(pc.count_distinct(samples[column]).as_py())


def _coverage(plan_path: Path, samples: pa.Table, stream_names: list[str]) -> dict[str, float]:
    """Per stream, the share of its selected samples the plan draws at least once."""
    served = np.zeros(samples.num_rows, dtype=bool)
    for batch in iter_batches(plan_path, what="plan.arrow"):
        rows = pc.list_flatten(batch.column("rows")).to_numpy()
        served[np.asarray(rows, dtype=np.int64)] = True
    # ``row`` is the manifest order: samples[i]["row"] == i after the scatter.
    streams = samples["stream"].to_numpy()
    out = {}
    for i, name in enumerate(stream_names):
        mine = streams == i
        total = int(mine.sum())
        out[name] = float(served[mine].sum()) / total if total else 0.0
    return out


def describe_drops(candidates: int, drops: dict[str, int]) -> str:
    """``"40 candidate samples; dropped: filter 30, tombstoned 10"``."""
    text = f"{candidates:,} candidate samples"
    if not drops:
        return text + ", none dropped"
    parts = [f"{reason} {n:,}" for reason, n in sorted(drops.items(), key=lambda kv: -kv[1])]
    return f"{text}; dropped: {', '.join(parts)}"
