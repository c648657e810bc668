"""``vidlake cache …``: the node cache of latents that the loader fills (loader side).

``--dir`` is the directory a :class:`~loader.dataset.SnapshotDataset` was given as
``cache_dir`` (its latents live in ``<dir>/latents``), or a node cache's own root.
These commands inspect an existing cache only: a directory holding neither is a
not-found error, never a new empty cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from catalog.errors import NotFound
from service.cli_common import emit

__all__ = ["cache_app"]

cache_app = typer.Typer(
    rich_markup_mode=None, help="The node cache of latents (loader side).", no_args_is_help=True
)

CacheDir = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help="The cache_dir given to SnapshotDataset, or a node cache's root "
        "(default: the settings' cache_dir).",
    ),
]
Budget = Annotated[
    int | None,
    typer.Option("--budget", help="Budget in bytes (default: the cache's stored budget)."),
]
_DB = "cache.db"


def cache_root(directory: Path) -> Path:
    """The node cache under ``directory``: ``<dir>/latents`` (a dataset's cache_dir) or
    ``<dir>`` itself; :class:`NotFound` when neither holds one (nothing is created)."""
    for root in (directory / "latents", directory):
        if (root / _DB).is_file():
            return root
    raise NotFound(
        f"no node cache in {directory}: expected {directory / 'latents' / _DB} "
        f"(the cache_dir given to SnapshotDataset) or {directory / _DB}",
        dir=str(directory),
    )


def _cache(directory: Path | None, budget: int | None) -> Any:
    from loader.cache import NodeCache
    from service.settings import get_settings

    root = cache_root(directory or Path(get_settings().resolved()["cache_dir"]))
    return NodeCache(root, budget)


@cache_app.command("stats")
def cache_stats(directory: CacheDir = None, budget: Budget = None) -> None:
    """Entries, bytes, reservations, hits, misses, evictions."""
    with _cache(directory, budget) as cache:
        emit(cache.stats(), True)


@cache_app.command("verify")
def cache_verify(directory: CacheDir = None, budget: Budget = None) -> None:
    """Re-hash every cached object; drop the corrupt ones."""
    with _cache(directory, budget) as cache:
        emit(cache.verify(), True)


@cache_app.command("gc")
def cache_gc(
    directory: CacheDir = None,
    budget: Budget = None,
    target: Annotated[int | None, typer.Option(help="Evict down to this many bytes.")] = None,
) -> None:
    """Evict unleased objects (LRU) down to a target size."""
    with _cache(directory, budget) as cache:
        emit(cache.gc(target), True)
