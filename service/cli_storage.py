"""``vidlake storage …``: move what training needs to S3, prove it, restore, clean up.

See ``docs/operations.md``. Every command prints a human summary, or one JSON object
with ``--json``; long work shows a rich progress bar (on stderr).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["storage_app"]

storage_app = typer.Typer(
    rich_markup_mode=None,
    help="Storage operations: inventory, verified upload, seal, restore, cleanup-check, watch.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON summary.")]
EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        help="S3-compatible endpoint (else VIDLAKE_S3_ENDPOINT_URL, else AWS_ENDPOINT_URL).",
    ),
]


def _lake() -> Any:
    from service.lake import Lake
    from service.settings import get_settings

    return Lake(get_settings())


def _bucket_store(bucket: str, prefix: str, endpoint_url: str | None) -> Any:
    """The bucket store of ``--bucket``/``--prefix``: ``--endpoint-url``, else the
    settings' endpoint and path style (the store reads no setting of its own; what boto3
    resolves beyond them is recorded by a seal: ``manifests.storage.seal``)."""
    from catalog.objects.s3 import S3ObjectStore
    from service.settings import get_settings

    settings = get_settings()
    return S3ObjectStore(
        bucket,
        prefix,
        endpoint_url=endpoint_url or settings.s3_endpoint_url,
        path_style=settings.s3_path_style or None,
    )


def _emit(as_json: bool, summary: dict[str, Any], text: str) -> None:
    typer.echo(json.dumps(summary, sort_keys=True) if as_json else text)


@contextmanager
def _bar(what: str, total: int, quiet: bool) -> Iterator[Callable[[int], None]]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    if quiet:
        yield lambda done: None
        return
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(what, total=total)
        yield lambda done: progress.update(task, completed=done)


StatusOpt = Annotated[
    Path | None,
    typer.Option(
        "--status-file",
        help="JSON status for the dashboard and /metrics "
        "(default: VIDLAKE_STORAGE_STATUS_DIR/<kind>-NAME.json).",
    ),
]


def _status_file(kind: str, name: str, given: Path | None) -> Path:
    from service.settings import get_settings
    from service.storage_status import status_dir, status_path

    return given or status_path(status_dir(get_settings()), kind, name)


def _fail(exc: Exception) -> None:
    from catalog.errors import VidlakeError

    if isinstance(exc, VidlakeError):
        typer.echo(json.dumps({"error": exc.to_dict()}), err=True)
        raise typer.Exit(2) from exc
    raise exc


@storage_app.command()
def inventory(
    snapshot: Annotated[int, typer.Option("--snapshot", help="Snapshot version.")],
    out: Annotated[Path, typer.Option("--out", help="Inventory file (JSONL).")],
    text_cache: Annotated[
        Path | None, typer.Option("--text-cache", help="Directory of text-embedding objects.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List every local file snapshot V needs: artifacts, latents, text embeddings, catalog."""
    from manifests.storage.inventory import build_inventory

    lake = _lake()
    try:
        inv = build_inventory(lake.catalog, lake.registry, snapshot, text_cache=text_cache)
    except Exception as exc:
        _fail(exc)
        return
    inv.write(out)
    summary = {"out": str(out), "entries": len(inv.entries), "bytes": inv.total_bytes}
    summary["kinds"] = inv.counts()
    _emit(as_json, summary, f"{len(inv.entries)} files, {inv.total_bytes} bytes -> {out}")


