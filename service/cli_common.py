"""What every ``vidlake`` command shares: the consoles, the common options, JSON or
rich output, progress bars, and the one :class:`~service.client.Client` a command
talks through.

:func:`open_client` picks the client once per command: an
:class:`~service.client.HttpClient` of ``--url`` (or ``VIDLAKE_URL``) when one is
given, else the in-process :class:`~service.client_local.LocalClient` on the
configured lake. A command never asks which it got.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from rich.table import Table

    from service.client import Client
    from service.lake import Lake

__all__ = [
    "JsonOpt",
    "TokenOpt",
    "UrlOpt",
    "emit",
    "err",
    "new_table",
    "open_client",
    "open_lake",
    "out",
    "progress",
]

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


def open_lake() -> Lake:
    """The configured lake's handles (for the commands that work on files directly)."""
    from service.lake import Lake
    from service.settings import get_settings

    return Lake(get_settings())


@contextmanager
def open_client(url: str | None, token: str | None) -> Iterator[Client]:
    """The client of ``url``, or of the configured lake in this process; closed after.

    Ctrl-C ends the process at once (exit 130) rather than wait for a job: a server's
    job goes on; an in-process one stops as in a crash (every write is atomic, and the
    job store marks it ``interrupted`` when the lake is next opened).
    """
    client: Client
    if url:
        from service.client import HttpClient

        client = HttpClient(url, token)
    else:
        from service.client_local import LocalClient
        from service.settings import get_settings

        client = LocalClient(get_settings())
    try:
        yield client
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # not sys.exit: that would join the in-process job's thread first
    finally:
        client.close()


def emit(data: Any, as_json: bool, render: Callable[[Any], None] | None = None) -> None:
    """Print ``data`` as JSON (``--json``, or when there is no ``render``), else render it."""
    if as_json or render is None:
        out.print_json(json.dumps(data, default=str))
    else:
        render(data)


def new_table(*columns: str, **options: Any) -> Table:
    """A rich table (imported on first use: ``--help`` does not pay for it)."""
    from rich.table import Table

    return Table(*columns, **options)


@contextmanager
def progress(enabled: bool = True) -> Iterator[Callable[[str, float], None]]:
    """A rich progress display with one bar per stage; yields ``report(stage, fraction)``."""
    if not enabled:
        yield lambda stage, fraction: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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
