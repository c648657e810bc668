"""``vidlake cut``, ``validate``, ``snapshots``, ``show``, ``diff``, ``patch``, ``pin``
and ``unpin``: recipes in, numbered snapshot versions out."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from catalog.errors import InvalidInput
from service.cli_common import (
    JsonOpt,
    TokenOpt,
    UrlOpt,
    emit,
    err,
    new_table,
    open_client,
    out,
    progress,
)

if TYPE_CHECKING:
    from materializer.recipe import Recipe

__all__ = ["COMMANDS", "cut", "diff", "patch", "pin", "show", "snapshots", "unpin", "validate"]

RecipeArg = Annotated[Path, typer.Argument(help="Recipe file (YAML or JSON).")]


def _recipe(path: Path) -> Recipe:
    """The recipe at ``path``; what loading changed (normalised weights) is a warning."""
    from materializer.recipe import load_recipe, recipe_notes

    if not path.is_file():
        raise InvalidInput(f"{path}: no such file", path=str(path))
    recipe = load_recipe(path)
    for note in recipe_notes(recipe):
        err.print(f"[yellow]warning[/yellow]: {note}")
    return recipe


def cut(
    recipe: RecipeArg,
    new_version: Annotated[
        bool,
        typer.Option(
            "--new-version",
            help="Publish a new version even if one with the same inputs exists.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Select and plan, print drops, counts, steps, shares and coverage; "
            "publish nothing.",
        ),
    ] = False,
    executor: Annotated[
        str | None,
        typer.Option(
            "--executor",
            help="Where the selection's join runs: local (a process pool), local:N "
            "(local:1 in process), ray://host:port or auto (RAY_ADDRESS, else the Ray "
            "cluster on this machine). Default: the cut_executor setting.",
        ),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            min=1,
            max=65536,
            help="clip_id partitions of the join, each one task (default: the "
            "cut_partitions setting, 1). The artifacts do not depend on it.",
        ),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cut a snapshot from a recipe at its catalog pin and register the next version.

    Idempotent: when a published version has the same inputs (recipe, resolved pin,
    code version), that version is shown instead, unless --new-version. Weights that
    do not sum to 1 are normalised with a warning, noted in snapshot.json (`notes`).
    --dry-run exits 2 when a cut would fail (the reasons are printed beside the counts);
    a cut that selects nothing prints the same breakdown before its error.
    --executor and --partitions split the selection's join by clip_id over a process
    pool or a Ray cluster; the artifacts are byte-identical for every choice."""
    from service.cli_plan import render_breakdown, render_plan

    parsed = _recipe(recipe)
    if dry_run:
        with open_client(url, token) as client:
            plan = client.plan(parsed)
        emit(plan, as_json, render_plan)
        if not plan["publishable"]:
            raise typer.Exit(2)
        return
    try:
        with open_client(url, token) as client, progress(not as_json) as report:
            snap = client.cut(
                parsed,
                new_version=new_version,
                progress=report,
                executor=executor,
                partitions=partitions,
            )
    except InvalidInput as exc:
        if not as_json and isinstance(exc.details.get("breakdown"), dict):
            counts = exc.details["breakdown"]
            render_breakdown(exc.details.get("candidates", 0), exc.details.get("drops", {}), counts)
        raise
    emit(snap, as_json, _render_snapshot)


