"""The ``vidlake`` command line.

Every command talks either to a running server (``--url`` or ``VIDLAKE_URL``) or, when
no URL is given, to the embedded catalog directly (``./.vidlake/`` by default; see
``vidlake config``). Long work shows progress bars; ``--json`` prints machine-readable
output for scripts. Errors print one line and exit non-zero (2 for bad input).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from catalog.errors import InvalidInput, VidlakeError
from catalog.table_names import INGEST_ORDER
from service.cli_interop import export_app, import_app
from service.cli_storage import storage_app
from service.lake import Lake
from service.settings import Settings, get_settings

__all__ = ["app", "main"]

app = typer.Typer(
    name="vidlake",
    help="Lakehouse catalog and manifest service for training video world models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
cache_app = typer.Typer(help="The node cache of latents (loader side).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")
app.add_typer(storage_app, name="storage")
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")

out = Console()
err = Console(stderr=True)

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url", envvar="VIDLAKE_URL", help="Server URL; omit to use the embedded catalog."
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="VIDLAKE_TOKEN", help="Bearer token for --url.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


# -- plumbing ------------------------------------------------------------------------------
def _lake() -> Lake:
    return Lake(get_settings())


def _emit(data: Any, as_json: bool, render: Callable[[Any], None] | None = None) -> None:
    if as_json or render is None:
        out.print_json(json.dumps(data, default=str))
    else:
        render(data)


@contextmanager
def _progress(enabled: bool = True) -> Iterator[Callable[[str, float], None]]:
    """A rich progress display with one bar per stage; yields ``report(stage, fraction)``."""
    if not enabled:
        yield lambda stage, fraction: None
        return
    with Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as bars:
        tasks: dict[str, Any] = {}

        def report(stage: str, fraction: float) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=1.0)
            bars.update(tasks[stage], completed=max(0.0, min(1.0, fraction)))

        yield report


class _Client:
    """A small JSON client for ``--url`` mode (httpx; imported only when used)."""

    def __init__(self, url: str, token: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60.0)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:  # refused, unresolvable, timed out
            raise _RemoteError(0, f"cannot reach {self.http.base_url}: {exc}", None) from exc
        body = response.json() if response.content else None
        if response.status_code >= 400:
            error = (body or {}).get("error", {}) if isinstance(body, dict) else {}
            raise _RemoteError(response.status_code, error.get("message", response.text), body)
        return body


def _client(url: str | None, token: str | None) -> _Client:
    """A client of ``url``, or of the app served in-process on the embedded catalog."""
    if url:
        return _Client(url, token)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # starlette's test client announces a rename
        from starlette.testclient import TestClient

    from service.app import create_app

    client = _Client.__new__(_Client)
    # In process, hence a loopback client: an open service refuses any other.
    client.http = TestClient(
        create_app(get_settings()), raise_server_exceptions=True, client=("127.0.0.1", 0)
    )
    return client


class _RemoteError(Exception):
    def __init__(self, status: int, message: str, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def main() -> None:
    """Console entry point: run the app, turning vidlake errors into one clean line."""
    try:
        app()
    except VidlakeError as exc:
        err.print(f"[red]error[/red] ({exc.code}): {exc.message}")
        sys.exit(2 if isinstance(exc, InvalidInput) else 1)
    except _RemoteError as exc:
        where = f"HTTP {exc.status}" if exc.status else "connection"
        err.print(f"[red]error[/red] ({where}): {exc}")
        sys.exit(2 if 400 <= exc.status < 500 else 1)


# -- configuration and server -----------------------------------------------------------------
@app.command()
def config(as_json: JsonOpt = False) -> None:
    """Show the effective configuration (settings + embedded defaults)."""
    settings = get_settings()
    data = {**settings.model_dump(mode="json"), "resolved": settings.resolved()}
    _emit(data, True)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default from settings).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default from settings).")] = None,
) -> None:
    """Run the REST service (uvicorn) on the configured catalog."""
    import uvicorn

    from service.app import create_app
    from service.auth import check_bind

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(**{**get_settings().model_dump(exclude_unset=True), **overrides})
    check_bind(settings)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


# -- ingest and takedowns --------------------------------------------------------------------
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


_TABLES = INGEST_ORDER


@app.command()
def ingest(
    table: Annotated[str, typer.Argument(help=f"One of: {', '.join(_TABLES)}.")],
    file: Annotated[Path, typer.Argument(help="JSON array, JSONL, Parquet or Arrow IPC.")],
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Name the batch: a rerun with a recorded key writes nothing and prints the "
            "first result (default: the SHA-256 of the batch's canonical bytes).",
        ),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ingest a batch of rows into one table (one commit; rejected whole if any row is bad;
    a rerun of a committed batch is a no-op that prints the first result)."""
    if table not in _TABLES:
        raise InvalidInput(f"unknown table {table!r}; one of {', '.join(_TABLES)}", table=table)
    rows = _read_rows(file)
    if url:
        import pyarrow as pa

        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        if isinstance(rows, pa.Table):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, rows.schema) as writer:
                writer.write_table(rows)
            body = sink.getvalue().to_pybytes()
            result = _Client(url, token).call(
                "POST",
                f"/v1/{table.replace('_', '-')}",
                content=body,
                headers={"Content-Type": "application/vnd.apache.arrow.stream", **headers},
            )
        else:
            result = _Client(url, token).call(
                "POST", f"/v1/{table.replace('_', '-')}", json=rows, headers=headers
            )
    else:
        add = getattr(_lake().catalog, f"add_{table}")
        result = add(rows, idempotency_key=idempotency_key).to_dict()
    _emit(result, as_json)


