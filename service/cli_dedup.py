"""``vidlake dedup …``: the centroids semantic dedup assigns clips to.

``fit`` fits a new version of a (model, clustering) family from the model's current
train vectors: the explicit refit (a cut fits version 1 itself when there is none and
otherwise reuses the latest, so decisions never move unless someone refits). ``list``
shows a family's versions. Cuts record the version they used in their pin
(``centroids/<model>``) and in ``snapshot.json`` (``semantic_dedup``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, open_client, out

__all__ = ["dedup_app"]

dedup_app = typer.Typer(
    help="Semantic-dedup centroids: fitted once per model and config, versioned.",
    no_args_is_help=True,
)

ModelOpt = Annotated[
    str, typer.Option("--model", help="Embedding model version (the recipe's embedding_model).")
]
ClustersOpt = Annotated[
    int | None,
    typer.Option("--num-clusters", min=1, help="k, as the recipe's semantic_dedup.num_clusters."),
]
SizeOpt = Annotated[
    int | None,
    typer.Option(
        "--cluster-size", min=1, help="Mean clips per cluster, as semantic_dedup.cluster_size."
    ),
]


def _line(v: dict[str, Any]) -> str:
    fitted = v["fitted_on"]
    return (
        f"v{v['version']}  k={v['num_clusters']} dim={v['dim']}  "
        f"fitted on LanceDB version {fitted.get('lance_version')} "
        f"({fitted.get('sample')} of {fitted.get('train_vectors')} train vectors)  "
        f"sha256 {v['centroids_sha256'][:16]}…  {v['created_at']}"
    )


def _render_versions(data: dict[str, Any]) -> None:
    for v in data["data"]:
        out.print(_line(v))
    if not data["data"]:
        out.print("no centroids fitted yet (the first cut that needs them fits version 1)")


@dedup_app.command("fit")
def fit(
    model: ModelOpt,
    num_clusters: ClustersOpt = None,
    cluster_size: SizeOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit a new centroid version from the model's current train vectors; later cuts
    at latest use it."""
    with open_client(url, token) as client:
        found = client.fit_centroids(model, num_clusters=num_clusters, cluster_size=cluster_size)
        emit(found, as_json, lambda v: out.print(_line(v)))


@dedup_app.command("list")
def list_versions(
    model: ModelOpt,
    num_clusters: ClustersOpt = None,
    cluster_size: SizeOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The fitted centroid versions of one (model, clustering)."""
    with open_client(url, token) as client:
        found = client.centroids(model, num_clusters=num_clusters, cluster_size=cluster_size)
        emit(found, as_json, _render_versions)
