"""Checking a recipe against the catalog at its pin, not only its syntax.

:func:`load_recipe` proves a recipe well formed; :func:`check_recipe` proves that it
means something in *this* catalog at *its* pin. Each value the recipe names must
exist there:

========================================  =============================================
recipe field                              known values (pinned tables)
========================================  =============================================
``tokenizer_version``                     distinct ``tokenizer_version`` in ``latents``
``phases[i].rung``                        distinct ``rung`` of that tokenizer
``filters[i].name`` / ``scores[i].name``  distinct ``filter_name`` in ``scores``
``filters[i].version`` / ``scores[i]…``   distinct ``filter_version`` of that name
``captions.version``                      distinct ``caption_version`` in ``captions``
``captions.kinds[j]``                     distinct ``kind`` of that version
``…embedding_model``                      LanceDB tables (one per model version), with
                                          vectors at the pinned table version
``catalog_pin.<table>``                   the table's Iceberg snapshots
``streams[i].where``                      matches at least one train candidate
========================================  =============================================

and, with eval decontamination, at least ``min_eval_coverage`` of the eval clips at
the pin must have a vector of the model (an eval clip without one is never checked
against). Every problem is collected; one :class:`~catalog.errors.InvalidRecipe`
names the first (``path``, ``value``, ``known``) and lists all in ``errors``.

Distinct values come from Arrow hash group-bys over narrow scans of the pinned tables
(two columns each, batch by batch), so the check costs a few column scans, not a cut;
LanceDB is opened only when the recipe names an embedding model. The stream check
runs the cut's candidate query (:func:`materializer.select.stream_match_counts`);
a cut does it inside selection instead (``streams=False`` here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from catalog.errors import InvalidRecipe, NotFound
from catalog.pins import Pin, centroids_key, embedding_key
from materializer.recipe import Recipe

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog

__all__ = [
    "CatalogCheck",
    "Coverage",
    "KnownValues",
    "check_recipe",
    "pin_centroids",
    "resolve_pin",
]

_SHOWN = 50  # known values listed in a message (``known`` holds them all)


@dataclass(frozen=True)
class KnownValues:
    """What the pinned catalog holds, for the fields a recipe names.

    Attributes:
        scores: filter_name -> its filter_versions.
        captions: caption_version -> its kinds.
        latents: tokenizer_version -> its rungs.
        embedding_models: Embedding model versions with a LanceDB table (empty when
            the check did not need them: the recipe names none).
    """

    scores: Mapping[str, tuple[str, ...]]
    captions: Mapping[str, tuple[str, ...]]
    latents: Mapping[str, tuple[str, ...]]
    embedding_models: tuple[str, ...]


@dataclass(frozen=True)
class Coverage:
    """Eval decontamination coverage at the pin: eval clips with a vector / eval clips."""

    model: str
    version: int | None
    eval_clips: int
    eval_clips_with_vectors: int

    @property
    def coverage(self) -> float:
        """1.0 when the pin holds no eval clip (nothing to decontaminate against)."""
        return self.eval_clips_with_vectors / self.eval_clips if self.eval_clips else 1.0


@dataclass(frozen=True)
class CatalogCheck:
    """A recipe that passed :func:`check_recipe`, and what the check saw."""

    pin: Pin
    known: KnownValues
    coverage: Coverage | None
    streams: tuple[int, ...] | None = None


@dataclass
class _Problems:
    errors: list[dict[str, Any]] = field(default_factory=list)

    def unknown(self, path: str, what: str, value: str, known: Any, of: str = "") -> None:
        names = sorted(known)
        shown = ", ".join(repr(k) for k in names[:_SHOWN]) or "none"
        if len(names) > _SHOWN:
            shown += f", … ({len(names)} in all)"
        message = f"unknown {what} {value!r}{of} at the catalog pin (known: {shown})"
        self.add(path, message, value, names)

    def add(self, path: str, message: str, value: Any = None, known: Any = None) -> None:
        self.errors.append({"path": path, "message": message, "value": value, "known": known})

    def raise_any(self) -> None:
        if not self.errors:
            return
        first = self.errors[0]
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        raise InvalidRecipe(
            f"{first['path']}: {first['message']}{more}",
            path=first["path"],
            value=first["value"],
            known=first["known"],
            errors=self.errors,
        )


def resolve_pin(catalog: VidlakeCatalog, recipe: Recipe, *, fit: bool = True) -> Pin:
    """The recipe's pin, covering every input the cut reads.

    ``latest``: the catalog's current Iceberg snapshots and the current LanceDB
    version of each embedding model the recipe reads. An explicit pin is taken as
    written; one that names no embedding versions (written before pins covered
    embeddings) reads each model at its current version, which the snapshot records.

    With ``semantic_dedup``, the pin also names the centroid version
    (``centroids/<model>``): the pinned one (which must exist), else the latest fitted
    for the recipe's dedup config, else, with ``fit``, version 1 fitted now from the
    pinned vectors (:mod:`materializer.centroids`; a check that must not write passes
    ``fit=False`` and gets a pin without it).
    """
    models = recipe.embedding_models()
    if recipe.catalog_pin == "latest":
        pin = catalog.pin(embeddings=models)
    else:
        pin = Pin.from_dict(recipe.catalog_pin)
        missing = [m for m in models if m not in pin.embeddings]
        if missing:
            from catalog.embeddings import current_versions

            pin = pin.with_embeddings(current_versions(catalog.config.lance, missing))
    return pin_centroids(catalog, recipe, pin, fit=fit)


def pin_centroids(catalog: VidlakeCatalog, recipe: Recipe, pin: Pin, *, fit: bool = True) -> Pin:
    """``pin`` with the semantic dedup's centroid version (see :func:`resolve_pin`)."""
    from materializer.centroids import CentroidConfig, CentroidStore

    dd = recipe.semantic_dedup
    if dd is None or dd.embedding_model in pin.centroids:
        return pin
    if pin.embeddings.get(dd.embedding_model) is None:
        return pin  # no vectors to fit to: check_recipe reports the model
    store = CentroidStore(catalog.objects)
    config = CentroidConfig.of(dd)
    found = store.latest(config)
    if found is None and fit:
        index = catalog.embeddings(
            dd.embedding_model, version=pin.embeddings.get(dd.embedding_model)
        )
        found = store.ensure(config, index)
    return pin if found is None else pin.with_centroids({dd.embedding_model: found.version})