@app.command()
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
    if url:
        result = _Client(url, token).call("POST", "/v1/tombstones", json=[row])
    else:
        result = _lake().catalog.add_tombstones([row]).to_dict()
    if not then_erase:
        _emit(result, as_json)
        return
    erase(asset_id, reason=reason, by=by, url=url, token=token, as_json=as_json)


@app.command()
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
    from service.erasure import check_erasure, erasure_view, run_erasure

    if url:
        result = _job_remote(
            _Client(url, token),
            "/v1/erasures",
            {"asset_id": asset_id, "reason": reason},
            progress=not as_json,
        )
    else:
        lake = _lake()
        check_erasure(lake.catalog, asset_id, tombstone=False, reason=reason, by=by)
        with _progress(not as_json) as report:
            record = run_erasure(
                lake.catalog,
                lake.registry,
                asset_id,
                reason=reason,
                requested_by=by,
                progress=report,
            )
        result = erasure_view(record)
    _emit(result, as_json, _render_erasure)


@app.command()
def erasures(
    erasure_id: Annotated[str | None, typer.Argument(help="One erasure (default: all).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Erasures and their audit records (what was erased, what could not be)."""
    client = _client(url, token)
    if erasure_id is not None:
        _emit(client.call("GET", f"/v1/erasures/{erasure_id}"), as_json, _render_erasure)
        return
    data = client.call("GET", "/v1/erasures")

    def render(d: dict[str, Any]) -> None:
        table = Table("erasure", "asset", "state", "requested by", "completed")
        for e in d["data"]:
            table.add_row(
                e["erasure_id"],
                e["asset_id"][:16],
                e["state"],
                str(e["requested_by"] or ""),
                str(e["completed_at"] or ""),
            )
        out.print(table)

    _emit(data, as_json, render)


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


def _job_remote(client: _Client, path: str, body: Any, *, progress: bool) -> Any:
    """Start a job with ``POST path`` and follow it; its result, or the failure raised."""
    return _follow_job(client, client.call("POST", path, json=body)["id"], progress=progress)


def _follow_job(client: _Client, job_id: str, *, progress: bool) -> Any:
    """Poll job ``job_id`` with a progress bar; its result, or the failure raised
    (409 for a conflict, else 422)."""
    import time

    with _progress(progress) as report:
        while True:
            state = client.call("GET", f"/v1/jobs/{job_id}")
            if state.get("stage"):
                report(state["stage"], float(state.get("progress") or 0.0))
            if state["state"] in ("succeeded", "failed"):
                break
            time.sleep(0.25)
    if state["state"] == "failed":
        error = state.get("error") or {}
        raise _RemoteError(
            409 if error.get("code") == "conflict" else 422,
            error.get("message", "job failed"),
            state,
        )
    return state["result"]


# -- snapshots ------------------------------------------------------------------------------
@app.command()
def cut(
    recipe: Annotated[Path, typer.Argument(help="Recipe file (YAML or JSON).")],
    new_version: Annotated[
        bool,
        typer.Option(
            "--new-version",
            help="Publish a new version even if one with the same inputs exists.",
        ),
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cut a snapshot from a recipe at its catalog pin and register the next version.

    Idempotent: when a published version has the same inputs (recipe, resolved pin,
    code version), that version is shown instead, unless --new-version."""
    from materializer.recipe import load_recipe

    if not recipe.is_file():
        raise InvalidInput(f"{recipe}: no such file", path=str(recipe))
    parsed = load_recipe(recipe)
    if url:
        client = _Client(url, token)
        result = _cut_remote(client, parsed, new_version=new_version, progress=not as_json)
        _emit(result, as_json, _render_snapshot)
        return
    from manifests.inputs import cut_inputs_sha256, find_published
    from materializer.cut import code_version, cut_snapshot, resolve_pin

    lake = _lake()
    pin = resolve_pin(lake.catalog, parsed)
    if not new_version:
        key = cut_inputs_sha256(parsed.sha256(), pin.to_dict(), code_version())
        found = find_published(lake.registry.versions(), lake.registry.get, key)
        if found is not None:
            _emit(found.snapshot, as_json, _render_snapshot)
            return
    with _progress(not as_json) as report:
        record = cut_snapshot(lake.catalog, lake.registry, parsed, progress=report, pin=pin)
    _emit(record.snapshot, as_json, _render_snapshot)


@app.command()
def validate(
    recipe: Annotated[Path, typer.Argument(help="Recipe file (YAML or JSON).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a recipe without cutting: its syntax, then every value it names (embedding
    models, filters, caption versions, rungs, tokenizer, stream predicates, eval
    embedding coverage) against the catalog at its pin. Exits 2 naming the first
    unknown value and the known ones."""
    from materializer.recipe import load_recipe

    if not recipe.is_file():
        raise InvalidInput(f"{recipe}: no such file", path=str(recipe))
    parsed = load_recipe(recipe)
    if url:
        body = {"recipe": json.loads(parsed.to_canonical_json())}
        result = _Client(url, token).call("POST", "/v1/recipes:validate", json=body)
        result.pop("recipe", None)
    else:
        from materializer.validate import check_recipe

        check = check_recipe(_lake().catalog, parsed)
        result = {
            "valid": True,
            "name": parsed.name,
            "sha256": parsed.sha256(),
            "pin": check.pin.to_dict(),
        }
    _emit(result, as_json, lambda r: out.print(f"[green]valid[/green] {r['name']} {r['sha256']}"))


def _cut_remote(client: _Client, recipe: Any, *, new_version: bool, progress: bool) -> Any:
    body = {"recipe": json.loads(recipe.to_canonical_json()), "new_version": new_version}
    job = client.call("POST", "/v1/snapshots", json=body)
    if "id" not in job:  # 200: a published version already has these inputs
        return client.call("GET", f"/v1/snapshots/{job['version']}")
    version = _follow_job(client, job["id"], progress=progress)["version"]
    return client.call("GET", f"/v1/snapshots/{version}")


def _render_snapshot(snap: dict[str, Any]) -> None:
    out.print(
        f"[bold]snapshot v{snap['version']}[/bold]  parent={snap['parent']}  "
        f"steps={snap['num_steps']}  samples={snap['counts']['samples']}  "
        f"plan rows={snap['plan_rows']}"
    )
    shares = Table("phase", "stream", "target", "realized", "bound", title="stream shares")
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
    drops = Table("reason", "samples", title="dropped")
    for reason, n in snap["drops"].items():
        drops.add_row(reason, str(n))
    out.print(drops)


@app.command()
def snapshots(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """List registered snapshot versions."""
    rows = _client(url, token).call("GET", "/v1/snapshots")["data"]

    def render(items: list[dict[str, Any]]) -> None:
        table = Table(
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

    _emit(rows, as_json, render)


@app.command()
def show(
    version: int, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Show one snapshot's metadata (snapshot.json; with ``contains_erased_data`` and
    ``erasure_ids`` added, and the artifacts the latest erasure mark names)."""
    if url:
        client = _Client(url, token)
        snap = client.call("GET", f"/v1/snapshots/{version}")
        try:
            marks = [client.call("GET", f"/v1/snapshots/{version}/erasure")]
        except _RemoteError as exc:
            if exc.status != 404:
                raise
            marks = []
    else:
        record = _lake().registry.get(version)
        snap, marks = record.snapshot, [m.model_dump() for m in record.erasures]
    if marks:
        snap = {**snap, "artifacts": {**snap["artifacts"], **marks[-1]["artifacts"]}}
    snap = {
        **snap,
        "contains_erased_data": bool(marks and marks[-1]["erased_rows"]),
        "erasure_ids": [m["erasure_id"] for m in marks],
    }
    _emit(snap, as_json, _render_snapshot)


@app.command()
def diff(
    a: int, b: int, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """What changed between two versions: clips added/removed, stream shares, drops."""
    if url:
        data = _Client(url, token).call("GET", f"/v1/snapshots/{a}/diff/{b}")
    else:
        data = _lake().registry.diff(a, b, max_clips=20).model_dump(mode="json")
    _emit(data, True)


@app.command()
def patch(
    version: int,
    reason: Annotated[str, typer.Option(help="Why (recorded in the new version).")],
    clips: Annotated[
        list[str] | None, typer.Option("--clip", help="Clip id to exclude (repeat).")
    ] = None,
    assets: Annotated[
        list[str] | None, typer.Option("--asset", help="Asset id to exclude (repeat).")
    ] = None,
    by: Annotated[str | None, typer.Option(help="Who asked.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a new version of V that skips the given clips/assets in every step."""
    if not clips and not assets:
        raise InvalidInput("name at least one --clip or --asset to exclude")
    if url:
        body = {
            "exclude_clip_ids": clips or [],
            "exclude_asset_ids": assets or [],
            "reason": reason,
            "by": by,
        }
        snap = _Client(url, token).call("POST", f"/v1/snapshots/{version}/patch", json=body)
    else:
        from manifests.patch import patch as do_patch

        snap = do_patch(
            _lake().registry,
            version,
            exclude_clip_ids=clips or None,
            exclude_asset_ids=assets or None,
            reason=reason,
            by=by,
        ).snapshot
    _emit(snap, as_json, _render_snapshot)


@app.command()
def pin(
    version: int,
    reason: Annotated[str, typer.Option(help="Why this version must be kept.")],
    by: Annotated[str | None, typer.Option(help="Who pins it.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Protect a version's objects from garbage collection (embedded mode)."""
    _emit(_lake().registry.pin(version, reason, by).model_dump(mode="json"), as_json)


@app.command()
def unpin(version: int, as_json: JsonOpt = False) -> None:
    """Remove a version's pin (embedded mode)."""
    _emit({"version": version, "unpinned": _lake().registry.unpin(version)}, as_json)


# -- SQL, lineage, forensics, jobs --------------------------------------------------------------
@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="One read-only SELECT/WITH statement (DuckDB).")],
    snapshot: Annotated[
        int | None, typer.Option(help="Read at the pin snapshot V was cut from.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Row limit (at most the server's).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Query the catalog tables (and the `manifests` view) read-only."""
    body: dict[str, Any] = {"query": query}
    if snapshot is not None:
        body["snapshot"] = snapshot
    if limit is not None:
        body["limit"] = limit
    result = _client(url, token).call("POST", "/v1/sql", json=body)

    def render(data: dict[str, Any]) -> None:
        table = Table(*[c["name"] for c in data["columns"]])
        for row in data["rows"]:
            table.add_row(*["" if v is None else str(v) for v in row])
        out.print(table)
        if data["truncated"]:
            err.print(f"[yellow]truncated at {data['row_count']} rows[/yellow]")

    _emit(result, as_json, render)


@app.command()
def lineage(
    clip_id: Annotated[str, typer.Argument(help="The clip id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Everything about one clip: asset, licence, scores, captions, latents, snapshots/steps."""
    _emit(_client(url, token).call("GET", f"/v1/lineage/clips/{clip_id}"), True)


@app.command()
def step(
    version: int,
    step_number: Annotated[int, typer.Argument(metavar="STEP", help="Global step number.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The exact samples of one step, with a lineage summary (forensics after a loss spike)."""
    data = _client(url, token).call("GET", f"/v1/snapshots/{version}/steps/{step_number}")

    def render(d: dict[str, Any]) -> None:
        table = Table(
            "pos",
            "row",
            "clip",
            "asset",
            "stream",
            "tier",
            "source",
            "license",
            title=f"v{d['version']} step {d['step']} (phase {d['phase']}, bucket {d['bucket']}, "
            f"{d['count']} samples, {d['skipped']} skipped)",
        )
        for smp in d["samples"]:
            table.add_row(
                str(smp["position"]),
                str(smp["row"]),
                smp["clip_id"][:16],
                smp["asset_id"][:12],
                smp["stream"],
                str(smp.get("tier")),
                str(smp.get("source")),
                str(smp.get("license_id")),
            )
        out.print(table)

    _emit(data, as_json, render)


@app.command()
def jobs(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Background jobs (cuts) with state and progress."""
    data = _client(url, token).call("GET", "/v1/jobs")

    def render(d: dict[str, Any]) -> None:
        table = Table("id", "kind", "state", "stage", "progress", "created", "error")
        for j in d["data"]:
            table.add_row(
                j["id"],
                j["kind"],
                j["state"],
                str(j.get("stage") or ""),
                f"{100 * j['progress']:.0f}%",
                j["created_at"],
                (j.get("error") or {}).get("message", "") if j.get("error") else "",
            )
        out.print(table)

    _emit(data, as_json, render)


# -- the node cache --------------------------------------------------------------------------
CacheDir = Annotated[
    Path | None, typer.Option("--dir", help="Cache directory (default from settings).")
]
Budget = Annotated[
    int | None, typer.Option("--budget", help="Budget in bytes (must match the cache's).")
]


def _cache(directory: Path | None, budget: int | None) -> Any:
    from loader.cache import NodeCache

    settings = get_settings()
    root = directory or Path(settings.resolved()["cache_dir"])
    return NodeCache(root, budget or settings.cache_budget_bytes)


@cache_app.command("stats")
def cache_stats(directory: CacheDir = None, budget: Budget = None) -> None:
    """Entries, bytes, reservations, hits, misses, evictions."""
    with _cache(directory, budget) as cache:
        _emit(cache.stats(), True)


@cache_app.command("verify")
def cache_verify(directory: CacheDir = None, budget: Budget = None) -> None:
    """Re-hash every cached object; drop the corrupt ones."""
    with _cache(directory, budget) as cache:
        _emit(cache.verify(), True)


@cache_app.command("gc")
def cache_gc(
    directory: CacheDir = None,
    budget: Budget = None,
    target: Annotated[int | None, typer.Option(help="Evict down to this many bytes.")] = None,
) -> None:
    """Evict unleased objects (LRU) down to a target size."""
    with _cache(directory, budget) as cache:
        _emit(cache.gc(target), True)


# -- the demo ------------------------------------------------------------------------------
@app.command()
def demo(
    assets: Annotated[int, typer.Option(help="Assets in the synthetic corpus (first run).")] = 1500,
) -> None:
    """Run the end-to-end demo on the configured home (default ./.vidlake/)."""
    from service.demo import run_demo

    run_demo(get_settings(), assets=assets)
