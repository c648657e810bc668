"""``vidlake ingest``, ``tombstone``, ``erase`` and ``erasures``: rows into the catalog,
takedowns, and the erasure of a hard takedown's bytes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

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
from service.client import INGEST_TABLES, check_table

__all__ = ["COMMANDS", "erase", "erasures", "ingest", "tombstone"]


def _read_rows(path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.exists():
        raise InvalidInput(f"{path}: no such file", path=str(path))
    if not path.is_file():
        raise InvalidInput(f"{path}: not a file", path=str(path))
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.read_table(path)
        if suffix in (".arrow", ".arrows", ".ipc"):
            with pa.OSFile(str(path)) as f:
                try:
                    return pa.ipc.open_file(f).read_all()
                except pa.ArrowInvalid:
                    f.seek(0)
                    return pa.ipc.open_stream(f).read_all()
    except (pa.ArrowException, OSError) as exc:
        what = "Parquet" if suffix == ".parquet" else "Arrow IPC"
        raise InvalidInput(f"{path}: not a readable {what} file: {exc}", path=str(path)) from exc
    try:
        text = path.read_text()
        if suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        rows = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(f"{path}: not valid JSON: {exc}", path=str(path)) from exc
    if not isinstance(rows, list):
        raise InvalidInput(f"{path}: expected a JSON array of rows", path=str(path))
    return rows


#: What ``vidlake ingest`` takes besides the catalog tables: clip embeddings (LanceDB).
EMBEDDINGS = "embeddings"


def ingest(
    table: Annotated[
        str, typer.Argument(help=f"One of: {', '.join((*INGEST_TABLES, EMBEDDINGS))}.")
    ],
    file: Annotated[Path, typer.Argument(help="JSON array, JSONL, Parquet or Arrow IPC.")],
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Name the batch: a rerun with a recorded key writes nothing and prints the "
            "first result (default: the SHA-256 of the batch's canonical bytes).",
        ),
    ] = None,
    model_version: Annotated[
        str | None,
        typer.Option(help="embeddings only: the model version of rows that name none."),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ingest a batch of rows into one table (one commit; rejected whole if any row is bad;
    a rerun of a committed batch is a no-op that prints the first result). `embeddings`
    takes {clip_id, vector, model_version?} rows of clips already in the catalog."""
    if table == EMBEDDINGS:
        if idempotency_key is not None:
            raise InvalidInput(
                "--idempotency-key is for catalog tables; embeddings are keyed by clip id "
                "(a re-sent vector is a duplicate)",
                field="idempotency_key",
            )
    else:
        check_table(table)
        if model_version is not None:
            raise InvalidInput("--model-version is for embeddings only", field="model_version")
    started = time.perf_counter()
    rows = _read_rows(file)
    count, size = len(rows) if isinstance(rows, list) else rows.num_rows, file.stat().st_size
    what = f"{count:,} row{'' if count == 1 else 's'} ({size / 1e6:,.1f} MB) into {table}"
    with open_client(url, token) as client, _status(f"ingesting {what}", not as_json):
        if table == EMBEDDINGS:
            result = client.ingest_embeddings(rows, model_version=model_version)
        else:
            result = client.ingest(table, rows, idempotency_key=idempotency_key)
    if not as_json:
        err.print(_ingest_summary(result, what, time.perf_counter() - started, count, size))
    emit(result, as_json)


def _ingest_summary(result: dict[str, Any], what: str, took: float, count: int, size: int) -> str:
    """The line ``ingest`` prints on stderr: the rate, or that a rerun wrote nothing."""
    if result.get("replayed"):
        key = result.get("idempotency_key")
        return (
            f"already ingested: {what} was committed before under key {key}; "
            "nothing was written (the first result follows)"
        )
    took = max(took, 1e-9)
    return (
        f"ingested {what} in {took:.1f} s: {count / took:,.0f} rows/s, "
        f"{size / 1e6 / took:,.1f} MB/s"
    )


