"""``vidlake upload``: object files (latents) into the lake's content-addressed store,
over REST (``PUT /v1/objects/{sha256}``, write scope) or into the embedded store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, open_client, out

__all__ = ["COMMANDS", "upload"]


def upload(
    files: Annotated[list[Path], typer.Argument(help="The files to store (any bytes).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Store files as objects and print each one's SHA-256 (what latents rows name in
    object_sha256). A file stored already is not sent again; the server verifies the
    bytes against their hash. Needs the write scope with --url.
    """
    done: list[dict[str, Any]] = []
    with open_client(url, token) as client:
        for path in files:
            sha = client.put_object(path, progress=not as_json)
            done.append({"path": str(path), "sha256": sha})
    emit(done, as_json, _render)


def _render(rows: list[dict[str, str]]) -> None:
    for row in rows:
        out.print(f"{row['sha256']}  {row['path']}")


COMMANDS = (upload,)
