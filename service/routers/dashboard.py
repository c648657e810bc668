"""The dashboard at ``/``: server-rendered HTML, no JavaScript, no build step.

Catalog row counts (from each table's current Iceberg snapshot summary, so no data
is read), running and recent jobs with progress bars, and recent snapshots with their
realized stream shares as a small inline SVG bar. The page refreshes itself.
Every value is HTML-escaped where it is interpolated.
"""

from __future__ import annotations

import html
import logging
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from string import Template
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from catalog.errors import VidlakeError
from service.deps import Reader, Services, Svc
from service.jobs import JobRecord
from service.routers.health import API_VERSION
from service.schemas import ErrorResponse

__all__ = ["router"]

router = APIRouter(tags=["dashboard"])
log = logging.getLogger("vidlake.service")

REFRESH_S = 5
_RECENT_SNAPSHOTS = 10
_RECENT_JOBS = 15
_PALETTE = ("#2f6fde", "#e8833a", "#1a9c7a", "#b8467d", "#7a5cd6", "#c9a227", "#4aa3c7", "#8a93a3")


@lru_cache(maxsize=1)
def _template() -> Template:
    text = resources.files("service").joinpath("templates/dashboard.html").read_text("utf-8")
    return Template(text)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _catalog_counts(services: Services) -> tuple[list[tuple[str, int]], str | None]:
    from catalog.tables import TABLE_NAMES

    try:
        catalog = services.catalog
        counts = [(name, catalog.row_count(name)) for name in TABLE_NAMES]
        return counts, None
    except VidlakeError as exc:
        return [], f"catalog unavailable: {exc.message}"


def _shares_svg(shares: dict[str, Any]) -> str:
    items = [(str(k), float(v)) for k, v in shares.items() if isinstance(v, int | float) and v > 0]
    total = sum(v for _, v in items)
    if not items or total <= 0:
        return '<span class="empty">none</span>'
    width, x, rects, legend = 240.0, 0.0, [], []
    for i, (name, value) in enumerate(items):
        color = _PALETTE[i % len(_PALETTE)]
        w = width * value / total
        rects.append(
            f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="14" fill="{color}">'
            f"<title>{_e(name)}: {value / total:.1%}</title></rect>"
        )
        legend.append(f'<i style="background:{color}"></i>{_e(name)} {value / total:.0%}')
        x += w
    return (
        f'<svg class="shares" width="{int(width)}" height="14" role="img" '
        f'aria-label="stream shares">{"".join(rects)}</svg>'
        f'<div class="legend">{"".join(legend)}</div>'
    )


def _snapshot_rows(services: Services) -> str:
    try:
        reader = services.reader
        versions = sorted(reader.versions(), reverse=True)[:_RECENT_SNAPSHOTS]
        pinned = {p.version for p in services.registry.pins()}
        records = [reader.record(v) for v in versions]
    except VidlakeError as exc:
        return f'<tr><td colspan="7" class="error">{_e(exc.message)}</td></tr>'
    if not records:
        return '<tr><td colspan="7" class="empty">no snapshots yet</td></tr>'
    rows = []
    for rec in records:
        snap = rec.snapshot
        recipe = snap.get("recipe") if isinstance(snap.get("recipe"), dict) else {}
        name = recipe.get("name", "") if isinstance(recipe, dict) else ""
        patch = f" (patch of v{rec.patch_of})" if rec.patch_of is not None else ""
        rows.append(
            f'<tr class="snapshot"><td>v{rec.version}{_e(patch)}</td><td>{_e(name)}</td>'
            f"<td>{_e(rec.entry.created_at[:19])}</td>"
            f'<td class="num">{_e(snap.get("num_steps"))}</td>'
            f'<td class="num">{_e(snap.get("plan_rows"))}</td>'
            f"<td>{'yes' if rec.version in pinned else ''}</td>"
            f"<td>{_shares_svg(snap.get('stream_shares') or {})}</td></tr>"
        )
    return "\n".join(rows)


def _job_row(job: JobRecord) -> str:
    pct = round(job.progress * 100)
    bar = f'<span class="bar"><span style="width:{pct}%"></span></span> {pct}%'
    return (
        f'<tr class="job {_e(job.state)}"><td><code>{_e(job.id)}</code></td><td>{_e(job.kind)}</td>'
        f'<td class="state-{_e(job.state)}">{_e(job.state)}</td><td>{_e(job.stage or "")}</td>'
        f"<td>{bar}</td><td>{_e(job.owner or '')}</td><td>{_e(job.created_at[:19])}</td></tr>"
    )


@router.get(
    "/",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {"schema": {"type": "string"}}}},
        401: {"model": ErrorResponse, "description": "Tokens are configured and none was sent"},
        403: {"model": ErrorResponse, "description": "The token lacks the read scope"},
    },
    summary="Dashboard (HTML, auto-refreshing; needs the read scope)",
)
def dashboard(services: Svc, principal: Reader) -> HTMLResponse:
    counts, catalog_error = _catalog_counts(services)
    catalog_rows = "\n".join(
        f'<tr><td>{_e(name)}</td><td class="num">{n:,}</td></tr>' for name, n in counts
    )
    store = services.runner.store
    active = store.list(state="running") + store.list(state="queued")
    recent = [j for j in store.list(limit=_RECENT_JOBS) if j.done]
    jobs = active + recent
    totals = store.counts()
    page = _template().substitute(
        refresh=REFRESH_S,
        api_version=_e(API_VERSION),
        auth="open" if services.auth.open else "tokens",
        now=_e(datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
        catalog_error=f'<p class="error">{_e(catalog_error)}</p>' if catalog_error else "",
        catalog_rows=catalog_rows or '<tr><td colspan="2" class="empty">no tables</td></tr>',
        job_summary=_e(", ".join(f"{n} {state}" for state, n in totals.items())),
        job_rows="\n".join(_job_row(j) for j in jobs)
        or '<tr><td colspan="7" class="empty">no jobs</td></tr>',
        snapshot_rows=_snapshot_rows(services),
    )
    return HTMLResponse(page)