def validate(
    recipe: RecipeArg,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a recipe without cutting: its syntax, then every value it names (embedding
    models, filters, caption versions, rungs, tokenizer, stream predicates, eval
    embedding coverage) against the catalog at its pin. Exits 2 naming the first
    unknown value and the known ones."""
    from materializer.recipe import recipe_notes

    parsed = _recipe(recipe)
    with open_client(url, token) as client:
        result = client.validate(parsed)
    result.pop("recipe", None)
    result["warnings"] = recipe_notes(parsed)
    emit(result, as_json, lambda r: out.print(f"[green]valid[/green] {r['name']} {r['sha256']}"))


def _render_snapshot(snap: dict[str, Any]) -> None:
    out.print(
        f"[bold]snapshot v{snap['version']}[/bold]  parent={snap['parent']}  "
        f"steps={snap['num_steps']}  samples={snap['counts']['samples']}  "
        f"plan rows={snap['plan_rows']}"
    )
    shares = new_table("phase", "stream", "target", "realized", "bound", title="stream shares")
    for phase in snap["phases"]:
        for name, target in phase["targets"].items():
            shares.add_row(
                phase["name"],
                name,
                f"{target:.4f}",
                f"{phase['realized'].get(name, 0.0):.4f}",
                f"±{phase['share_bound'].get(name, 0.0):.1f} {phase['unit']}",
            )
    out.print(shares)
    if snap.get("patch_of") is not None:
        out.print(_patch_line(snap))
    if not snap["drops"]:
        out.print("dropped: none")
        return
    drops = new_table("reason", "samples", title="dropped")
    for reason, n in snap["drops"].items():
        drops.add_row(reason, str(n))
    out.print(drops)


def _patch_line(snap: dict[str, Any]) -> str:
    """What a patch version skips of its parent (its ``drops`` are the parent's cut's)."""
    patch = snap.get("patch") or {}
    named = patch.get("excluded") or {}
    per_stream = ", ".join(f"{k} {v}" for k, v in (patch.get("skipped_by_stream") or {}).items())
    return (
        f"patch of v{snap['patch_of']} ({patch.get('reason', '')}): skips "
        f"{patch.get('skipped_plan_rows_total', patch.get('skipped_plan_rows', 0))} plan rows "
        f"(named: {named.get('clip_ids', 0)} clips, {named.get('asset_ids', 0)} assets, "
        f"{named.get('rows', 0)} rows)" + (f"; per stream: {per_stream}" if per_stream else "")
    )


def snapshots(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """List registered snapshot versions."""
    with open_client(url, token) as client:
        rows = client.snapshots()["data"]

    def render(items: list[dict[str, Any]]) -> None:
        table = new_table(
            "version",
            "parent",
            "patch_of",
            "recipe",
            "steps",
            "samples",
            "pinned",
            "erased",
            "created",
        )
        for r in items:
            table.add_row(
                str(r["version"]),
                str(r["parent"]),
                str(r["patch_of"] or ""),
                str(r["name"]),
                str(r["num_steps"]),
                str(r["counts"].get("samples", "")),
                "yes" if r["pinned"] else "",
                "yes" if r.get("contains_erased_data") else "",
                r["created_at"],
            )
        out.print(table)

    emit(rows, as_json, render)


def show(
    version: int, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Show one snapshot's metadata (snapshot.json; with ``contains_erased_data`` and
    ``erasure_ids`` added, and the artifacts the latest erasure mark names)."""
    with open_client(url, token) as client:
        snap = client.snapshot(version)
        marks = client.erasure_marks(version)
    if marks:
        snap = {**snap, "artifacts": {**snap["artifacts"], **marks[-1]["artifacts"]}}
    snap = {
        **snap,
        "contains_erased_data": bool(marks and marks[-1]["erased_rows"]),
        "erasure_ids": [m["erasure_id"] for m in marks],
    }
    emit(snap, as_json, _render_snapshot)


def diff(
    a: int,
    b: int,
    max_clips: Annotated[int, typer.Option(help="List at most this many clip ids.")] = 20,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What changed between two versions: clips added/removed, stream shares, drops."""
    with open_client(url, token) as client:
        emit(client.diff(a, b, max_clips=max_clips), True)


def patch(
    version: int,
    reason: Annotated[str, typer.Option(help="Why (recorded in the new version).")],
    clips: Annotated[
        list[str] | None, typer.Option("--clip", help="Clip id to exclude (repeat).")
    ] = None,
    assets: Annotated[
        list[str] | None, typer.Option("--asset", help="Asset id to exclude (repeat).")
    ] = None,
    rows: Annotated[
        list[int] | None, typer.Option("--row", help="Manifest row to exclude (repeat).")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="Exclude the manifest rows matching this SQL predicate over "
            "manifest.parquet's columns: clip_id, asset_id, stream (the stream's index "
            "in the recipe, from 0), bucket, num_frames, tokens, …; e.g. "
            '"stream = 0 AND tokens > 4096".'
        ),
    ] = None,
    by: Annotated[str | None, typer.Option(help="Who asked.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a new version of V that skips the given clips/assets/rows in every step."""
    if not clips and not assets and not rows and not where:
        raise InvalidInput("name at least one --clip, --asset, --row or --where to exclude")
    with open_client(url, token) as client:
        made = client.patch(
            version,
            reason=reason,
            exclude_clip_ids=clips,
            exclude_asset_ids=assets,
            exclude_rows=rows,
            where=where,
            by=by,
        )
        snap = client.snapshot(made["version"])
    emit(snap, as_json, _render_snapshot)


def pin(
    version: int,
    reason: Annotated[str, typer.Option(help="Why this version must be kept.")],
    by: Annotated[
        str | None, typer.Option(help="Who pins it (over --url: the token's name).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Protect a version's objects from garbage collection."""
    with open_client(url, token) as client:
        emit(client.pin(version, reason, by=by), as_json)


def unpin(
    version: int, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Remove a version's pin."""
    with open_client(url, token) as client:
        result = client.unpin(version)
    emit({"version": version, "unpinned": result["changed"]}, as_json)


#: In ``vidlake --help`` order.
COMMANDS = (cut, validate, snapshots, show, diff, patch, pin, unpin)