def check_recipe(
    catalog: VidlakeCatalog, recipe: Recipe, pin: Pin | None = None, *, streams: bool = True
) -> CatalogCheck:
    """Check every value ``recipe`` names against ``catalog`` at ``pin``.

    Args:
        catalog: The catalog.
        recipe: A recipe that passed :func:`~materializer.recipe.load_recipe`.
        pin: The state to check at; None resolves the recipe's own pin.
        streams: Also check that every stream predicate matches a train candidate
            (runs the candidate query; a cut checks this during selection).

    Raises:
        InvalidRecipe: ``path``, ``value`` and ``known`` of the first problem;
            ``errors`` lists every problem found.
    """
    pin = resolve_pin(catalog, recipe, fit=False) if pin is None else pin
    problems = _Problems()
    _check_snapshots(catalog, recipe, pin, problems)
    problems.raise_any()  # nothing below can be read at a pin that does not exist
    known = known_values(catalog, pin, embeddings=bool(recipe.embedding_models()))
    _check_latents(recipe, known, problems)
    _check_scores(recipe, known, problems)
    _check_captions(recipe, known, problems)
    usable = _check_embeddings(catalog, recipe, pin, known, problems)
    _check_centroids(catalog, recipe, pin, problems)
    coverage = _check_coverage(catalog, recipe, pin, usable, problems)
    problems.raise_any()
    counts = None
    if streams:
        from materializer.select import check_stream_matches, stream_match_counts

        found = stream_match_counts(catalog, recipe, pin)
        check_stream_matches(recipe, found)
        counts = tuple(found)
    return CatalogCheck(pin=pin, known=known, coverage=coverage, streams=counts)


