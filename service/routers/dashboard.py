"""The dashboard: server-rendered HTML and SVG, no JavaScript, no build step.

* ``/``: catalog row counts and ingest rates per table over time (both from Iceberg
  snapshot summaries, so no data is read), live storage operations (uploads, watches:
  :mod:`service.dashboard_storage`), running and recent jobs with progress bars, and
  recent snapshots (linked) with their realized stream shares. Refreshes itself.
* ``/dashboard/snapshots/{version}``: one snapshot's drop funnel, stream shares per
  phase, bucket histogram and, when the cut wrote quality.json, the plan quality
  charts (:mod:`service.dashboard_data`).
* ``/dashboard/drift?filter=&a=&b=&threshold=``: the drift report's charts
  (:func:`service.drift.drift_report`), and a form to ask for one.

Charts come from :mod:`service.charts`. Every value is HTML-escaped where it is
interpolated; a user error (unknown version, bad filter name) is an HTML page with the
error's 4xx status.
"""

from __future__ import annotations

import html
import logging
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from string import Template
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from catalog.errors import VidlakeError
from service.dashboard_data import (
    drift_sections,
    ingest_section,
    quality_sections,
    read_quality,
    snapshot_sections,
)
from service.dashboard_storage import storage_panel
from service.deps import Reader, Services, Svc
from service.jobs import JobRecord
from service.routers.health import API_VERSION
from service.schemas import ErrorResponse
from service.storage_status import read_statuses

__all__ = ["router"]

router = APIRouter(tags=["dashboard"])
log = logging.getLogger("vidlake.service")

REFRESH_S = 5
_RECENT_SNAPSHOTS = 10
_RECENT_JOBS = 15
_PALETTE = ("#2f6fde", "#e8833a", "#1a9c7a", "#b8467d", "#7a5cd6", "#c9a227", "#4aa3c7", "#8a93a3")


@lru_cache(maxsize=4)
def _template(name: str = "dashboard.html") -> Template:
    text = resources.files("service").joinpath(f"templates/{name}").read_text("utf-8")
    return Template(text)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _catalog_overview(
    services: Services,
) -> tuple[list[tuple[str, int]], dict[str, list[tuple[int, int]]], str | None]:
    """Each table's row count and commit history, from one metadata read per table."""
    from catalog.tables import TABLE_NAMES

    counts, history = [], {}
    try:
        catalog = services.catalog
        for name in TABLE_NAMES:
            rows, points = catalog.overview(name)
            counts.append((name, rows))
            history[name] = [(p.timestamp_ms, p.added_records) for p in points]
    except VidlakeError as exc:
        return [], {}, f"catalog unavailable: {exc.message}"
    return counts, history, None


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
            f'<tr class="snapshot"><td><a href="/dashboard/snapshots/{rec.version}">'
            f"v{rec.version}</a>{_e(patch)}</td><td>{_e(name)}</td>"
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
    counts, history, catalog_error = _catalog_overview(services)
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
        ingest=(
            f'<p class="error">{_e(catalog_error)}</p>'
            if catalog_error
            else ingest_section(history)
        ),
        storage=storage_panel(
            read_statuses(services.storage_status_dir), str(services.storage_status_dir)
        ),
    )
    return HTMLResponse(page)


def _page(title: str, body: str, *, status: int = 200) -> HTMLResponse:
    page = _template("page.html").substitute(
        title=_e(title),
        body=body,
        api_version=_e(API_VERSION),
        now=_e(datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
    )
    return HTMLResponse(page, status_code=status)


def _error_html(exc: VidlakeError) -> str:
    if exc.http_status >= 500:
        raise exc  # the app's handler logs and answers it
    return f'<p class="error" data-code="{_e(exc.code)}">{_e(exc.message)}</p>'


def _error_page(title: str, exc: VidlakeError) -> HTMLResponse:
    return _page(title, _error_html(exc), status=exc.http_status)


_HTML_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/html": {"schema": {"type": "string"}}}},
    401: {"model": ErrorResponse, "description": "Tokens are configured and none was sent"},
    403: {"model": ErrorResponse, "description": "The token lacks the read scope"},
}


@router.get(
    "/dashboard/snapshots/{version}",
    response_class=HTMLResponse,
    responses={**_HTML_RESPONSES, 404: {"description": "No such snapshot (an HTML page)"}},
    summary="One snapshot's charts: drop funnel, shares, buckets, plan quality (HTML)",
)
def snapshot_page(version: int, services: Svc, principal: Reader) -> HTMLResponse:
    title = f"snapshot v{version}"
    reader = services.reader
    try:
        snapshot = reader.record(version).snapshot
        quality = read_quality(snapshot, lambda name: reader.local(version, name).read_bytes())
    except VidlakeError as exc:
        return _error_page(title, exc)
    recipe = snapshot.get("recipe") if isinstance(snapshot.get("recipe"), dict) else {}
    name = recipe.get("name", "") if isinstance(recipe, dict) else ""
    head = (
        f'<p class="meta">recipe {_e(name)} · {_e(snapshot.get("num_steps"))} steps · '
        f'{_e(snapshot.get("plan_rows"))} plan rows · <a href="/">back</a></p>'
    )
    body = head + snapshot_sections(version, snapshot) + quality_sections(version, quality)
    return _page(title, body)


@router.get(
    "/dashboard/drift",
    response_class=HTMLResponse,
    responses={
        **_HTML_RESPONSES,
        404: {"description": "The filter has no scores at a version (an HTML page)"},
        422: {"description": "A bad filter name, version or threshold (an HTML page)"},
    },
    summary="Filter drift between two score versions on the reference slice (HTML)",
)
def drift_page(
    services: Svc,
    principal: Reader,
    filter: Annotated[str | None, Query(max_length=200)] = None,
    a: Annotated[str | None, Query(max_length=200)] = None,
    b: Annotated[str | None, Query(max_length=200)] = None,
    threshold: Annotated[float | None, Query(allow_inf_nan=False)] = None,
) -> HTMLResponse:
    form = _drift_form(filter, a, b, threshold)
    if not (filter and a and b):
        return _page("filter drift", form)
    try:
        from service.drift import drift_report
    except ImportError:
        msg = '<p class="error">this build has no drift reports (service.drift)</p>'
        return _page("filter drift", form + msg, status=404)
    try:
        report = drift_report(services, filter, a, b, threshold=threshold)
    except VidlakeError as exc:
        return _page("filter drift", form + _error_html(exc), status=exc.http_status)
    return _page(f"drift: {filter} {a} vs {b}", form + drift_sections(report))


def _drift_form(filt: str | None, a: str | None, b: str | None, threshold: float | None) -> str:
    def field(name: str, label: str, value: object) -> str:
        return (
            f'<label>{label} <input name="{name}" value="{_e(value)}" '
            f"{'required' if name != 'threshold' else ''}></label>"
        )

    return (
        '<form class="drift" method="get" action="/dashboard/drift">'
        + field("filter", "filter", filt)
        + field("a", "version a", a)
        + field("b", "version b", b)
        + field("threshold", "kill threshold", threshold)
        + '<button type="submit">compare</button></form>'
    )
