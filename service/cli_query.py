"""``vidlake sql``, ``lineage``, ``step`` and ``jobs``: read-only questions about the
catalog, the snapshots and the service's background work."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, err, new_table, open_client, out

__all__ = ["COMMANDS", "jobs", "lineage", "sql", "step"]


def sql(
    query: Annotated[str, typer.Argument(help="One read-only SELECT/WITH statement (DuckDB).")],
    snapshot: Annotated[
        int | None, typer.Option(help="Read at the pin snapshot V was cut from.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Row limit (at most the server's).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Query the catalog tables (and the `manifests` view) read-only."""
    with open_client(url, token) as client:
        result = client.sql(query, snapshot=snapshot, limit=limit)

    def render(data: dict[str, Any]) -> None:
        _print_result([c["name"] for c in data["columns"]], data["rows"])
        if data["truncated"]:
            err.print(f"[yellow]truncated at {data['row_count']} rows[/yellow]")

    emit(result, as_json, render)


def _print_result(headers: list[str], rows: list[list[Any]]) -> None:
    """The rows as a table that fits the terminal: cells are cut, headers never."""
    from service.cli_render import clip, fit_widths, table_width

    cells = [["" if v is None else str(v) for v in row] for row in rows]
    widths = fit_widths(headers, cells, out.width)
    table = new_table()
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, min_width=width, max_width=width, no_wrap=True)
    for row in cells:
        table.add_row(*[clip(c, w) for c, w in zip(row, widths, strict=True)])
    out.print(table, width=max(out.width, table_width(widths)), crop=False)


def lineage(
    clip_id: Annotated[str, typer.Argument(help="The clip id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Everything about one clip: asset, licence, scores, captions, latents, snapshots/steps."""
    with open_client(url, token) as client:
        emit(client.lineage(clip_id), True)


def step(
    version: int,
    step_number: Annotated[int, typer.Argument(metavar="STEP", help="Global step number.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The exact samples of one step, with a lineage summary (forensics after a loss spike)."""
    with open_client(url, token) as client:
        data = client.step(version, step_number)

    def render(d: dict[str, Any]) -> None:
        table = new_table(
            "pos",
            "row",
            "clip",
            "asset",
            "stream",
            "tier",
            "source",
            "license",
            title=f"v{d['version']} step {d['step']} (phase {d['phase']}, bucket {d['bucket']}, "
            f"{d['count']} samples, {d['skipped']} skipped)",
        )
        for smp in d["samples"]:
            table.add_row(
                str(smp["position"]),
                str(smp["row"]),
                smp["clip_id"][:16],
                smp["asset_id"][:12],
                smp["stream"],
                str(smp.get("tier")),
                str(smp.get("source")),
                str(smp.get("license_id")),
            )
        out.print(table)

    emit(data, as_json, render)


def jobs(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Background jobs (cuts, erasures) with state and progress."""
    with open_client(url, token) as client:
        data = client.jobs()

    def render(d: dict[str, Any]) -> None:
        table = new_table("id", "kind", "state", "stage", "progress", "created", "error")
        for j in d["data"]:
            table.add_row(
                j["id"],
                j["kind"],
                j["state"],
                str(j.get("stage") or ""),
                f"{100 * j['progress']:.0f}%",
                j["created_at"],
                (j.get("error") or {}).get("message", "") if j.get("error") else "",
            )
        out.print(table)

    emit(data, as_json, render)


#: In ``vidlake --help`` order.
COMMANDS = (sql, lineage, step, jobs)
