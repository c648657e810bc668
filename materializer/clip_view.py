"""The clip view query: DuckDB statements over the pinned scans of a cut.

The asset side comes first, one row per asset: :data:`ASSET_VIEW_SQL` reduces the
``raw_assets``, ``raw_tombstones`` and ``raw_asset_events`` scans of any set of assets
(all of them, or one ``asset_id`` range of a partitioned cut) to the asset columns of
the view with its ``tombstoned`` and ``quarantined`` verdicts, and
:data:`ASSET_VERDICT_SQL` adds ``eval_duplicate`` from the small eval sets
(:data:`EVAL_SETS_SQL`: the eval assets and the assets they are duplicates of), giving
``raw_asset_view``. The clip view then joins the registered ``raw_<table>`` scans of
the clips (``materializer/select.py``) with ``raw_asset_view`` into the clip view of
``docs/recipes.md``: clips x assets x latents (the recipe's tokenizer, each phase's
rung) x pivoted scores (the named versions) x captions (the named version
and kinds), each candidate sample with the *first* reason it is dropped, its tier and
its stream, plus one ``_match_<i>`` flag per stream (a dropped sample keeps its tier
and flags, which backfill coverage reads: :mod:`materializer.coverage`). The columns
a recipe's predicates may use are declared in :mod:`materializer.predicates`.

User values travel as parameters (:func:`candidate_params`); identifiers in the text
are recipe names (checked against ``^[a-z][a-z0-9_]*$``) and predicates are
sqlglot-normalised allowlisted expressions
(:func:`materializer.predicates.validate_predicate`). An asset's status follows the
catalog's one rule (:data:`catalog.rules.STATUS_EVENTS`).
"""

from __future__ import annotations

from typing import Any

from catalog.rules import STATUS_EVENTS
from materializer.recipe import Recipe

__all__ = [
    "ASSET_VERDICT_SQL",
    "ASSET_VERDICT_UNORDERED_SQL",
    "ASSET_VIEW_PARAMS",
    "ASSET_VIEW_SQL",
    "ASSET_VIEW_UNORDERED_SQL",
    "EVAL_CLIPS_SQL",
    "EVAL_SETS_SQL",
    "candidate_params",
    "candidate_sql",
]

# An eval clip is one whose clip row or asset row says eval (the carve-out's rule).
EVAL_CLIPS_SQL = """
SELECT DISTINCT c.clip_id FROM raw_clips c LEFT JOIN raw_asset_view a ON a.asset_id = c.asset_id
WHERE c.split = 'eval' OR a.split = 'eval' ORDER BY c.clip_id
"""

#: One row per asset of ``raw_assets``, sorted by ``asset_id``: the view's asset
#: columns, its links, and whether it is tombstoned or quarantined. Every input row
#: is keyed by ``asset_id``, so any ``asset_id`` range of the inputs gives that range
#: of the answer. Only ids with several rows (``adup``) go through the window that
#: keeps one: ranking every asset sorted all of them.
_ASSET_VIEW = """
WITH
  adup AS (SELECT asset_id FROM raw_assets GROUP BY asset_id HAVING count(*) > 1),
  assets AS (
    SELECT a.* FROM raw_assets a ANTI JOIN adup USING (asset_id)
    UNION ALL
    SELECT a.* FROM raw_assets a SEMI JOIN adup USING (asset_id)
    QUALIFY row_number() OVER (PARTITION BY a.asset_id ORDER BY a.asset_id) = 1
  ),
  tomb AS (SELECT DISTINCT asset_id FROM raw_tombstones),
  quar AS (
    SELECT asset_id FROM raw_asset_events WHERE list_contains($status_events, event)
    QUALIFY row_number() OVER (
      PARTITION BY asset_id ORDER BY "at" DESC, list_position($status_events, event)
    ) = 1 AND event = 'quarantined'
  )
SELECT
  a.asset_id, a.source, a.source_tier, a.license_id, a.territory, a.pii_class,
  a.probe_codec, a.probe_bitrate, a.split, a.duplicate_of, a.near_duplicates,
  t.asset_id IS NOT NULL AS tombstoned, q.asset_id IS NOT NULL AS quarantined
FROM assets a
LEFT JOIN tomb t ON t.asset_id = a.asset_id
LEFT JOIN quar q ON q.asset_id = a.asset_id
"""
ASSET_VIEW_SQL = _ASSET_VIEW + "ORDER BY a.asset_id\n"
#: :data:`ASSET_VIEW_SQL` in no order: the one-process cut only joins it (a shard must
#: be sorted, a hash join's build side need not; sorting 500k ids cost ~0.4 CPU-s).
ASSET_VIEW_UNORDERED_SQL = _ASSET_VIEW