@storage_app.command()
def upload(
    inventory_file: Annotated[Path, typer.Argument(metavar="INVENTORY")],
    name: Annotated[str, typer.Option("--name", help="Receipts go to RECEIPTS_DIR/NAME.jsonl.")],
    bucket: Annotated[str, typer.Option("--bucket")],
    prefix: Annotated[str, typer.Option("--prefix")] = "",
    workers: Annotated[int, typer.Option("--workers")] = 8,
    receipts_dir: Annotated[Path, typer.Option("--receipts-dir")] = Path("receipts"),
    endpoint_url: EndpointOpt = None,
    status_file: StatusOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload an inventory, content-addressed and verified; resumable; fails on any change.

    Progress goes to a JSON status file the dashboard and ``/metrics`` show."""
    from manifests.storage.inventory import read_inventory
    from manifests.storage.upload import upload_entries
    from service.storage_status import UploadStatusFile

    try:
        inv = read_inventory(inventory_file)
        store = _bucket_store(bucket, prefix, endpoint_url)
        status = UploadStatusFile(
            _status_file("upload", name, status_file),
            name=name,
            source=str(inventory_file),
            store=store.url,
            files_total=len(inv.entries),
            bytes_total=inv.total_bytes,
        )
        with status, _bar("upload", inv.total_bytes, as_json) as tick:

            def progress(done: int, files: int) -> None:
                tick(done)
                status.progress(done, files)

            report = upload_entries(
                inv.entries,
                store,
                receipts_dir / f"{name}.jsonl",
                workers=workers,
                progress=progress,
            )
            status.finish(bytes_uploaded=report.bytes_uploaded, failed=report.failed)
    except Exception as exc:
        _fail(exc)
        return
    summary = report.to_dict()
    text = (
        f"uploaded {report.uploaded}, already stored {report.existing}, "
        f"receipted before {report.skipped}, failed {len(report.failed)}"
    )
    for f in report.failed:
        text += f"\n  NOT READY {f['path']}: {f['error']}"
    _emit(as_json, summary, text)
    if not report.ok:
        raise typer.Exit(1)


@storage_app.command()
def seal(
    inventory_file: Annotated[Path, typer.Option("--inventory")],
    receipts: Annotated[Path, typer.Option("--receipts")],
    out: Annotated[Path, typer.Option("--out", help="Directory for restore_spec.json.")],
    bucket: Annotated[str, typer.Option("--bucket")],
    prefix: Annotated[str, typer.Option("--prefix")] = "",
    endpoint_url: EndpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Refuse unless every entry has a verified receipt and every object verifies by content
    in the bucket; write and verify the restore spec."""
    from manifests.storage.inventory import read_inventory
    from manifests.storage.seal import seal as do_seal

    try:
        store = _bucket_store(bucket, prefix, endpoint_url)
        pointer = do_seal(read_inventory(inventory_file), receipts, store, out)
    except Exception as exc:
        _fail(exc)
        return
    where = out / "restore_spec.json"
    text = (
        f"sealed: {store.url}/{pointer['key']} "
        f"(sha256 {pointer['sha256']})\nkeep {where} somewhere safe, away from this machine"
    )
    _emit(as_json, {**pointer, "local": str(where)}, text)


@storage_app.command()
def restore(
    restore_spec: Annotated[Path, typer.Option("--restore-spec")],
    out: Annotated[Path, typer.Option("--out")],
    endpoint_url: EndpointOpt = None,
    read_check: Annotated[
        bool, typer.Option("--read-check/--no-read-check", help="Read one step from the bucket.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Build a fresh embedded catalog in OUT from the bucket alone."""
    from manifests.storage.restore import check_restore
    from manifests.storage.restore import restore as do_restore

    try:
        with _bar("restore", 1000, as_json) as tick:
            result = do_restore(
                restore_spec,
                out,
                endpoint_url=endpoint_url,
                progress=lambda d, t: tick(1000 * d // max(t, 1)),
            )
        if read_check:
            result["read_check"] = check_restore(
                restore_spec, out / "read-check", endpoint_url=endpoint_url
            )
    except Exception as exc:
        _fail(exc)
        return
    text = (
        f"restored {len(result['tables'])} tables and {result['files']} files into {out}\n"
        f"use it with: VIDLAKE_CONFIG={result['config']} vidlake …"
    )
    _emit(as_json, result, text)


@storage_app.command("cleanup-check")
def cleanup_check(
    paths: Annotated[list[Path], typer.Argument()],
    inventory_file: Annotated[Path, typer.Option("--inventory")],
    receipts: Annotated[Path, typer.Option("--receipts")],
    restore_spec: Annotated[Path | None, typer.Option("--restore-spec")] = None,
    pending: Annotated[
        list[Path] | None,
        typer.Option("--pending", help="Inventory of an unpublished or in-progress snapshot."),
    ] = None,
    endpoint_url: EndpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Say, per file, whether it is safe to delete and which condition fails. Deletes nothing.

    Exit 0 only when every file is safe; exit 1 when any is NOT SAFE (so a deletion
    script can gate on it); exit 2 on an error. ``--json`` lists each file with its
    failed conditions and reasons."""
    from manifests.storage.cleanup import cleanup_check as check
    from manifests.storage.inventory import read_inventory
    from manifests.storage.receipts import read_receipts

    try:
        inv = read_inventory(inventory_file)
        refs = [{e.sha256 for e in read_inventory(p).entries if e.sha256} for p in pending or []]
        newer = _newer_references(int(inv.header["snapshot"]))
        verdicts = check(
            paths,
            inventory=inv,
            receipts=read_receipts(receipts),
            spec_file=restore_spec,
            newer_references=[*refs, *newer],
            endpoint_url=endpoint_url,
        )
    except Exception as exc:
        _fail(exc)
        return
    lines = [
        f"{'safe    ' if v['safe'] else 'NOT SAFE'} {v['path']}"
        + "".join(f"\n    {c}: {v['reasons'][c]}" for c in v["failed"])
        for v in verdicts
    ]
    unsafe = sum(not v["safe"] for v in verdicts)
    summary = {"files": verdicts, "safe": len(verdicts) - unsafe, "not_safe": unsafe}
    summary["all_safe"] = unsafe == 0
    _emit(as_json, summary, "\n".join(lines))
    if unsafe:
        raise typer.Exit(1)


def _newer_references(sealed: int) -> list[set[str]]:
    """Object SHA-256s of local registry versions published after the sealed one."""
    from manifests.storage.inventory import referenced_objects

    lake = _lake()
    out = []
    for v in lake.registry.versions():
        if v > sealed:
            latents, texts = referenced_objects(lake.registry, v)
            refs = {ref.sha256 for ref in lake.registry.get(v).artifacts.values()}
            out.append(set(latents) | set(texts) | refs)
    return out


@storage_app.command()
def watch(
    directory: Annotated[Path, typer.Argument(metavar="DIR")],
    bucket: Annotated[str, typer.Option("--bucket")],
    prefix: Annotated[str, typer.Option("--prefix")] = "",
    name: Annotated[str, typer.Option("--name", help="Receipts go to RECEIPTS_DIR/NAME.jsonl.")] = (
        "watch"
    ),
    receipts_dir: Annotated[Path, typer.Option("--receipts-dir")] = Path("receipts"),
    status_file: StatusOpt = None,
    stable_seconds: Annotated[float, typer.Option("--stable-seconds")] = 30.0,
    require_marker: Annotated[
        bool, typer.Option("--require-marker", help="Only upload files with a NAME.done marker.")
    ] = False,
    poll_seconds: Annotated[float, typer.Option("--poll-seconds")] = 5.0,
    workers: Annotated[int, typer.Option("--workers")] = 4,
    passes: Annotated[
        int | None, typer.Option("--passes", help="Stop after N polls (default: run until Ctrl-C).")
    ] = None,
    endpoint_url: EndpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload files a producer writes over hours, once each is complete; restart-safe."""
    from rich.live import Live
    from rich.text import Text

    from manifests.storage.watch import Watcher, WatchStatus

    def line(s: WatchStatus) -> Text:
        return Text(
            f"uploaded {s.files_uploaded} files ({s.bytes_uploaded / 1e6:.1f} MB, "
            f"{s.rate_mb_s:.1f} MB/s) | done {s.files_done} | backlog {s.backlog_files} files "
            f"({s.backlog_bytes / 1e6:.1f} MB) | failed {len(s.failed)}"
        )

    try:
        store = _bucket_store(bucket, prefix, endpoint_url)
        watcher = Watcher(
            directory,
            store,
            receipts_dir / f"{name}.jsonl",
            _status_file("watch", name, status_file),
            stable_s=stable_seconds,
            workers=workers,
            require_marker=require_marker,
            name=name,
        )
        if as_json:
            status = watcher.run(poll_seconds, max_passes=passes)
        else:
            with Live(Text("watching…"), transient=False) as live:
                status = watcher.run(
                    poll_seconds, max_passes=passes, on_poll=lambda s: live.update(line(s))
                )
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:
        _fail(exc)
        return
    from dataclasses import asdict

    _emit(as_json, asdict(status), str(line(status)))
    if status.failed:
        raise typer.Exit(1)
