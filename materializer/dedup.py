"""Embedding-based drops: eval decontamination and SemDeDup-style semantic dedup.

Both read vectors from :class:`catalog.embeddings.EmbeddingIndex` (at the pin's
LanceDB version) and work in numpy with exact, blocked matrix products, so they are
deterministic for a given seed.

Decontamination (:func:`decontaminate`) compares the train candidates with the eval
clips *of the catalog at the pin* (the Iceberg ``split``), not with whatever the
embedding table's own ``split`` column says, and reports how many of those eval
clips had a vector: a clip without one cannot be checked against.

SemDeDup (Abbas et al., 2023): assign each clip to the nearest of a *fitted* set of
spherical k-means centroids (:mod:`materializer.centroids`: fitted once per embedding
model and dedup config, versioned, recorded in the pin, never refitted silently), order
each cluster by the recipe's ``rank_by`` score (best first, ties by clip id), and drop
a clip when at least ``keep_per_cluster`` *earlier* clips of its cluster have cosine
similarity ``>= 1 - eps`` to it. With ``keep_per_cluster = 1`` this is the paper's
rule: of every group of near-duplicates, the best-scored survives. A clip's cluster
depends only on its vector, so decisions change only in clusters that gained or lost
members. Cost: assignment is ``n * k * dim``; the in-cluster pass is
``sum(m_c^2) * dim`` for cluster sizes ``m_c``, in fixed-size blocks of memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from catalog.vectors import pairs_within_vectors
from materializer.centroids import assign_clusters, unit_vectors

if TYPE_CHECKING:
    from catalog.embeddings import EmbeddingIndex

__all__ = ["Decontamination", "decontaminate", "semdedup", "semdedup_vectors"]

_BLOCK = 2048


@dataclass(frozen=True)
class Decontamination:
    """What :func:`decontaminate` checked and found.

    Attributes:
        dropped: Train clip ids within the distance of an eval clip.
        eval_clips: Eval clips at the pin.
        eval_clips_with_vectors: Those with a vector in the index.
        train_clips: Train candidates asked about.
        train_clips_checked: Those with a vector (compared with every eval vector).
    """

    dropped: frozenset[str]
    eval_clips: int
    eval_clips_with_vectors: int
    train_clips: int
    train_clips_checked: int

    @property
    def coverage(self) -> float:
        """Eval clips with a vector / eval clips (1.0 when there are none)."""
        return self.eval_clips_with_vectors / self.eval_clips if self.eval_clips else 1.0


def decontaminate(
    index: EmbeddingIndex,
    train_ids: Sequence[str],
    eval_ids: Sequence[str],
    max_distance: float,
) -> Decontamination:
    """Train clips within cosine ``max_distance`` of any of ``eval_ids``' vectors.

    Args:
        index: The embeddings, at the pinned version.
        train_ids: Candidate clips (unique).
        eval_ids: Every eval clip of the catalog at the pin (unique).
        max_distance: Cosine distance threshold (inclusive).
    """
    # One read of the table for both sets (a large id set is a full scan).
    evals = sorted(set(eval_ids))
    eval_set = set(evals)
    train = [c for c in train_ids if c not in eval_set]
    ids, both = index.vectors([*train, *evals])
    # ``vectors`` keeps the order asked, so the train clips found come first and the
    # eval clips found are among the last ``len(evals)``.
    tail = ids[max(0, len(ids) - len(evals)) :]
    k = len(ids) - sum(1 for c in tail if c in eval_set)
    found, vectors = ids[:k], both[:k]
    eval_found, eval_vectors = ids[k:], both[k:]
    dropped: frozenset[str] = frozenset()
    if found and eval_found:
        pairs = pairs_within_vectors(
            found, vectors, max_distance, other_ids=eval_found, other_vectors=eval_vectors
        )
        dropped = frozenset(pairs["clip_id"].to_pylist())
    return Decontamination(
        dropped=dropped,
        eval_clips=len(evals),
        eval_clips_with_vectors=len(eval_found),
        train_clips=len(train),
        train_clips_checked=len(found),
    )


def semdedup(
    index: EmbeddingIndex,
    clip_ids: Sequence[str],
    scores: NDArray[np.float64],
    *,
    eps: float,
    centroids: NDArray[np.floating[Any]],
    keep_per_cluster: int = 1,
) -> set[str]:
    """Clip ids SemDeDup drops. Clips without an embedding are kept.

    Args:
        index: Where the vectors are.
        clip_ids: Candidate clips (unique).
        scores: ``rank_by`` score per clip id, higher is better (NaN-free).
        eps: Cosine-distance threshold: similarity ``>= 1 - eps`` is a duplicate.
        centroids: The fitted cluster centroids (:mod:`materializer.centroids`).
        keep_per_cluster: How many near-duplicates of one another may stay.
    """
    found, vectors = index.vectors(clip_ids)
    if not found:
        return set()
    position = {cid: i for i, cid in enumerate(clip_ids)}
    found_scores = np.asarray([scores[position[c]] for c in found], dtype=np.float64)
    drop = semdedup_vectors(
        found,
        vectors,
        found_scores,
        eps=eps,
        centroids=centroids,
        keep_per_cluster=keep_per_cluster,
    )
    return {found[i] for i in np.flatnonzero(drop)}


def semdedup_vectors(
    ids: Sequence[str],
    vectors: NDArray[np.floating[Any]],
    scores: NDArray[np.float64],
    *,
    eps: float,
    centroids: NDArray[np.floating[Any]],
    keep_per_cluster: int = 1,
) -> NDArray[np.bool_]:
    """The pure core of :func:`semdedup`: a drop mask aligned with ``ids``.

    Each clip's cluster is :func:`~materializer.centroids.assign_clusters` of its own
    vector; each cluster is then decided from its members alone, so a cluster whose
    members did not change gets the same decisions in any cut and any partition.
    """
    unit = unit_vectors(vectors)
    labels = assign_clusters(unit, centroids)
    drop = np.zeros(len(ids), dtype=bool)
    id_arr = np.asarray(ids, dtype=object)
    threshold = np.float32(1.0 - eps)
    # Cluster, then best score first, then clip id: a total order, and one sort.
    order = np.lexsort((id_arr, -scores, labels))
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    for members in np.split(order, bounds):
        counts = _earlier_similar_counts(unit[members], threshold)
        drop[members[counts >= keep_per_cluster]] = True
    return drop


def _earlier_similar_counts(unit: NDArray[np.float32], threshold: np.float32) -> NDArray[np.int64]:
    """For each row j, how many rows i < j have ``unit[i] . unit[j] >= threshold``."""
    m = unit.shape[0]
    counts = np.zeros(m, dtype=np.int64)
    for j0 in range(0, m, _BLOCK):
        cols = unit[j0 : j0 + _BLOCK]
        for i0 in range(0, j0 + len(cols), _BLOCK):
            sim = unit[i0 : i0 + _BLOCK] @ cols.T  # rows i, columns j
            hit = sim >= threshold
            # Keep only i < j (global positions).
            i_pos = np.arange(i0, i0 + hit.shape[0])[:, None]
            j_pos = np.arange(j0, j0 + hit.shape[1])[None, :]
            counts[j0 : j0 + hit.shape[1]] += np.sum(hit & (i_pos < j_pos), axis=0)
    return counts