#: The parameters of :data:`ASSET_VIEW_SQL`: an asset's status is its latest status
#: event, ties to the first listed (the catalog's one rule).
ASSET_VIEW_PARAMS: dict[str, Any] = {"status_events": list(STATUS_EVENTS)}

#: Over an asset view ``av``: the eval assets (``kind = 'eval'``) and the assets an
#: eval asset is a duplicate of (``kind = 'target'``): the broadcast set.
EVAL_SETS_SQL = """
SELECT 'eval' AS kind, asset_id FROM av WHERE split = 'eval'
UNION ALL
SELECT 'target', duplicate_of FROM av WHERE split = 'eval' AND duplicate_of IS NOT NULL
"""

#: ``av`` (asset view rows) with ``eval_duplicate``, sorted by ``asset_id``: the asset
#: is a duplicate of an eval asset, an eval asset is a duplicate of it, or it links an
#: eval asset as a near duplicate. ``eval_ids`` and ``eval_targets`` are the whole
#: catalog's eval sets.
_ASSET_VERDICT = """
WITH ed AS (
  SELECT DISTINCT asset_id FROM (
    SELECT a.asset_id FROM av a JOIN eval_ids e ON a.duplicate_of = e.asset_id
    UNION ALL
    SELECT asset_id FROM eval_targets
    UNION ALL
    SELECT n.asset_id FROM (SELECT asset_id, unnest(near_duplicates) AS other FROM av) n
    JOIN eval_ids e ON n.other = e.asset_id
  )
)
SELECT av.* EXCLUDE (near_duplicates), ed.asset_id IS NOT NULL AS eval_duplicate
FROM av LEFT JOIN ed ON ed.asset_id = av.asset_id
"""
ASSET_VERDICT_SQL = _ASSET_VERDICT + "ORDER BY av.asset_id\n"
#: :data:`ASSET_VERDICT_SQL` in no order (see :data:`ASSET_VIEW_UNORDERED_SQL`).
ASSET_VERDICT_UNORDERED_SQL = _ASSET_VERDICT


#: ``lat``: the latest latent row of each (clip, rung) of the recipe's tokenizer, ties
#: to the smallest object and member SHA-256. Almost every key has one row, so only the
#: keys with several (``dup``) go through the window: ranking every row sorted all
#: of them and cost twice the rest of the latent side.
_LATEST_LATENT_SQL = """dup AS (
    SELECT clip_id, rung FROM raw_latents WHERE tokenizer_version = $tokenizer
    GROUP BY clip_id, rung HAVING count(*) > 1
  ),
  lat AS (
    SELECT l.* FROM raw_latents l ANTI JOIN dup USING (clip_id, rung)
    WHERE l.tokenizer_version = $tokenizer
    UNION ALL
    SELECT l.* FROM raw_latents l SEMI JOIN dup USING (clip_id, rung)
    WHERE l.tokenizer_version = $tokenizer
    QUALIFY row_number() OVER (
      PARTITION BY l.clip_id, l.rung ORDER BY l.ingested_at DESC, l.object_sha256, l.member_sha256
    ) = 1
  )"""


