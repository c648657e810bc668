"""``vidlake maintain`` and ``vidlake gc``: keeping a long-fed lake fast and tidy.

``maintain`` compacts small Iceberg data files, rewrites manifests, expires old
snapshots (never those registered versions read, tagged ones or the current one) and
removes orphan files; ``gc`` finds the debris crashes leave outside the tables (a dry
run unless ``--apply``). Both run as service jobs through one ``Client``, so they work
against a server (``--url``) or the lake's files alike; see docs/operations.md.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, open_client, out, progress

__all__ = ["COMMANDS", "gc", "maintain"]

_DAY = 86400.0


def maintain(
    retention: Annotated[
        float, typer.Option("--retention-s", help="Expire snapshots older than this (s).")
    ] = 7 * _DAY,
    retain_last: Annotated[
        int, typer.Option("--retain-last", help="Newest snapshots always kept.")
    ] = 1,
    orphan_age: Annotated[
        float, typer.Option("--orphan-age-s", help="Unreferenced files younger than this stay.")
    ] = _DAY,
    target_mib: Annotated[
        int, typer.Option("--target-file-mib", help="Size compacted data files aim at (MiB).")
    ] = 128,
    table: Annotated[
        list[str] | None, typer.Option("--table", help="Only this table (repeatable).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compact small files, rewrite manifests, expire old snapshots (never ones a
    registered version, a tag or main needs), remove orphan files. Idempotent and
    safe to kill: rerun it to finish an interrupted run."""
    options = {
        "retention_s": retention,
        "retain_last": retain_last,
        "orphan_age_s": orphan_age,
        "target_file_bytes": target_mib * 2**20,
        "tables": table or [],
    }
    with open_client(url, token) as client, progress(not as_json) as report:
        result = client.maintain(options, progress=report)
    emit(result, as_json, _render_maintain)


def gc(
    apply: Annotated[bool, typer.Option("--apply", help="Delete (default: a dry run).")] = False,
    tmp_age: Annotated[
        float, typer.Option("--tmp-age-s", help="Temp files older than this go (s).")
    ] = _DAY,
    upload_age: Annotated[
        float, typer.Option("--upload-age-s", help="Abort multipart uploads older than this.")
    ] = _DAY,
    object_age: Annotated[
        float, typer.Option("--object-age-s", help="Unreferenced objects younger stay.")
    ] = 7 * _DAY,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Find crash debris: cut work folders and temp files of dead processes, old
    unfinished multipart uploads, objects nothing references. A dry run unless
    --apply; objects of registered versions are never touched."""
    options = {
        "apply": apply,
        "tmp_age_s": tmp_age,
        "upload_age_s": upload_age,
        "object_age_s": object_age,
    }
    with open_client(url, token) as client, progress(not as_json) as report:
        result = client.gc(options, progress=report)
    emit(result, as_json, _render_gc)


def _render_maintain(report: dict[str, Any]) -> None:
    table = Table("table", "files", "manifests", "bytes", "planning s", "expired", "orphans")
    for name, t in report["tables"].items():
        b, a = t["before"], t["after"]
        table.add_row(
            name,
            f"{b['data_files']} → {a['data_files']}",
            f"{b['manifests']} → {a['manifests']}",
            f"{b['data_bytes']} → {a['data_bytes']}",
            f"{b['planning_s']:.3f} → {a['planning_s']:.3f}",
            str(t["snapshots_expired"]),
            str(t["orphans"]["orphans"]),
        )
    out.print(table)


def _render_gc(report: dict[str, Any]) -> None:
    verb = "removed" if report["apply"] else "would remove (dry run; --apply deletes)"
    for kind in ("cut_dirs", "tmp_files", "uploads", "objects"):
        found = report[kind]
        out.print(f"{kind}: {verb} {found['count']} ({found['bytes']} bytes)")


#: In ``vidlake --help`` order.
COMMANDS = (maintain, gc)
