"""Near-duplicate groups: links between assets, components and canonical copies.

Linked assets form groups (connected components of every link ever recorded); a group's
canonical copy has the highest bitrate, ties to the smallest asset id
(:func:`plan_links`, :func:`asset_status`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = [
    "Links",
    "bitrates",
    "canonical_indices",
    "connected_components",
    "link_edges",
    "plan_links",
]


def connected_components(n: int, u: NDArray[np.int64], v: NDArray[np.int64]) -> NDArray[np.int64]:
    """Label each of ``n`` nodes with the smallest node index of its component.

    Edges are ``(u[k], v[k])``. Vectorised hook-and-compress: every round hooks each
    edge's larger root under the smaller one, then pointer-jumps to full compression;
    labels only decrease, so it terminates, in a few rounds for real graphs.
    """
    parent = np.arange(n, dtype=np.int64)
    if len(u) == 0:
        return parent
    while True:
        pu, pv = parent[u], parent[v]
        if np.array_equal(pu, pv):
            return parent
        low = np.minimum(pu, pv)
        np.minimum.at(parent, pu, low)
        np.minimum.at(parent, pv, low)
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped


def canonical_indices(
    labels: NDArray[np.int64], bitrate: NDArray[np.float64], asset_ids: NDArray[np.str_]
) -> NDArray[np.int64]:
    """For each node, the index of its component's canonical copy.

    The canonical copy is the member with the highest bitrate (NaN counts as lowest);
    ties go to the smallest asset id. The choice depends only on the members, never on
    their order.
    """
    n = len(labels)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rate = np.where(np.isnan(bitrate), -np.inf, bitrate)
    order = np.lexsort((asset_ids, -rate, labels))
    sorted_labels = labels[order]
    first = np.ones(n, dtype=np.bool_)
    first[1:] = sorted_labels[1:] != sorted_labels[:-1]
    best = order[first]  # canonical of each label, labels ascending
    return best[np.searchsorted(sorted_labels[first], labels)]


@dataclass(frozen=True)
class Links:
    """Near-duplicate links for a batch of new assets (see :func:`plan_links`).

    Node indices: existing assets ``0 .. n_old-1``, then the batch's ``n_old ..``.

    Attributes:
        duplicate_of: Per new asset, the node of its group's canonical copy (-1: it is
            canonical, or unlinked).
        match_owner, match_other: Direct matches, sorted: new asset ``match_owner[k]``
            (0-based in the batch) matched node ``match_other[k]``.
        event_asset, event_canonical: One ``near_duplicate`` event per link made now:
            each new linked asset, and each existing group root a better new copy (or
            a merge of groups) displaced.
    """

    duplicate_of: NDArray[np.int64]
    match_owner: NDArray[np.int64]
    match_other: NDArray[np.int64]
    event_asset: NDArray[np.int64]
    event_canonical: NDArray[np.int64]


def plan_links(
    n_old: int,
    m: int,
    old_edges: tuple[NDArray[np.int64], NDArray[np.int64]],
    with_old: tuple[NDArray[np.int64], NDArray[np.int64]],
    in_batch: tuple[NDArray[np.int64], NDArray[np.int64]],
    rate_of: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    ids_of: Callable[[NDArray[np.int64]], NDArray[np.str_]],
) -> Links:
    """Link ``m`` new assets into the near-duplicate graph.

    Args:
        n_old: Existing assets.
        m: New assets.
        old_edges: Recorded links among existing assets (node pairs).
        with_old: Matches ``(new i, existing j)`` of this batch.
        in_batch: Matches ``(new i, new j)``, ``i < j``.
        rate_of: Bitrate of nodes (NaN: unknown, ranks lowest).
        ids_of: Asset ids of nodes (ties go to the smallest).

    The groups are the connected components of all links; each group's canonical copy
    is :func:`canonical_indices` of its members, so the outcome depends on the set of
    links, never on batch order.
    """
    qi, ri = with_old
    bi, bj = in_batch
    old_u, old_v = old_edges
    new_u = np.concatenate([qi + n_old, bi + n_old])
    new_v = np.concatenate([ri, bj + n_old])
    nodes = np.unique(np.concatenate([old_u, old_v, new_u, new_v]))  # only linked nodes
    rate, ids = rate_of(nodes), ids_of(nodes)

    def canonical(u: NDArray[np.int64], v: NDArray[np.int64]) -> NDArray[np.int64]:
        labels = connected_components(
            len(nodes), np.searchsorted(nodes, u), np.searchsorted(nodes, v)
        )
        return canonical_indices(labels, rate, ids)

    canon_new = canonical(np.concatenate([old_u, new_u]), np.concatenate([old_v, new_v]))
    canon_old = canonical(old_u, old_v)
    here = np.arange(len(nodes))
    is_new = nodes >= n_old
    linked = np.flatnonzero(is_new & (canon_new != here))
    duplicate_of = np.full(m, -1, dtype=np.int64)
    duplicate_of[nodes[linked] - n_old] = nodes[canon_new[linked]]
    relinked = np.flatnonzero(~is_new & (canon_old == here) & (canon_new != here))
    src = np.concatenate([linked, relinked])
    owner = np.concatenate([qi, bi, bj]).astype(np.int64)
    other = np.concatenate([ri, bj + n_old, bi + n_old]).astype(np.int64)
    order = np.lexsort((other, owner))
    return Links(duplicate_of, owner[order], other[order], nodes[src], nodes[canon_new[src]])


def link_edges(
    asset_ids: pa.Array,
    near_duplicates: pa.ChunkedArray | pa.Array,
    duplicate_of: pa.ChunkedArray | pa.Array,
    event_assets: pa.ChunkedArray | pa.Array,
    event_related: pa.ChunkedArray | pa.Array,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Recorded near-duplicate links as edges between rows of ``asset_ids``.

    A link is recorded by an asset's ``near_duplicates`` list, its ``duplicate_of``,
    or a ``near_duplicate`` event (``event_assets[k]`` → ``event_related[k]``). Links to
    unknown assets are dropped.
    """
    flat = pc.list_flatten(near_duplicates)
    parents = np.asarray(
        pc.list_parent_indices(near_duplicates).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    has_dup = np.flatnonzero(np.asarray(pc.is_valid(duplicate_of).to_numpy(zero_copy_only=False)))
    parts = [
        flat,
        pc.take(duplicate_of, pa.array(has_dup, pa.int64())),
        event_assets,
        event_related,
    ]
    names = pa.chunked_array(
        [
            c.cast(pa.large_string())
            for p in parts
            for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])
        ],
        type=pa.large_string(),
    )
    idx = pc.fill_null(pc.index_in(names, value_set=asset_ids.cast(pa.large_string())), -1)
    found = np.asarray(idx.to_numpy(zero_copy_only=False), dtype=np.int64)
    k1, k2, k3 = len(flat), len(has_dup), len(event_assets)
    u = np.concatenate([parents, has_dup, found[k1 + k2 : k1 + k2 + k3]])
    v = np.concatenate([found[:k1], found[k1 : k1 + k2], found[k1 + k2 + k3 :]])
    ok = (u >= 0) & (v >= 0) & (u != v)
    return u[ok], v[ok]


def bitrates(rows: pa.Table) -> NDArray[np.float64]:
    """``probe_bitrate`` as float64 (NaN where null or absent). The cast is unchecked: a
    bitrate above 2**53 loses its last bits, which no near-duplicate rule can notice,
    where a checked cast would refuse every later ingest once such a row is stored."""
    if "probe_bitrate" not in rows.column_names:
        return np.full(rows.num_rows, np.nan)
    column = pc.cast(rows["probe_bitrate"], pa.float64(), safe=False)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