def candidate_params(recipe: Recipe) -> dict[str, Any]:
    """The parameters of :func:`candidate_sql` for ``recipe``."""
    params: dict[str, Any] = {
        "tokenizer": recipe.tokenizer_version,
        "caption_version": recipe.captions.version,
        "kinds": list(recipe.captions.kinds),
    }
    for i, kind in enumerate(recipe.captions.kinds):
        params[f"kind{i}"] = kind
    for i, (name, version) in enumerate(recipe.score_versions().items()):
        params[f"score{i}_name"] = name
        params[f"score{i}_version"] = version
    return params


def candidate_sql(recipe: Recipe) -> str:
    """One query: the clip view with latent, captions, tier, stream and a drop reason."""
    versions = recipe.score_versions()
    rungs = sorted({p.rung for p in recipe.phases})
    rung_values = ", ".join(f"('{r}')" for r in rungs)  # rung matches ^[1-9][0-9]*p$
    score_pairs = " OR ".join(
        f"(filter_name = $score{i}_name AND filter_version = $score{i}_version)"
        for i in range(len(versions))
    )
    # One pass over the scores: the latest row of each named (filter, version) per clip.
    score_cols = ", ".join(
        f"arg_max(score, computed_at) FILTER (WHERE filter_name = $score{i}_name "
        f"AND filter_version = $score{i}_version) AS score_{n}"
        for i, n in enumerate(versions)
    )
    score_view_cols = "".join(f", s.score_{n}" for n in versions)
    tier_expr, stream_case, match_flags = _tier_and_streams(recipe)
    return f"""
WITH
  assets AS (SELECT * FROM raw_asset_view),
  {_LATEST_LATENT_SQL},
  s AS (
    SELECT clip_id{", " + score_cols if score_cols else ""}
    FROM raw_scores WHERE {score_pairs or "FALSE"} GROUP BY clip_id
  ),
  cap AS ({_captions_sql(len(recipe.captions.kinds))}),
  rungs(rung) AS (VALUES {rung_values}),
  base AS (
    SELECT
      c.clip_id, c.asset_id, c.t_start_s, c.t_end_s, c.t_end_s - c.t_start_s AS duration_s,
      c.fps, c.num_frames, c.width, c.height, c.width::DOUBLE / c.height AS aspect,
      a.source, a.source_tier, a.license_id, a.territory, a.pii_class,
      a.probe_codec AS codec, a.probe_bitrate AS bitrate, r.rung,
      l.latent_frames, l.tokens, coalesce(cap.caption_count, 0) AS caption_count
      {score_view_cols},
      l.format, l.object_sha256, l."offset", l.length, l.member_sha256, l.tensor_keys,
      l.job_id AS latent_job_id, c.job_id AS clip_job_id,
      cap.captions, cap.text_embedding_sha256,
      CASE {_drop_cases(recipe)} ELSE NULL END AS drop_reason
    FROM raw_clips c
    CROSS JOIN rungs r
    JOIN assets a ON a.asset_id = c.asset_id
    LEFT JOIN lat l ON l.clip_id = c.clip_id AND l.rung = r.rung
    LEFT JOIN s ON s.clip_id = c.clip_id
    LEFT JOIN cap ON cap.clip_id = c.clip_id
  ),
  tiered AS (SELECT *, {tier_expr} AS tier, {match_flags} FROM base)
SELECT * REPLACE ({_KEPT_ONLY_SQL}),
  CASE WHEN drop_reason IS NULL THEN (CASE {stream_case} ELSE NULL END) END AS stream
FROM tiered
"""


#: The text and list columns that only kept rows carry: a dropped row is counted (its
#: reason and ``_match_<i>`` flags) and read by backfill coverage (clip, tier, flags,
#: scores, ``caption_count``: :mod:`materializer.coverage`), never served, so it
#: brings nothing else out of DuckDB (about 40 % of a cut's candidate rows).
_KEPT_ONLY = (
    "asset_id", "source", "license_id", "territory", "pii_class", "codec", "format",
    "object_sha256", "member_sha256", "tensor_keys", "latent_job_id", "clip_job_id",
    "captions", "text_embedding_sha256",
)  # fmt: skip
_KEPT_ONLY_SQL = ", ".join(
    f'CASE WHEN drop_reason IS NULL THEN "{c}" END AS "{c}"' for c in _KEPT_ONLY
)


