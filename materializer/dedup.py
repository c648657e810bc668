"""Embedding-based drops: eval decontamination and SemDeDup-style semantic dedup.

Both read vectors from :class:`catalog.embeddings.EmbeddingIndex` (at the pin's
LanceDB version) and work in numpy with exact, blocked matrix products, so they are
deterministic for a given seed.

Decontamination (:func:`decontaminate`) compares the train candidates with the eval
clips *of the catalog at the pin* (the Iceberg ``split``), not with whatever the
embedding table's own ``split`` column says, and reports how many of those eval
clips had a vector: a clip without one cannot be checked against.

SemDeDup (Abbas et al., 2023): cluster the embeddings with spherical k-means, order
each cluster by the recipe's ``rank_by`` score (best first, ties by clip id), and drop
a clip when at least ``keep_per_cluster`` *earlier* clips of its cluster have cosine
similarity ``>= 1 - eps`` to it. With ``keep_per_cluster = 1`` this is the paper's
rule: of every group of near-duplicates, the best-scored survives. Cost: k-means is
``iterations * n * k * dim``; the in-cluster pass is ``sum(m_c^2) * dim`` for cluster
sizes ``m_c`` (about ``n * cluster_size * dim``), in fixed-size blocks of memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from catalog.vectors import pairs_within_vectors

if TYPE_CHECKING:
    from catalog.embeddings import EmbeddingIndex

__all__ = ["Decontamination", "decontaminate", "kmeans_assign", "semdedup", "semdedup_vectors"]

_BLOCK = 2048
_KMEANS_ITERATIONS = 10


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
    keep_per_cluster: int = 1,
    cluster_size: int | None = None,
    num_clusters: int | None = None,
    seed: int = 0,
) -> set[str]:
    """Clip ids SemDeDup drops. Clips without an embedding are kept.

    Args:
        index: Where the vectors are.
        clip_ids: Candidate clips (unique).
        scores: ``rank_by`` score per clip id, higher is better (NaN-free).
        eps: Cosine-distance threshold: similarity ``>= 1 - eps`` is a duplicate.
        keep_per_cluster: How many near-duplicates of one another may stay.
        cluster_size: Target clip count per k-means cluster (default 5000).
        num_clusters: Explicit cluster count (overrides ``cluster_size``).
        seed: Seeds k-means.
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
        keep_per_cluster=keep_per_cluster,
        cluster_size=cluster_size,
        num_clusters=num_clusters,
        seed=seed,
    )
    return {found[i] for i in np.flatnonzero(drop)}


def semdedup_vectors(
    ids: Sequence[str],
    vectors: NDArray[np.floating[Any]],
    scores: NDArray[np.float64],
    *,
    eps: float,
    keep_per_cluster: int = 1,
    cluster_size: int | None = None,
    num_clusters: int | None = None,
    seed: int = 0,
) -> NDArray[np.bool_]:
    """The pure core of :func:`semdedup`: a drop mask aligned with ``ids``."""
    n = len(ids)
    unit = _normalise(vectors)
    k = num_clusters or max(1, math.ceil(n / (cluster_size or 5000)))
    labels = kmeans_assign(unit, min(k, n), seed)
    drop = np.zeros(n, dtype=bool)
    id_arr = np.asarray(ids, dtype=object)
    threshold = np.float32(1.0 - eps)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        # Best score first; ties by clip id so the order is total and stable.
        order = members[np.lexsort((id_arr[members], -scores[members]))]
        counts = _earlier_similar_counts(unit[order], threshold)
        drop[order[counts >= keep_per_cluster]] = True
    return drop


def kmeans_assign(unit: NDArray[np.float32], k: int, seed: int) -> NDArray[np.int64]:
    """Spherical k-means labels (seeded, fixed iteration count, exact assignment)."""
    n = unit.shape[0]
    if k <= 1:
        return np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    centroids = unit[np.sort(rng.choice(n, size=k, replace=False))].copy()
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(_KMEANS_ITERATIONS):
        for start in range(0, n, _BLOCK):
            labels[start : start + _BLOCK] = np.argmax(
                unit[start : start + _BLOCK] @ centroids.T, axis=1
            )
        sums = np.zeros_like(centroids, dtype=np.float64)
        np.add.at(sums, labels, unit)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        empty = norms[:, 0] == 0
        sums[~empty] /= norms[~empty]
        sums[empty] = centroids[empty]  # an empty cluster keeps its centroid
        centroids = sums.astype(np.float32)
    return labels


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


def _normalise(vectors: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
    mat = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: NDArray[np.float32] = (mat / norms).astype(np.float32)
    return unit
