"""Semantic-dedup centroids as the service answers them (:mod:`materializer.centroids`).

:func:`fit_centroids` fits a *new* version of a (model, clustering) family from the
model's train vectors at its current LanceDB version: an explicit refit (a cut reuses
the latest version and fits only version 1, when there is none). It runs in the
request (the fit reads at most ``256 * k`` vectors); at large k fit once, ahead of the
cuts. :func:`list_centroids` lists a family's versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from materializer.centroids import CentroidConfig, CentroidSet, CentroidStore

if TYPE_CHECKING:
    from service.deps import Services

__all__ = [
    "CentroidsCreate",
    "CentroidsPublic",
    "CentroidsVersions",
    "fit_centroids",
    "list_centroids",
]


class CentroidsCreate(BaseModel):
    """A centroid family: the embedding model and exactly one of the two clusterings
    (as a recipe's ``semantic_dedup`` names them)."""

    model_config = {"extra": "forbid"}

    embedding_model: str = Field(min_length=1, max_length=200)
    num_clusters: int | None = Field(None, ge=1)
    cluster_size: int | None = Field(None, ge=1)


class CentroidsPublic(BaseModel):
    """One fitted version."""

    embedding_model: str
    version: int
    config_sha256: str
    centroids_sha256: str
    centroids_key: str = Field(description="named key of the float32 (k, dim) .npy matrix")
    num_clusters: int
    dim: int
    fitted_on: dict[str, Any] = Field(
        description="lance_version, train_vectors (population), sample (vectors fitted)"
    )
    created_at: str


class CentroidsVersions(BaseModel):
    """A family's versions, oldest first."""

    data: list[CentroidsPublic]
    count: int


def _config(body: CentroidsCreate) -> CentroidConfig:
    return CentroidConfig(body.embedding_model, body.num_clusters, body.cluster_size)


def _public(found: CentroidSet) -> CentroidsPublic:
    facts = found.facts()
    return CentroidsPublic(
        embedding_model=found.config.embedding_model,
        version=found.version,
        config_sha256=facts["config_sha256"],
        centroids_sha256=facts["centroids_sha256"],
        centroids_key=facts["centroids_key"],
        num_clusters=facts["num_clusters"],
        dim=int(found.centroids.shape[1]),
        fitted_on=facts["fitted_on"],
        created_at=str(found.record.get("created_at", "")),
    )


def fit_centroids(services: Services, body: CentroidsCreate) -> CentroidsPublic:
    """Fit the next version of the family from the model's current train vectors."""
    config = _config(body)
    catalog = services.catalog
    store = CentroidStore(catalog.objects)
    return _public(store.fit(config, catalog.embeddings(config.embedding_model)))


def list_centroids(services: Services, body: CentroidsCreate) -> CentroidsVersions:
    """Every fitted version of the family."""
    config = _config(body)
    store = CentroidStore(services.catalog.objects)
    found = [_public(store.get(config, v)) for v in store.versions(config)]
    return CentroidsVersions(data=found, count=len(found))
