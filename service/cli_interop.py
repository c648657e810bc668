"""``vidlake import …`` and ``vidlake export …``: TAR-shard training caches.

* ``vidlake import tar-shards SOURCE [--revision vNNNNNN]`` adopts a TAR-shard dataset
  by reference (:mod:`interop.tar_import`); ``--verify`` then hashes every
  referenced shard in full and quarantines the samples of any that fail.
* ``vidlake import tar-shards-verify`` runs that full check alone, and quarantines the
  samples whose members a loader recorded as corrupt (:mod:`interop.corrupt`).

Both exit 1 when any shard fails its whole-TAR SHA-256 (or any recorded member is
corrupt), so a script can gate on them; 2 is an error.
* ``vidlake import corrupt-members [--url]`` lists the members loaders recorded as
  corrupt (``GET /v1/corrupt-members``).
* ``vidlake export tar-shards --snapshot V --out DIR|s3://…`` writes a snapshot as
  bucket-pure TAR shards with a manifest (:mod:`interop.tar_export`).

All work on the embedded (or configured) catalog of ``vidlake config``; long work
shows progress bars on stderr, ``--json`` prints the report for scripts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli_common import TokenOpt, UrlOpt, emit, open_client, open_lake, progress
from service.cli_common import out as console

__all__ = ["export_app", "import_app"]

import_app = typer.Typer(
    rich_markup_mode=None, help="Adopt existing datasets by reference.", no_args_is_help=True
)
export_app = typer.Typer(
    rich_markup_mode=None, help="Write snapshots in other formats.", no_args_is_help=True
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _render_import(report: dict[str, Any]) -> None:
    console.print(
        f"imported [bold]{report['imported']}[/bold] samples from {report['shards']} shards "
        f"(revision {report['revision'] or 'unversioned'}): {report['duplicates']} already "
        f"present, {report['excluded']} excluded, {report['eval']} eval, "
        f"{report['quarantined']} quarantined"
    )
    console.print(
        f"indexed by headers: {report['index_bytes_read']} of {report['shard_bytes']} bytes "
        f"read ({report['index_read_fraction']:.4%}) in {report['index_requests']} requests; "
        f".pt tensor headers: {report.get('header_bytes_read', 0)} bytes in "
        f"{report.get('header_requests', 0)} requests"
    )
    if "verify" in report:
        _render_verify(report["verify"])


def _render_verify(v: dict[str, Any]) -> None:
    console.print(f"verified {len(v['verified'])} shards; failed: {v['failed'] or 'none'}")
    members = v.get("corrupt_members", {})
    if members.get("members"):
        console.print(
            f"corrupt members recorded by loaders: {len(members['members'])} "
            f"({len(members['clips'])} clips; {members['quarantined']} assets newly quarantined)"
        )


def _verify(catalog: Any, report: Callable[[str, float], None]) -> dict[str, Any]:
    """Whole-shard check, then quarantine of loader-recorded corrupt members."""
    from interop.corrupt import quarantine_failed_members
    from interop.tar_import import verify_shards

    result = verify_shards(catalog, progress=report)
    result["corrupt_members"] = quarantine_failed_members(catalog)
    result["ok"] = not result["failed"] and not result["corrupt_members"]["members"]
    return result


@import_app.command("tar-shards")
def import_tar_shards_cmd(
    source: Annotated[str, typer.Argument(help="Directory, s3://bucket/prefix or http(s) URL.")],
    revision: Annotated[
        str | None, typer.Option(help="Pinned revision vNNNNNN (default: manifest.json).")
    ] = None,
    rung: Annotated[str, typer.Option(help="Rung of latents whose sidecar names none.")] = "256p",
    tokenizer_version: Annotated[
        str, typer.Option(help="Tokenizer of latents whose sidecar names none.")
    ] = "imported",
    source_tier: Annotated[
        str, typer.Option(help="licensed | crawl | synthetic, where the sidecar says nothing.")
    ] = "crawl",
    caption_version: Annotated[
        str, typer.Option(help="Version recorded for sidecar captions.")
    ] = "import",
    verify: Annotated[
        bool, typer.Option("--verify", help="Then hash every shard in full; quarantine failures.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Adopt a TAR-shard dataset without copying a byte (headers-only indexing)."""
    from interop.tar_import import ImportOptions, import_tar_shards

    options = ImportOptions(
        rung=rung,
        tokenizer_version=tokenizer_version,
        source_tier=source_tier,
        caption_version=caption_version,
    )
    lake = open_lake()
    try:
        with progress(not as_json) as report:
            result = import_tar_shards(
                lake.catalog, source, revision=revision, options=options, progress=report
            ).to_dict()
            if verify:
                result["verify"] = _verify(lake.catalog, report)
    finally:
        lake.close()
    emit(result, as_json, _render_import)
    if verify and not result["verify"]["ok"]:
        raise typer.Exit(1)


@import_app.command("tar-shards-verify")
def verify_tar_shards_cmd(as_json: JsonOpt = False) -> None:
    """Hash every referenced TAR shard in full (its whole-TAR SHA-256 at EOF); quarantine
    the samples of any that fail and of members loaders recorded as corrupt. Exit 1 when
    any shard or member fails."""
    lake = open_lake()
    try:
        with progress(not as_json) as report:
            result = _verify(lake.catalog, report)
    finally:
        lake.close()
    emit(result, as_json, _render_verify)
    if not result["ok"]:
        raise typer.Exit(1)


@import_app.command("corrupt-members")
def corrupt_members_cmd(
    url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """List the latent members loaders recorded as corrupt (every rank skips them;
    ``tar-shards-verify`` quarantines their samples)."""
    with open_client(url, token) as client:
        result = client.corrupt_members()
    emit(
        result,
        as_json,
        lambda r: console.print("\n".join(r["members"]) or "no corrupt members recorded"),
    )


@export_app.command("tar-shards")
def export_tar_shards_cmd(
    snapshot: Annotated[int, typer.Option("--snapshot", help="Snapshot version to export.")],
    out: Annotated[str, typer.Option("--out", help="Empty directory or s3://bucket/prefix.")],
    samples_per_shard: Annotated[int, typer.Option(help="Samples per TAR shard.")] = 64,
    as_json: JsonOpt = False,
) -> None:
    """Write a snapshot as bucket-pure TAR shards in plan order, with a manifest."""
    from interop.tar_export import export_tar_shards

    lake = open_lake()
    target = out if out.startswith("s3://") else str(Path(out).absolute())
    try:
        with progress(not as_json) as report:
            result = export_tar_shards(
                lake.catalog,
                lake.registry,
                snapshot,
                target,
                samples_per_shard=samples_per_shard,
                progress=report,
            ).to_dict()
    finally:
        lake.close()
    emit(
        result,
        as_json,
        lambda r: console.print(
            f"wrote {r['shards']} shards ({r['samples']} samples, {r['bytes']} latent bytes) "
            f"and manifest.json to {r['out']}"
        ),
    )