def known_values(catalog: VidlakeCatalog, pin: Pin, *, embeddings: bool = True) -> KnownValues:
    """Distinct score, caption and latent versions at ``pin``, and (unless
    ``embeddings`` is false) the embedding models LanceDB holds."""
    models: tuple[str, ...] = ()
    if embeddings:
        from catalog.embeddings import list_models

        models = tuple(list_models(catalog.config.lance))
    return KnownValues(
        scores=_grouped(catalog, "scores", pin, "filter_name", "filter_version"),
        captions=_grouped(catalog, "captions", pin, "caption_version", "kind"),
        latents=_grouped(catalog, "latents", pin, "tokenizer_version", "rung"),
        embedding_models=models,
    )


def _grouped(
    catalog: VidlakeCatalog, table: str, pin: Pin, key: str, value: str
) -> dict[str, tuple[str, ...]]:
    """``{key: sorted distinct values}`` over a pinned table.

    A data file whose manifest bounds prove it holds one pair
    (:func:`catalog.scan_plan.proven_pairs`) is not read: most files are one ingest
    job's rows of one filter, caption version or tokenizer, and reading the two
    columns of every file was most of a cut's
    ``pin`` stage (~0.3 of ~0.4 s at 1M clips; planning them ~0.03 s a table). The
    other files are read in record batches, each reduced by :func:`_batch_pairs`,
    then one group-by over the small results."""
    from catalog.scan_plan import plan_scan, proven_pairs, read_plan

    pairs, rest = proven_pairs(plan_scan(catalog, table, pin, [key, value]), key, value)
    parts = [pa.table({key: [k for k, _ in pairs], value: [v for _, v in pairs]})]
    if rest.files:
        batches = read_plan(rest).to_batches()
        parts += [_batch_pairs(pa.Table.from_batches([b]), key, value) for b in batches]
    rows: dict[str, set[str]] = {}
    for part in parts:
        for k, v in zip(part[key].to_pylist(), part[value].to_pylist(), strict=True):
            if k is not None and v is not None:
                rows.setdefault(str(k), set()).add(str(v))
    return {k: tuple(sorted(rows[k])) for k in sorted(rows)}


def _batch_pairs(batch: pa.Table, key: str, value: str) -> pa.Table:
    """The distinct ``(key, value)`` pairs of one batch. A batch is most often one
    ingest job's rows of one filter, caption version or tokenizer: then two min/max
    scans prove the single pair (an Arrow group-by per batch cost ~4 ms, ~0.55 s of
    the 1M-clip cut's ``pin`` stage over 120 batches); else the hash group-by."""
    if batch.num_rows and not batch[key].null_count and not batch[value].null_count:
        low_k, high_k = pc.min_max(batch[key]).values()
        low_v, high_v = pc.min_max(batch[value]).values()
        if low_k == high_k and low_v == high_v:
            # A copy of the row: a one-row slice kept the whole batch's buffers, so
            # the pin stage held every batch of the table at once (~90-160 MB more
            # per million clips in the driver; decision 059).
            return batch.select([key, value]).take(pa.array([0]))
    return batch.group_by([key, value]).aggregate([])


def _check_snapshots(
    catalog: VidlakeCatalog, recipe: Recipe, pin: Pin, problems: _Problems
) -> None:
    if isinstance(recipe.catalog_pin, str):
        return
    for table, sid in pin.items():
        if sid is None or catalog.has_snapshot(table, sid):
            continue
        snaps = catalog.snapshot_ids(table)
        problems.add(
            f"catalog_pin.{table}",
            f"{table} has no snapshot {sid} (expired?); it has {len(snaps)}",
            sid,
            snaps[-_SHOWN:],
        )


def _check_latents(recipe: Recipe, known: KnownValues, problems: _Problems) -> None:
    rungs = known.latents.get(recipe.tokenizer_version)
    if rungs is None:
        problems.unknown(
            "tokenizer_version", "tokenizer version", recipe.tokenizer_version, known.latents
        )
        return
    for i, phase in enumerate(recipe.phases):
        if phase.rung not in rungs:
            problems.unknown(
                f"phases[{i}].rung",
                "rung",
                phase.rung,
                rungs,
                f" for tokenizer {recipe.tokenizer_version!r}",
            )


def _check_scores(recipe: Recipe, known: KnownValues, problems: _Problems) -> None:
    refs = [("filters", i, f.name, f.version) for i, f in enumerate(recipe.filters)]
    refs += [("scores", i, s.name, s.version) for i, s in enumerate(recipe.scores)]
    for where, i, name, version in refs:
        versions = known.scores.get(name)
        if versions is None:
            problems.unknown(f"{where}[{i}].name", "filter name", name, known.scores)
        elif version not in versions:
            problems.unknown(
                f"{where}[{i}].version", "version", version, versions, f" of filter {name!r}"
            )


