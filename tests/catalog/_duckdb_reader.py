"""An independent Iceberg reader: DuckDB's iceberg extension, in its own process.

:func:`duckdb_read` (for tests) runs this file as ``python _duckdb_reader.py
REQUEST.json``; the request names the DuckDB extension files, and per read: a
table's metadata file, a snapshot (an id, a tag name resolved from the metadata
file's own ``refs``, or None: the current one), and the Parquet file to write the rows
to. The child imports nothing of vidlake or pyiceberg: the point is a second
implementation of the Iceberg spec reading our tables.

The extension files come from the PyPI packages ``duckdb-extension-iceberg`` and
``duckdb-extension-avro`` (the dev extra); no ``INSTALL``, no network. An extension
loads only into the DuckDB release it was built for, and those packages stop at a
release older than the project's DuckDB, so the child runs with that release's
``duckdb`` on its path: ``.venv/duckdb-reader`` (``make venv`` installs it there) or
the directory ``VIDLAKE_DUCKDB_READER`` names. :func:`reader_or_skip` says why not
when neither is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

_HERE = Path(__file__)


@dataclass(frozen=True)
class Reader:
    """How to start the child: the extension files and the ``PYTHONPATH`` it needs."""

    extensions: tuple[str, ...]
    pythonpath: str | None


def find_reader() -> Reader | str:
    """The reader this machine has, or why there is none (a skip reason).

    ``make venv`` installs the extension packages and the DuckDB release they are built
    for into their own folder (``.venv/duckdb-reader``, or ``VIDLAKE_DUCKDB_READER``):
    their pins (``duckdb==<release>``) conflict with the project's DuckDB."""
    import duckdb

    side = Path(os.environ.get("VIDLAKE_DUCKDB_READER") or Path(sys.prefix) / "duckdb-reader")
    files = []
    for name in ("avro", "iceberg"):
        found = sorted(side.glob(f"duckdb_extension_{name}/extensions/v*/{name}.*"))
        if not found:
            return (
                f"no {name} extension under {side}: pip install --no-deps --target {side} "
                f"duckdb-extension-{name} (make venv does)"
            )
        files.append(found[-1])
    release = files[-1].parent.name.removeprefix("v")
    if duckdb.__version__ == release:
        return Reader(tuple(map(str, files)), None)
    if not (side / f"duckdb-{release}.dist-info").is_dir():
        return (
            f"the iceberg extension is built for DuckDB {release} (this one is "
            f"{duckdb.__version__}): pip install --no-deps --target {side} duckdb=={release}"
        )
    return Reader(tuple(map(str, files)), str(side))


def reader_or_skip() -> Reader:
    """:func:`find_reader`, skipping the calling test when there is none."""
    import pytest

    found = find_reader()
    if isinstance(found, str):
        pytest.skip(f"no DuckDB iceberg reader: {found}")
    return found


def duckdb_read(reader: Reader, reads: list[dict[str, Any]], workdir: Path) -> list[pa.Table]:
    """Each read (``metadata``, and ``tag`` or ``snapshot_id``) through DuckDB."""
    import pyarrow.parquet as pq

    outs = [workdir / f"duckdb-read-{i}.parquet" for i in range(len(reads))]
    request = {
        "extensions": list(reader.extensions),
        "reads": [{**r, "out": str(o)} for r, o in zip(reads, outs, strict=True)],
    }
    path = workdir / "duckdb-request.json"
    path.write_text(json.dumps(request))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if reader.pythonpath:
        env["PYTHONPATH"] = reader.pythonpath
    done = subprocess.run(
        [sys.executable, str(_HERE), str(path)],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"the DuckDB reader failed: {done.stderr[-4000:]}"
    return [pq.read_table(o) for o in outs]


def _snapshot_id(metadata: Path, tag: str | None, sid: int | None) -> int | None:
    if tag is None:
        return sid
    refs = json.loads(metadata.read_text())["refs"]
    return int(refs[tag]["snapshot-id"])


def main(request_path: str) -> None:
    import duckdb

    request: dict[str, Any] = json.loads(Path(request_path).read_text())
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    for path in request["extensions"]:
        con.execute(f"LOAD '{path}'")
    for read in request["reads"]:
        metadata = Path(read["metadata"])
        sid = _snapshot_id(metadata, read.get("tag"), read.get("snapshot_id"))
        at = "" if sid is None else f", snapshot_from_id => {sid}"
        query = f"SELECT * FROM iceberg_scan('{metadata}'{at})"
        con.execute(f"COPY ({query}) TO '{read['out']}' (FORMAT parquet)")


if __name__ == "__main__":
    main(sys.argv[1])
