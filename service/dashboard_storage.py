"""The dashboard's storage panel: one card per running or recent upload/watch
(:mod:`service.storage_status`), with a progress bar, rate, ETA, backlog and every
failed file listed. The figures carry ``data-key``/``data-value`` (what a test reads)
and are the same numbers ``/metrics`` exports as ``vidlake_storage_op_*`` gauges.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from service.storage_status import StorageOp

__all__ = ["storage_panel"]


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _bytes(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _duration(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(s)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def _figure(key: str, value: object, shown: str) -> str:
    raw = "" if value is None else value
    return (
        f'<div class="figure"><span class="k">{_e(key)}</span>'
        f'<span class="v" data-key="{_e(key)}" data-value="{_e(raw)}">{_e(shown)}</span></div>'
    )


def _card(op: StorageOp) -> str:
    if op.state == "unreadable":
        return (
            f'<article class="op unreadable" data-kind="{_e(op.kind)}" data-name="{_e(op.name)}">'
            f"<h3>{_e(op.kind)} {_e(op.name)}</h3>"
            f'<p class="error">unreadable status file {_e(op.path)}: {_e(op.error)}</p></article>'
        )
    pct = round(100 * op.progress) if op.progress is not None else None
    bar = (
        f'<div class="bar wide" role="progressbar" aria-valuemin="0" aria-valuemax="100" '
        f'aria-valuenow="{pct}"><span style="width:{pct}%"></span></div>'
        if pct is not None
        else ""
    )
    files = f"{op.files_done:,}" + (f" / {op.files_total:,}" if op.files_total is not None else "")
    figures = [
        _figure("progress", op.progress, f"{pct}%" if pct is not None else "—"),
        _figure("files_done", op.files_done, files),
        _figure("bytes_done", op.bytes_done, _bytes(op.bytes_done)),
        _figure("bytes_total", op.bytes_total, _bytes(op.bytes_total)),
        _figure("rate_mb_s", op.rate_mb_s, f"{op.rate_mb_s:,.1f} MB/s"),
        _figure("eta_s", op.eta_s, _duration(op.eta_s)),
        _figure("failed", op.failed_count, f"{op.failed_count:,}"),
        _figure("updated", op.age_s, f"{_duration(op.age_s)} ago"),
    ]
    if op.backlog_files is not None:
        backlog = f"{op.backlog_files:,} files, {_bytes(op.backlog_bytes)}"
        figures.insert(5, _figure("backlog_files", op.backlog_files, backlog))
    return (
        f'<article class="op state-{_e(op.state)}" data-kind="{_e(op.kind)}" '
        f'data-name="{_e(op.name)}" data-state="{_e(op.state)}">'
        f'<h3>{_e(op.kind)} <code>{_e(op.name)}</code> <span class="state">{_e(op.state)}</span>'
        f'</h3><p class="meta">{_e(op.source)} → {_e(op.store)} · started '
        f"{_e(op.started_at[:19])}</p>{bar}"
        f'<div class="figures">{"".join(figures)}</div>{_failures(op)}{_error(op)}</article>'
    )


def _failures(op: StorageOp) -> str:
    if not op.failed:
        return ""
    items = "".join(
        f"<li><code>{_e(f.get('path'))}</code>: {_e(f.get('error'))}</li>" for f in op.failed
    )
    more = op.failed_count - len(op.failed)
    tail = f"<li>… {more} more in {_e(op.path)}</li>" if more > 0 else ""
    return (
        '<details class="failures" open><summary>failed files</summary>'
        f"<ul>{items}{tail}</ul></details>"
    )


def _error(op: StorageOp) -> str:
    return f'<p class="error">{_e(op.error)}</p>' if op.error else ""


def storage_panel(ops: Sequence[StorageOp], directory: str) -> str:
    """The section's body: a card per operation, live ones first."""
    if not ops:
        return (
            f'<p class="empty">no storage operations (status files go to {_e(directory)}; '
            "run <code>vidlake storage upload</code> or <code>watch</code>)</p>"
        )
    return f'<div class="ops">{"".join(_card(op) for op in ops)}</div>'