def _check_captions(recipe: Recipe, known: KnownValues, problems: _Problems) -> None:
    kinds = known.captions.get(recipe.captions.version)
    if kinds is None:
        problems.unknown(
            "captions.version", "caption version", recipe.captions.version, known.captions
        )
        return
    for j, kind in enumerate(recipe.captions.kinds):
        if kind not in kinds:
            problems.unknown(
                f"captions.kinds[{j}]",
                "caption kind",
                kind,
                kinds,
                f" for caption version {recipe.captions.version!r}",
            )


def _model_fields(recipe: Recipe) -> list[tuple[str, str]]:
    fields = []
    if recipe.exclusions.eval_near_duplicates is not None:
        fields.append(
            (
                "exclusions.eval_near_duplicates.embedding_model",
                recipe.exclusions.eval_near_duplicates.embedding_model,
            )
        )
    if recipe.semantic_dedup is not None:
        fields.append(("semantic_dedup.embedding_model", recipe.semantic_dedup.embedding_model))
    return fields


def _check_embeddings(
    catalog: VidlakeCatalog, recipe: Recipe, pin: Pin, known: KnownValues, problems: _Problems
) -> set[str]:
    """Models that exist and hold vectors at the pinned version; report the rest."""
    usable: set[str] = set()
    explicit = not isinstance(recipe.catalog_pin, str)
    for path, model in _model_fields(recipe):
        version = pin.embeddings.get(model)
        if model not in known.embedding_models or version is None:
            problems.unknown(path, "embedding model", model, known.embedding_models)
            continue
        try:
            rows = catalog.embeddings(model, version=version).count()
        except NotFound as exc:
            where = f"catalog_pin.{embedding_key(model)}" if explicit else path
            problems.add(where, exc.message, version, getattr(exc, "versions", None))
            continue
        if rows == 0:
            problems.add(
                path, f"embedding model {model!r} has no vectors at LanceDB version {version}"
            )
            continue
        usable.add(model)
    return usable


def _check_centroids(
    catalog: VidlakeCatalog, recipe: Recipe, pin: Pin, problems: _Problems
) -> None:
    """A pinned centroid version must exist for the recipe's dedup config."""
    from materializer.centroids import CentroidConfig, CentroidStore

    dd = recipe.semantic_dedup
    version = None if dd is None else pin.centroids.get(dd.embedding_model)
    if dd is None or version is None:
        return
    try:
        CentroidStore(catalog.objects).get(CentroidConfig.of(dd), version)
    except NotFound as exc:
        path = f"catalog_pin.{centroids_key(dd.embedding_model)}"
        problems.add(path, exc.message, version, getattr(exc, "known", None))


def _check_coverage(
    catalog: VidlakeCatalog, recipe: Recipe, pin: Pin, usable: set[str], problems: _Problems
) -> Coverage | None:
    excl = recipe.exclusions.eval_near_duplicates
    if excl is None or excl.embedding_model not in usable:
        return None
    eval_ids = pc.unique(catalog.eval_ids("clips", pin)).cast(pa.string())
    version = pin.embeddings.get(excl.embedding_model)
    have = catalog.embeddings(excl.embedding_model, version=version).clip_ids()
    # Hash the (small) eval set, not the table's ids; a table holds each clip once.
    with_vectors = int(pc.sum(pc.cast(pc.is_in(have, value_set=eval_ids), pa.int64())).as_py() or 0)
    found = Coverage(excl.embedding_model, version, len(eval_ids), with_vectors)
    if found.coverage < excl.min_eval_coverage:
        problems.add(
            "exclusions.eval_near_duplicates.min_eval_coverage",
            f"only {with_vectors} of {len(eval_ids)} eval clips ({found.coverage:.4f}) have a "
            f"{excl.embedding_model!r} vector at LanceDB version {version}; decontamination "
            f"needs {excl.min_eval_coverage} (embed the rest, or lower min_eval_coverage)",
            found.coverage,
        )
    return found
