"""``vidlake storage …``: move what training needs to S3, prove it, restore, clean up."""

from __future__ import annotations

import typer

__all__ = ["storage_app"]

storage_app = typer.Typer(
    help="Storage operations: inventory, verified upload, seal, restore, cleanup-check, watch.",
    no_args_is_help=True,
)
