"""``vidlake cache …``: the node cache of latents that the loader fills (loader side)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli_common import emit
from service.settings import get_settings

__all__ = ["cache_app"]

cache_app = typer.Typer(help="The node cache of latents (loader side).", no_args_is_help=True)

CacheDir = Annotated[
    Path | None, typer.Option("--dir", help="Cache directory (default from settings).")
]
Budget = Annotated[
    int | None, typer.Option("--budget", help="Budget in bytes (must match the cache's).")
]


def _cache(directory: Path | None, budget: int | None) -> Any:
    from loader.cache import NodeCache

    settings = get_settings()
    root = directory or Path(settings.resolved()["cache_dir"])
    return NodeCache(root, budget or settings.cache_budget_bytes)


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