@contextmanager
def _status(message: str, enabled: bool) -> Iterator[None]:
    """A spinner on stderr while one batch is read, sent and committed."""
    if not enabled:
        yield
        return
    with err.status(message):
        yield


def tombstone(
    asset_id: Annotated[str, typer.Argument(help="The asset's SHA-256.")],
    reason: Annotated[str, typer.Option(help="Why (recorded).")],
    kind: Annotated[
        str, typer.Option(help="soft: exclude from later cuts; hard: also allows erasing bytes.")
    ] = "soft",
    by: Annotated[str | None, typer.Option(help="Who asked.")] = None,
    then_erase: Annotated[
        bool,
        typer.Option(
            "--erase", help="With --kind hard: erase the bytes now (see `vidlake erase`)."
        ),
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Take an asset down: every later snapshot excludes all of its clips."""
    if then_erase and kind != "hard":
        raise InvalidInput("--erase needs --kind hard", field="kind")
    row = {"asset_id": asset_id, "reason": reason, "kind": kind, "requested_by": by}
    with open_client(url, token) as client:
        result = client.ingest("tombstones", [row])
        if then_erase:
            with progress(not as_json) as report:
                result = client.erase(asset_id, reason=reason, by=by, progress=report)
    emit(result, as_json, _render_erasure if then_erase else None)


def erase(
    asset_id: Annotated[str, typer.Argument(help="The asset's SHA-256 (hard-tombstoned).")],
    reason: Annotated[str, typer.Option(help="Why (recorded in the audit record).")] = (
        "hard takedown"
    ),
    by: Annotated[str | None, typer.Option(help="Who asked.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Erase a hard-tombstoned asset's bytes: objects, Iceberg rows, vectors, snapshot
    artifacts. Idempotent; rerun it after an interruption to finish the job."""
    with open_client(url, token) as client, progress(not as_json) as report:
        result = client.erase(asset_id, reason=reason, by=by, progress=report)
    emit(result, as_json, _render_erasure)


def erasures(
    erasure_id: Annotated[str | None, typer.Argument(help="One erasure (default: all).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Erasures and their audit records (what was erased, what could not be)."""
    with open_client(url, token) as client:
        if erasure_id is not None:
            emit(client.erasure(erasure_id), as_json, _render_erasure)
            return
        data = client.erasures()

    def render(d: dict[str, Any]) -> None:
        table = new_table("erasure", "asset", "state", "requested by", "completed")
        for e in d["data"]:
            table.add_row(
                e["erasure_id"],
                e["asset_id"][:16],
                e["state"],
                str(e["requested_by"] or ""),
                str(e["completed_at"] or ""),
            )
        out.print(table)

    emit(data, as_json, render)


def _render_erasure(e: dict[str, Any]) -> None:
    audit = e.get("audit") or {}
    rows = {t: v.get("rows_dropped", 0) for t, v in (audit.get("tables") or {}).items()}
    out.print(f"[bold]erasure {e['erasure_id']}[/bold]  asset={e['asset_id']}  {e['state']}")
    out.print(f"rows erased: {rows}")
    objects = audit.get("objects") or {}
    out.print(
        f"objects deleted: {len(objects.get('deleted', []))}  "
        f"packs rewritten: {len(audit.get('packs_rewritten') or {})}  "
        f"vectors: {audit.get('vectors_deleted') or {}}"
    )
    marked = (audit.get("versions") or {}).get("marked") or {}
    out.print(f"versions marked: {sorted(int(v) for v in marked)}")
    adopted = (audit.get("not_erased") or {}).get("adopted_objects") or []
    if adopted:
        out.print(f"[yellow]not erasable (adopted by reference): {adopted}[/yellow]")


#: In ``vidlake --help`` order.
COMMANDS = (ingest, tombstone, erase, erasures)