def _captions_sql(kinds: int) -> str:
    """One row per clip with captions of the version: ``captions`` (the latest text of
    each kind it has, in the recipe's order of kinds), ``text_embedding_sha256`` (the
    latest non-null one of each such kind) and ``caption_count`` (the kinds it has).

    One pass over the caption rows, one aggregate pair per kind (``$kind<i>``), the way
    the scores are pivoted: an ordered ``list`` per clip over a (clip, kind) grouping
    sorted every group and cost most of the join. ``text`` is never null, so a kind's
    text is null exactly when the clip has no row of that kind.
    """
    cols = ", ".join(
        f"arg_max(text, ingested_at) FILTER (WHERE kind = $kind{i}) AS t{i}, "
        f"arg_max(text_embedding_sha256, ingested_at) FILTER (WHERE kind = $kind{i}) AS e{i}"
        for i in range(kinds)
    )

    def present(values: str) -> str:
        parts = ", ".join(
            f"CASE WHEN t{i} IS NULL THEN []::VARCHAR[] ELSE [{values}{i}] END"
            for i in range(kinds)
        )
        return f"flatten([{parts}])"

    count = " + ".join(f"(t{i} IS NOT NULL)::INTEGER" for i in range(kinds))
    return f"""
    SELECT clip_id, {present("t")} AS captions,
           {present("e")} AS text_embedding_sha256, {count} AS caption_count
    FROM (
      SELECT clip_id, {cols}
      FROM raw_captions WHERE caption_version = $caption_version
        AND list_contains($kinds::VARCHAR[], kind)
      GROUP BY clip_id
    )
  """


def _drop_cases(recipe: Recipe) -> str:
    """The ``WHEN ... THEN '<reason>'`` branches, in the documented order of reasons."""
    drop = ["WHEN c.split = 'eval' OR a.split = 'eval' THEN 'eval'"]
    if recipe.exclusions.tombstoned:
        drop.append("WHEN a.tombstoned THEN 'tombstoned'")
    if recipe.exclusions.quarantined:
        drop.append("WHEN a.quarantined THEN 'quarantined'")
    drop.append("WHEN a.duplicate_of IS NOT NULL THEN 'duplicate_asset'")
    drop.append("WHEN a.eval_duplicate THEN 'eval_duplicate_asset'")
    drop.append("WHEN l.clip_id IS NULL THEN 'no_latent'")
    index = {name: i for i, name in enumerate(recipe.score_versions())}
    for f in recipe.filters:
        # The version rides as a parameter: versions are free text.
        i = index[f.name]
        reason = f"'missing_score:' || $score{i}_name || '@' || $score{i}_version"
        drop.append(f"WHEN s.score_{f.name} IS NULL THEN {reason}")
        bounds = []
        if f.min is not None:
            bounds.append(f"s.score_{f.name} < {float(f.min)!r}")
        if f.max is not None:
            bounds.append(f"s.score_{f.name} > {float(f.max)!r}")
        drop.append(f"WHEN {' OR '.join(bounds)} THEN 'filter:{f.name}'")
    drop.append("WHEN cap.clip_id IS NULL THEN 'no_caption'")
    return " ".join(drop)


def _tier_and_streams(recipe: Recipe) -> tuple[str, str, str]:
    """The tier expression, the stream CASE branches and the per-stream match flags."""
    tier_case = " ".join(f"WHEN {r.where} THEN '{r.name}'" for r in recipe.tiers.rules)
    tier_expr = (
        f"CASE {tier_case} ELSE '{recipe.tiers.default}' END"
        if tier_case
        else (f"'{recipe.tiers.default}'")
    )
    stream_case = " ".join(
        f"WHEN {s.where} THEN {i}::INTEGER" for i, s in enumerate(recipe.streams)
    )
    # Each stream's own match (tier included), for the "matches nothing" check.
    match_flags = ", ".join(
        f"coalesce(({s.where}), FALSE) AS _match_{i}" for i, s in enumerate(recipe.streams)
    )
    return tier_expr, stream_case, match_flags
