"""``vidlake drift``, ``reference-slice`` and ``coverage``: the operator's instruments
for scores (filter drift on the frozen reference slice, and how far a backfill of the
score and caption versions a recipe names has got)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from catalog.errors import InvalidInput
from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, err, new_table, open_client, out

__all__ = ["COMMANDS", "coverage", "drift", "reference_slice"]


def _num(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _render_drift(r: dict[str, Any]) -> None:
    out.print(
        f"{r['filter']} {r['version_a']} vs {r['version_b']} on the reference slice: "
        f"{r['slice']['assets']:,} assets, {r['slice']['clips']:,} clips; "
        f"coverage a={r['coverage']['a']:.1%} b={r['coverage']['b']:.1%}"
    )
    out.print(f"KS statistic {_num(r['ks'])}")
    q = r["quantiles"]
    table = new_table("q", r["version_a"], r["version_b"], title="quantiles")
    for i, level in enumerate(q["q"]):
        table.add_row(f"{level:g}", _num(q["a"][i]), _num(q["b"][i]))
    out.print(table)
    kill = r["kill_rate"]
    if kill is not None:
        out.print(
            f"kill rate below {kill['threshold']:g}: a={_num(kill['a'], '.1%')} "
            f"b={_num(kill['b'], '.1%')}"
        )
    if r["kill_rate_over_time"]:
        days = new_table("source", "day", "version", "clips", "kill rate", title="kill rate by day")
        for row in r["kill_rate_over_time"]:
            days.add_row(
                str(row["source"]), row["day"], row["version"], f"{row['clips']:,}",
                f"{row['kill_rate']:.1%}",
            )  # fmt: skip
        out.print(days)


def drift(
    filter_name: Annotated[str, typer.Argument(metavar="FILTER", help="Filter (score) name.")],
    version_a: Annotated[str, typer.Argument(metavar="A", help="Version A (the baseline).")],
    version_b: Annotated[str, typer.Argument(metavar="B", help="Version B.")],
    threshold: Annotated[
        float | None,
        typer.Option(help="Kill threshold: a score below it is killed (kill rates per day)."),
    ] = None,
    bins: Annotated[int, typer.Option(help="Histogram bins (1-1000).")] = 20,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare two versions of a filter on the frozen reference slice: coverage, KS
    statistic, quantiles, histograms (--json), and with --threshold the kill rates,
    overall and per source per day of the score rows."""
    with open_client(url, token) as client:
        found = client.drift(filter_name, version_a, version_b, threshold=threshold, bins=bins)
    emit(found, as_json, _render_drift)


def reference_slice(
    clips: Annotated[bool, typer.Option("--clips", help="List clip ids, not asset ids.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the frozen reference slice (one id a line): every filter version must score
    these clips; a scoring fleet never filters them out."""
    with open_client(url, token) as client:
        found = client.reference_slice(clips=clips)

    def render(r: dict[str, Any]) -> None:
        for member in r["clips"] if clips else r["assets"]:
            print(member)

    emit(found, as_json, render)


def _render_coverage(r: dict[str, Any]) -> None:
    reqs = r["requirements"]
    out.print(f"{r['name']}: {r['clips']:,} candidate clips at the pin")
    table = new_table("stream", "tier", "clips", *(f"missing {q['key']}" for q in reqs))
    for g in r["groups"]:
        table.add_row(
            g["stream"],
            g["tier"],
            f"{g['clips']:,}",
            *(f"{g['missing'][q['key']]:,}" for q in reqs),
        )
    out.print(table)
    for q in reqs:
        need = "" if q["min_coverage"] is None else f" (min {q['min_coverage']:.1%})"
        mark = "[green]ok[/green]" if q["passed"] else "[red]below min_coverage[/red]"
        out.print(
            f"{q['key']}: {q['clips'] - q['missing']:,}/{q['clips']:,} = {q['coverage']:.1%}"
            f"{need} {mark}"
        )


def coverage(
    recipe: Annotated[Path, typer.Argument(help="Recipe file (YAML or JSON).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """How many candidate clips of a recipe (at its pin) lack each score version and the
    caption version it names, per stream and tier, against the recipe's min_coverage.
    Exits 2 when a cut would refuse (a coverage below its minimum)."""
    from materializer.recipe import load_recipe, recipe_notes

    if not recipe.is_file():
        raise InvalidInput(f"{recipe}: no such file", path=str(recipe))
    parsed = load_recipe(recipe)
    for note in recipe_notes(parsed):
        err.print(f"[yellow]warning[/yellow]: {note}")
    with open_client(url, token) as client:
        found = client.coverage(parsed)
    emit(found, as_json, _render_coverage)
    if not found["passed"]:
        raise typer.Exit(2)


COMMANDS = (drift, reference_slice, coverage)
