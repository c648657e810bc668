"""The ``vidlake`` command line.

Every command talks through one :class:`~service.client.Client`: an HTTP client of a
running server (``--url`` or ``VIDLAKE_URL``, with ``--token``), or, when no URL is
given, the in-process client on the embedded catalog (``./.vidlake/`` by default; see
``vidlake config``), which runs the same service functions the server would
(:func:`service.cli_common.open_client`). Long work shows progress bars; ``--json``
prints machine-readable output for scripts. Errors print one line and exit non-zero:
2 for what the API answers with a 4xx (bad input, not found, conflict, forbidden),
1 otherwise.

The commands live by group: :mod:`service.cli_catalog` (ingest, takedowns, erasures),
:mod:`service.cli_snapshots` (cut, validate, versions, patches, pins),
:mod:`service.cli_query` (SQL, lineage, steps, jobs), :mod:`service.cli_objects`
(object uploads), :mod:`service.cli_report` (plan quality), :mod:`service.cli_cache`,
:mod:`service.cli_storage`, :mod:`service.cli_tags`, :mod:`service.cli_dedup`,
:mod:`service.cli_interop` and :mod:`service.cli_drift` (filter drift, the reference
slice, backfill coverage).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from catalog.errors import VidlakeError
from service import (
    cli_catalog,
    cli_drift,
    cli_maintain,
    cli_objects,
    cli_query,
    cli_report,
    cli_schema,
    cli_snapshots,
)
from service.cli_cache import cache_app
from service.cli_common import JsonOpt, emit, err, out
from service.cli_dedup import dedup_app
from service.cli_examples import attach as attach_examples
from service.cli_interop import export_app, import_app
from service.cli_storage import storage_app
from service.cli_tags import tags_app

__all__ = ["app", "exit_code", "main"]

app = typer.Typer(
    rich_markup_mode=None,
    name="vidlake",
    help="Lakehouse catalog and manifest service for training video world models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(cache_app, name="cache")
app.add_typer(storage_app, name="storage")
app.add_typer(tags_app, name="tags")
app.add_typer(dedup_app, name="dedup")
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")


def _print_version(value: bool) -> None:
    if value:
        from service.version import VERSION

        out.print(f"vidlake {VERSION}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Lakehouse catalog and manifest service for training video world models.

    Example: vidlake --url http://127.0.0.1:8321 snapshots
    """


def exit_code(exc: VidlakeError) -> int:
    """2 for an error the API answers with a 4xx (the caller's to fix), else 1."""
    return 2 if 400 <= exc.http_status < 500 else 1


def main() -> None:
    """Console entry point: run the app, turning vidlake errors into one clean line."""
    # httpx's own command line (httpx._main: click, rich, pygments) is never run here;
    # marked absent, ``import httpx`` (every --url command) skips it, as httpx allows.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    try:
        app()
    except VidlakeError as exc:
        err.print(f"[red]error[/red] ({exc.code}): {exc.message}")
        sys.exit(exit_code(exc))


# -- configuration and server -----------------------------------------------------------------
@app.command()
def config(as_json: JsonOpt = False) -> None:
    """Show the effective configuration (settings + embedded defaults)."""
    from service.settings import get_settings

    settings = get_settings()
    data = {**settings.model_dump(mode="json"), "resolved": settings.resolved()}
    emit(data, True)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default from settings).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default from settings).")] = None,
) -> None:
    """Run the REST service (uvicorn) on the configured catalog."""
    import uvicorn

    from service.app import create_app
    from service.auth import check_bind
    from service.settings import Settings, get_settings

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(**{**get_settings().model_dump(exclude_unset=True), **overrides})
    check_bind(settings)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


for _command in (
    *cli_catalog.COMMANDS,
    *cli_objects.COMMANDS,
    *cli_snapshots.COMMANDS,
    *cli_report.COMMANDS,
    *cli_query.COMMANDS,
    *cli_schema.COMMANDS,
    *cli_maintain.COMMANDS,
    *cli_drift.COMMANDS,
):
    app.command()(_command)


# -- the demo ------------------------------------------------------------------------------
@app.command()
def demo(
    assets: Annotated[
        int,
        typer.Option(
            min=1500,
            help="Assets in the synthetic corpus (first run; at least 1500, which the demo "
            "recipe's step quotas need without a sample twice in a step).",
        ),
    ] = 1500,
) -> None:
    """Run the end-to-end demo on the configured home (default ./.vidlake/)."""
    from service.demo.run import run_demo
    from service.settings import get_settings

    run_demo(get_settings(), assets=assets)


attach_examples(app)
