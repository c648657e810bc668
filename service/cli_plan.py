"""How ``vidlake cut --dry-run`` prints a dry run (``PlanPublic``), and the same
breakdown when a real cut selects nothing."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from service.cli_common import err, out

__all__ = ["render_breakdown", "render_plan"]


def _counts_table(title: str, counts: dict[str, int]) -> Table:
    table = Table(title, "samples", title=f"kept per {title}")
    for key, n in counts.items():
        table.add_row(str(key), f"{n:,}")
    return table


def render_breakdown(candidates: int, drops: dict[str, int], counts: dict[str, Any]) -> None:
    """Candidates, drops by reason, and kept samples per stream, tier and bucket."""
    out.print(
        f"candidates={candidates:,}  kept={counts.get('samples', 0):,}  "
        f"clips={counts.get('clips', 0):,}  assets={counts.get('assets', 0):,}"
    )
    if not drops:
        out.print("dropped: none")
    else:
        dropped = Table("reason", "samples", title="dropped")
        for reason, n in sorted(drops.items(), key=lambda kv: -kv[1]):
            dropped.add_row(reason, f"{n:,}")
        out.print(dropped)
    for what in ("stream", "tier", "bucket"):
        found = counts.get(f"per_{what}") or {}
        if found:
            out.print(_counts_table(what, found))


def _phases_table(plan: dict[str, Any]) -> Table:
    table = Table(
        "phase", "rung", "steps", "rows", "tokens", "stream", "target", "realized", "coverage",
        title="plan",
    )  # fmt: skip
    coverage = plan.get("coverage") or {}
    for phase in plan.get("phases") or []:
        for name, target in phase["targets"].items():
            table.add_row(
                phase["name"],
                phase["rung"],
                f"{phase['num_steps']:,}",
                f"{phase['plan_rows']:,}",
                f"{phase['tokens']:,}",
                name,
                f"{target:.4f}",
                f"{phase['realized'].get(name, 0.0):.4f}",
                f"{coverage.get(name, 0.0):.1%}",
            )
    return table


def render_plan(plan: dict[str, Any]) -> None:
    """A dry run: the selection's breakdown, the plan per phase, and its problems."""
    out.print(
        f"[bold]dry run[/bold] {plan['name']} {plan['recipe_sha256'][:12]}  (nothing published)"
    )
    render_breakdown(plan["candidates"], plan["drops"], plan["counts"])
    if plan.get("phases"):
        out.print(_phases_table(plan))
        out.print(f"steps={plan['num_steps']:,}  plan rows={plan['plan_rows']:,}")
    quality = plan.get("quality")
    if quality:
        out.print(
            f"plan quality: repeated_in_step={quality['repeated_in_step']}  "
            f"max_share_deviation={quality['max_share_deviation']:.4f}  "
            f"max_autocorr_beyond_batch={quality['max_autocorr_beyond_batch']:.4f}"
        )
    for req in (plan.get("backfill") or {}).get("requirements", []):
        if req["missing"] or req["min_coverage"] is not None:
            need = "" if req["min_coverage"] is None else f" (min_coverage {req['min_coverage']})"
            out.print(
                f"backfill {req['key']}: {req['clips'] - req['missing']:,} of "
                f"{req['clips']:,} candidate clips = {req['coverage']:.1%}{need}"
            )
    decon = plan.get("decontamination")
    if decon:
        out.print(f"eval decontamination coverage={decon['coverage']:.1%}")
    for problem in plan.get("problems") or []:
        at = f" ({problem['path']})" if problem.get("path") else ""
        err.print(f"[red]a cut would fail[/red]{at}: {problem['message']}", highlight=False)
    if plan.get("publishable"):
        out.print("[green]a cut would publish this[/green]")
