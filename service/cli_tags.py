"""``vidlake tags …``: the ``vidlake-v{N}`` Iceberg tags of registered versions.

``list`` shows every table's tags (what Spark, Trino or DuckDB read version ``N`` by);
``backfill`` tags every registered version as the registry says (pinned: forever;
unpinned: until the retention after registration or the last unpin), which an
upgrade runs once and which repairs a crash between a publish and its tagging.
"""

from __future__ import annotations

from typing import Any

import typer

from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, open_client, out

__all__ = ["tags_app"]

tags_app = typer.Typer(
    help="Iceberg tags vidlake-v{N} of registered versions.", no_args_is_help=True
)


def _render_tags(data: dict[str, Any]) -> None:
    for table, tags in data["tables"].items():
        listed = ", ".join(
            f"v{v}@{sid}" for v, sid in sorted(tags.items(), key=lambda i: int(i[0]))
        )
        out.print(f"{table:<14} {listed or '-'}")


def _render_backfill(data: dict[str, Any]) -> None:
    counts = {k: sum(len(v) for v in data[k].values()) for k in ("created", "updated", "missing")}
    out.print(
        f"{data['versions']} versions: {counts['created']} tags created, "
        f"{counts['updated']} updated, {counts['missing']} not made (snapshot gone)"
    )


@tags_app.command("list")
def list_tags(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Every table's version tags: vN@snapshot-id."""
    with open_client(url, token) as client:
        emit(client.tags(), as_json, _render_tags)


@tags_app.command("backfill")
def backfill(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Tag every registered version's snapshots (idempotent; run once after upgrading)."""
    with open_client(url, token) as client:
        emit(client.backfill_tags(), as_json, _render_backfill)
