"""Pure ingest rules: the eval carve-out, clip ids, near-duplicates and status.

Every function here is a pure function of its arguments (arrays in, arrays out, no
catalog state), so that property tests can check them and the catalog can apply them
to a 100k-row batch without a Python loop per row (hashing aside). One module per
rule, each with the rule written out in its docstring:

- :mod:`.ids`: the eval carve-out (``eval_mask``) and clip ids (``clip_id``).
- :mod:`.neardup`: fingerprints and the near-duplicate rule with its exact search.
- :mod:`.links`: near-duplicate groups and their canonical copies.
- :mod:`.status`: the latest row of append-only facts, and an asset's status (one
  tie-break, :data:`STATUS_EVENTS`, shared with the cut's SQL).
- :mod:`.membership`: 64-bit digest indexes for exact membership tests.

The package's names below are the API (``from catalog import rules``;
``rules.clip_id``).
"""

from catalog.rules.ids import clip_id, clip_ids, eval_mask, new_eval_salt
from catalog.rules.links import (
    Links,
    bitrates,
    canonical_indices,
    connected_components,
    link_edges,
    plan_links,
)
from catalog.rules.membership import digest_matches, hex_prefix64, index_merge, sorted_index
from catalog.rules.neardup import (
    FRAME_BYTES,
    MIN_FRAME_BITS,
    NearDupRule,
    band_keys,
    fingerprint_matrix,
    frame_match_counts,
    is_near_duplicate,
    key_codes,
    near_duplicate_pairs,
    pack_fingerprint,
    unpack_fingerprint,
)
from catalog.rules.status import STATUS_EVENTS, asset_status, latest_rows, latest_status_events

__all__ = [
    "FRAME_BYTES",
    "MIN_FRAME_BITS",
    "STATUS_EVENTS",
    "Links",
    "NearDupRule",
    "asset_status",
    "band_keys",
    "bitrates",
    "canonical_indices",
    "clip_id",
    "clip_ids",
    "connected_components",
    "digest_matches",
    "eval_mask",
    "fingerprint_matrix",
    "frame_match_counts",
    "hex_prefix64",
    "index_merge",
    "is_near_duplicate",
    "key_codes",
    "latest_rows",
    "latest_status_events",
    "link_edges",
    "near_duplicate_pairs",
    "new_eval_salt",
    "pack_fingerprint",
    "plan_links",
    "sorted_index",
    "unpack_fingerprint",
]
