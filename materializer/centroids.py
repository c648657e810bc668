"""SemDeDup's k-means centroids: fitted once per (embedding model, dedup config), versioned.

Fitting k-means on each cut's candidates made a clip's cluster depend on which other
clips were candidates, so a cut at ``latest`` could drop a clip no commit touched. Here
the centroids are a recorded fact instead:

* **Config.** :class:`CentroidConfig` is the embedding model and the clustering (exactly
  one of ``num_clusters`` and ``cluster_size``) plus the fixed algorithm parameters
  (spherical k-means, seed, iterations, sample per cluster); its SHA-256 names the
  family. The recipe's own seed is not part of it: reshuffling a plan must not move
  clusters.
* **Fit.** :meth:`CentroidStore.fit` reads the model's *train* vectors at one LanceDB
  version, sorted by clip id, takes a seeded sample of at most
  ``FIT_PER_CLUSTER * k`` of them (``k = num_clusters`` or ``ceil(n / cluster_size)``
  over all n train vectors), and runs :func:`fit_centroids`. The fit is a pure function
  of (config, vectors at that version).
* **Storage.** Under ``dedup/centroids/<config sha256[:32]>/``: the matrix as
  ``<sha256>.npy`` (a content-addressed named key, float32 ``(k, dim)``, checked on
  every read) and the version record ``v{N:06d}.json`` (create-only: two fitters racing
  for N get one winner; the loser of a first fit adopts the winner's). Named keys are
  never collected by ``vidlake gc``.
* **Use.** A cut's pin records the version (``centroids/<model>``, see
  :mod:`catalog.pins`) and ``snapshot.json`` the record (``semantic_dedup``). The first
  cut that needs centroids fits version 1 (:meth:`CentroidStore.ensure`); later cuts
  reuse the latest version. A refit is explicit (``vidlake dedup fit``: version N+1).
* **Assignment.** :func:`assign_clusters` is a pure per-row function of (vector,
  centroids): a row's cluster does not depend on the other rows, the block it is in or
  the partition that computes it, so partitioning a cut by cluster is exact.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from catalog.errors import Conflict, IntegrityError, InvalidInput, NotFound
from catalog.hashing import sha256_bytes

if TYPE_CHECKING:
    from catalog.embeddings import EmbeddingIndex
    from catalog.objects import ObjectStore
    from materializer.recipe.selection import SemanticDedup

__all__ = [
    "ALGORITHM",
    "CentroidConfig",
    "CentroidSet",
    "CentroidStore",
    "assign_clusters",
    "fit_centroids",
    "unit_vectors",
]

ALGORITHM = "spherical-kmeans/1"
FIT_SEED = 0
ITERATIONS = 10
FIT_PER_CLUSTER = 256
RECORD_FORMAT = "vidlake.centroids/1"
_PREFIX = "dedup/centroids"
_BLOCK = 2048
# A float32 dot product of unit vectors is off by at most dim * 2^-24 in any summation
# order (BLAS blocking, FMA, threads); rows whose best two similarities are closer than
# twice that, doubled for safety, are decided again in float64 by a per-row reduction.
_TIE_ULPS = 4.0 * 2.0**-24


@dataclass(frozen=True)
class CentroidConfig:
    """What a centroid family is fitted for: the model and the clustering."""

    embedding_model: str
    num_clusters: int | None = None
    cluster_size: int | None = None

    def __post_init__(self) -> None:
        if not self.embedding_model:
            raise InvalidInput(
                "a centroid config names an embedding model", field="embedding_model"
            )
        chosen = [v for v in (self.num_clusters, self.cluster_size) if v is not None]
        if len(chosen) != 1 or isinstance(chosen[0], bool) or not isinstance(chosen[0], int):
            raise InvalidInput(
                "set exactly one of num_clusters and cluster_size (a positive integer)",
                field="num_clusters",
            )
        if chosen[0] < 1:
            raise InvalidInput(f"the cluster count or size must be >= 1, got {chosen[0]}")

    @classmethod
    def of(cls, dedup: SemanticDedup) -> CentroidConfig:
        """The config of a recipe's ``semantic_dedup``."""
        return cls(dedup.embedding_model, dedup.num_clusters, dedup.cluster_size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": ALGORITHM,
            "embedding_model": self.embedding_model,
            "num_clusters": self.num_clusters,
            "cluster_size": self.cluster_size,
            "seed": FIT_SEED,
            "iterations": ITERATIONS,
            "fit_per_cluster": FIT_PER_CLUSTER,
        }

    @property
    def sha256(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def prefix(self) -> str:
        """The named-key folder of this family (``dedup/centroids/<sha[:32]>/``)."""
        return f"{_PREFIX}/{self.sha256[:32]}/"

    def clusters_for(self, population: int) -> int:
        """k for ``population`` train vectors (never more than there are vectors)."""
        k = self.num_clusters or math.ceil(population / (self.cluster_size or 1))
        return max(1, min(k, population))


@dataclass(frozen=True)
class CentroidSet:
    """One fitted version: the matrix and its record."""

    config: CentroidConfig
    version: int
    centroids: NDArray[np.float32]
    record: Mapping[str, Any]

    @property
    def sha256(self) -> str:
        return str(self.record["centroids_sha256"])

    def facts(self) -> dict[str, Any]:
        """snapshot.json's ``semantic_dedup`` entry."""
        return {
            "embedding_model": self.config.embedding_model,
            "centroids_version": self.version,
            "config_sha256": self.config.sha256,
            "centroids_sha256": self.sha256,
            "centroids_key": self.record["centroids_key"],
            "num_clusters": int(self.centroids.shape[0]),
            "fitted_on": dict(self.record["fitted_on"]),
        }


def unit_vectors(vectors: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
    """Rows scaled to unit length in float64, then float32 (a zero row stays zero)."""
    mat = np.asarray(vectors, dtype=np.float64)
    if mat.ndim != 2:
        raise InvalidInput(f"vectors must be a 2-d array, got shape {mat.shape}", field="vectors")
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: NDArray[np.float32] = (mat / norms).astype(np.float32)
    return unit


def assign_clusters(
    vectors: NDArray[np.floating[Any]], centroids: NDArray[np.floating[Any]]
) -> NDArray[np.int64]:
    """The cluster of each row: the centroid of highest cosine similarity (lowest index
    on a tie). Pure per row: the answer for a vector is the same in any batch.

    Args:
        vectors: ``(n, dim)`` embeddings (any scale; normalised here).
        centroids: ``(k, dim)`` unit centroids (a :class:`CentroidSet`'s).
    """
    unit = unit_vectors(vectors)
    cents = np.asarray(centroids, dtype=np.float32)
    if cents.ndim != 2 or cents.shape[0] == 0 or unit.shape[1] != cents.shape[1]:
        raise InvalidInput(
            f"vectors {unit.shape} and centroids {cents.shape} must share the dimension",
            field="vectors",
        )
    n, k = unit.shape[0], cents.shape[0]
    labels = np.zeros(n, dtype=np.int64)
    if k == 1:
        return labels
    exact = cents.astype(np.float64)
    margin = _TIE_ULPS * unit.shape[1]
    for start in range(0, n, _BLOCK):
        block = unit[start : start + _BLOCK]
        sims = block @ cents.T
        best = np.argmax(sims, axis=1)
        rows = np.arange(len(block))
        first = sims[rows, best].copy()
        sims[rows, best] = -np.inf  # the runner-up: a max, not a partition (10x cheaper)
        close = np.flatnonzero(first - sims.max(axis=1) <= margin)
        if close.size:
            # einsum without optimisation is a per-row loop (no BLAS blocking), so the
            # float64 sums of a row never depend on its neighbours.
            again = np.einsum("ij,kj->ik", block[close].astype(np.float64), exact)
            best[close] = np.argmax(again, axis=1)
        labels[start : start + len(block)] = best
    return labels


def fit_centroids(
    vectors: NDArray[np.floating[Any]], k: int, *, seed: int = FIT_SEED
) -> NDArray[np.float32]:
    """Spherical k-means (seeded init from the rows, fixed iteration count): ``(k, dim)``
    unit centroids. An empty cluster keeps its previous centroid."""
    unit = unit_vectors(vectors)
    n = unit.shape[0]
    if not 1 <= k <= n:
        raise InvalidInput(f"cannot fit {k} centroids to {n} vectors", field="num_clusters")
    rng = np.random.default_rng(seed)
    cents = unit[np.sort(rng.choice(n, size=k, replace=False))].copy()
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(ITERATIONS):
        for start in range(0, n, _BLOCK):
            labels[start : start + _BLOCK] = np.argmax(unit[start : start + _BLOCK] @ cents.T, 1)
        sums = np.zeros(cents.shape, dtype=np.float64)
        np.add.at(sums, labels, unit)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        empty = norms[:, 0] == 0
        sums[~empty] /= norms[~empty]
        sums[empty] = cents[empty]
        cents = sums.astype(np.float32)
    return cents


def _npy(matrix: NDArray[np.float32]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(matrix, dtype="<f4"), allow_pickle=False)
    return buf.getvalue()


class CentroidStore:
    """Centroid versions in an object store's named keys (see the module docstring)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def versions(self, config: CentroidConfig) -> list[int]:
        """Fitted versions of ``config``, ascending."""
        out = []
        for key in self.store.list_keys(config.prefix):
            name = key.rsplit("/", 1)[-1]
            if name.startswith("v") and name.endswith(".json") and name[1:-5].isdigit():
                out.append(int(name[1:-5]))
        return sorted(out)

    def latest(self, config: CentroidConfig) -> CentroidSet | None:
        """The newest version of ``config``, None before the first fit."""
        found = self.versions(config)
        return self.get(config, found[-1]) if found else None

    def get(self, config: CentroidConfig, version: int) -> CentroidSet:
        """Version ``version`` of ``config``, its matrix checked against its SHA-256.

        Raises:
            NotFound: no such version.
            IntegrityError: the record or its matrix is damaged or missing (named), or
                the matrix disagrees with its record (hash, dtype, shape, NaN).
        """
        try:
            raw = self.store.get_key(f"{config.prefix}v{version:06d}.json")
        except NotFound:
            known = self.versions(config)
            raise NotFound(
                f"no centroids version {version} for {config.embedding_model!r} with this "
                f"dedup config (fitted: {known or 'none'}); fit them with `vidlake dedup fit`",
                version=version,
                known=known,
            ) from None
        record = _record(raw, f"{config.prefix}v{version:06d}.json")
        key = record["centroids_key"]
        try:
            data = self.store.get_key(key)
        except NotFound:
            raise IntegrityError(
                f"centroids {key} (version {version} of {config.embedding_model!r}) are "
                "missing from the object store; refit with `vidlake dedup fit`",
                key=key,
            ) from None
        if sha256_bytes(data) != record["centroids_sha256"]:
            raise IntegrityError(f"centroids {key} do not hash to their record", key=key)
        return CentroidSet(config, version, _matrix(data, key, record["shape"]), record)

    def ensure(self, config: CentroidConfig, index: EmbeddingIndex) -> CentroidSet:
        """The latest version, or version 1 fitted now from ``index`` (at its version)
        when there is none; a racing first fit's winner is adopted."""
        found = self.latest(config)
        if found is not None:
            return found
        try:
            return self.fit(config, index, expect_version=1)
        except Conflict:
            return self.get(config, 1)

    def fit(
        self, config: CentroidConfig, index: EmbeddingIndex, *, expect_version: int | None = None
    ) -> CentroidSet:
        """Fit a new version from ``index``'s train vectors (at the index's version).

        Raises:
            InvalidInput: the model has no train vectors there.
            Conflict: another fit claimed the version first.
        """
        matrix, fitted_on = _fit_from(config, index)
        data = _npy(matrix)
        sha = sha256_bytes(data)
        blob = f"{config.prefix}{sha}.npy"
        if not self.store.key_exists(blob):
            # A racer's key of this name holds the same bytes (checked on every read).
            with contextlib.suppress(Conflict):
                self.store.put_key(blob, data)
        known = self.versions(config)
        version = expect_version or (known[-1] + 1 if known else 1)
        record = {
            "format": RECORD_FORMAT,
            "version": version,
            "config": config.to_dict(),
            "config_sha256": config.sha256,
            "centroids_key": blob,
            "centroids_sha256": sha,
            "shape": list(matrix.shape),
            "fitted_on": fitted_on,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        body = json.dumps(record, sort_keys=True, indent=1).encode()
        try:
            self.store.put_key(f"{config.prefix}v{version:06d}.json", body)
        except Conflict:
            raise Conflict(
                f"centroids version {version} of {config.embedding_model!r} was fitted "
                "first by another process; read it, or fit again for a new version",
                version=version,
            ) from None
        return CentroidSet(config, version, matrix, record)


def _record(raw: bytes, key: str) -> dict[str, Any]:
    """A version record, its fields checked (IntegrityError naming ``key`` otherwise)."""
    try:
        record = json.loads(raw)
        ok = isinstance(record, dict) and all(
            isinstance(record.get(f), str) for f in ("centroids_key", "centroids_sha256")
        )
        shape = record.get("shape") if ok else None
        ok = ok and isinstance(shape, list) and len(shape) == 2
    except (ValueError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise IntegrityError(f"centroids record {key} is damaged (not a version record)", key=key)
    return dict(record)


def _matrix(data: bytes, key: str, shape: list[Any]) -> NDArray[np.float32]:
    """The stored matrix: a float32 ``(k, dim)`` array of the record's shape, finite."""
    try:
        matrix = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise IntegrityError(f"centroids {key} are not a .npy matrix: {exc}", key=key) from None
    if matrix.dtype != np.float32 or list(matrix.shape) != shape:
        raise IntegrityError(
            f"centroids {key}: {matrix.dtype} {list(matrix.shape)}, the record says "
            f"float32 {shape}",
            key=key,
        )
    if not np.isfinite(matrix).all():
        raise IntegrityError(f"centroids {key} hold NaN or infinite values", key=key)
    return np.asarray(matrix, dtype=np.float32)


def _fit_from(
    config: CentroidConfig, index: EmbeddingIndex
) -> tuple[NDArray[np.float32], dict[str, Any]]:
    ids = sorted(index.clip_ids(split="train").to_pylist())
    if not ids:
        raise InvalidInput(
            f"embedding model {config.embedding_model!r} has no train vectors at LanceDB "
            f"version {index.version}: nothing to fit semantic-dedup centroids to",
            field="semantic_dedup.embedding_model",
        )
    population = len(ids)
    k = config.clusters_for(population)
    if population > FIT_PER_CLUSTER * k:
        rng = np.random.default_rng(FIT_SEED)
        picked = np.sort(rng.choice(population, size=FIT_PER_CLUSTER * k, replace=False))
        ids = [ids[i] for i in picked]
    found, vectors = index.vectors(ids)
    fitted_on = {
        "embedding_model": config.embedding_model,
        "lance_version": index.version,
        "train_vectors": population,
        "sample": len(found),
    }
    return fit_centroids(vectors, min(k, len(found))), fitted_on
