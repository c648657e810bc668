"""``vidlake import …`` and ``vidlake export …``: TAR-shard training caches."""

from __future__ import annotations

import typer

__all__ = ["export_app", "import_app"]

import_app = typer.Typer(help="Adopt existing datasets by reference.", no_args_is_help=True)
export_app = typer.Typer(help="Write snapshots in other formats.", no_args_is_help=True)
