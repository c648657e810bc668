"""What both :class:`~service.client.Client` implementations share to move data:
batches cut into chunks, their idempotency keys, object uploads that skip what is
stored, recipe documents, progress bars.

A batch (a ``pyarrow.Table``, a pandas ``DataFrame`` or a list of row dicts) becomes
an Arrow table (:func:`as_batch`), sent whole (one commit, all or nothing: the CLI's
``ingest``) or as chunks of ``chunk_rows`` rows (the public client's default is
:data:`DEFAULT_CHUNK_ROWS`). Chunk ``i``
of ``n`` carries the key ``<key>.<i>`` (the key itself when ``n == 1``), so that a
retry of an interrupted ingest with the same key and chunking replays the chunks that
were committed and commits the rest: nothing twice, nothing missing. A list of dicts
that Arrow cannot type (a column of mixed types) is sent as JSON, whose row checks
name the bad row; the catalog coerces either to the table's types.

Progress is drawn on stderr, with rich when it is installed, else as plain lines. Nothing
here imports a server dependency (the client runs on training nodes).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalog.errors import InvalidInput, InvalidRecipe, NotFound

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "Bar",
    "as_batch",
    "bar",
    "chunk_key",
    "chunk_nbytes",
    "combine",
    "file_chunks",
    "ingest_chunks",
    "plan_chunks",
    "recipe_document",
    "retry_delay",
    "upload_file",
    "upload_source",
]

#: Rows per ingest request of the public client (well under the server's default body
#: and cell limits).
DEFAULT_CHUNK_ROWS = 50_000
_COUNTS = ("received", "inserted", "duplicates", "eval", "rejected", "near_duplicates")

#: ``send(chunk, idempotency_key)``: one ingest request, its ``IngestPublic``.
Send = Callable[["pa.Table | list[dict[str, Any]]", "str | None"], dict[str, Any]]


def as_batch(rows: Any) -> pa.Table | list[dict[str, Any]]:
    """``rows`` as an Arrow table (a list of dicts Arrow cannot type stays a list).

    Raises:
        InvalidInput: ``rows`` is none of a table, a record batch, a pandas
            ``DataFrame`` or a sequence of mappings.
    """
    import pyarrow as pa

    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if type(rows).__module__.split(".")[0] == "pandas" and hasattr(rows, "columns"):
        return pa.Table.from_pandas(rows, preserve_index=False)
    if isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
        listed = list(rows)
        if not all(isinstance(r, Mapping) for r in listed):
            raise InvalidInput("rows must be mappings (column name -> value)", field="rows")
        try:
            return pa.Table.from_pylist([dict(r) for r in listed])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return [dict(r) for r in listed]
    raise InvalidInput(
        f"cannot ingest a {type(rows).__name__}: send a pyarrow Table, a pandas "
        "DataFrame or a list of dicts",
        field="rows",
    )


def chunk_key(key: str | None, index: int, count: int) -> str | None:
    """The idempotency key of chunk ``index`` of ``count`` (see the module docstring)."""
    if key is None or count == 1:
        return key
    return f"{key}.{index}"


def _chunks(
    batch: pa.Table | list[dict[str, Any]], chunk_rows: int
) -> Iterator[pa.Table | list[dict[str, Any]]]:
    total = len(batch)
    if total == 0:
        yield batch
        return
    for start in range(0, total, chunk_rows):
        yield (
            batch[start : start + chunk_rows]
            if isinstance(batch, list)
            else batch.slice(start, chunk_rows)
        )


def combine(table: str, key: str | None, results: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer for a chunked ingest: one chunk's document as the server sent it;
    for several, the counts summed, the last snapshot, and every chunk's document."""
    if len(results) == 1:
        return results[0]
    done: dict[str, Any] = {"table": table}
    done.update({name: sum(int(r.get(name) or 0) for r in results) for name in _COUNTS})
    snapshots = [r["snapshot_id"] for r in results if r.get("snapshot_id") is not None]
    done["snapshot_id"] = snapshots[-1] if snapshots else None
    done["idempotency_key"] = key
    done["replayed"] = all(bool(r.get("replayed")) for r in results)
    done["chunks"] = results
    return done


def ingest_chunks(
    send: Send,
    table: str,
    rows: Any,
    *,
    idempotency_key: str | None,
    chunk_rows: int | None,
    progress: bool,
) -> dict[str, Any]:
    """Ingest ``rows`` into ``table`` through ``send``, ``chunk_rows`` rows a request
    (None: the whole batch in one request, one commit).

    Raises:
        InvalidInput: ``chunk_rows`` is below 1, or ``rows`` is not a batch.
        VidlakeError: a chunk failed (the chunks before it are committed; retry with
            the same key and ``chunk_rows`` to finish).
    """
    total, planned = plan_chunks(rows, idempotency_key=idempotency_key, chunk_rows=chunk_rows)
    results: list[dict[str, Any]] = []
    with bar(f"ingest {table}", total, "rows", enabled=progress) as shown:
        for chunk, key in planned:
            results.append(send(chunk, key))
            shown.advance(len(chunk), chunk_nbytes(chunk))
    return combine(table, idempotency_key, results)


def plan_chunks(
    rows: Any, *, idempotency_key: str | None, chunk_rows: int | None
) -> tuple[int, list[tuple[pa.Table | list[dict[str, Any]], str | None]]]:
    """``rows``' count, and its chunks of ``chunk_rows`` rows (None: one) each with
    its idempotency key (:func:`chunk_key`), in the order they are sent.

    Raises:
        InvalidInput: ``chunk_rows`` is below 1, or ``rows`` is not a batch.
    """
    if chunk_rows is not None and chunk_rows < 1:
        raise InvalidInput(f"chunk_rows must be at least 1, not {chunk_rows}", field="chunk_rows")
    batch = as_batch(rows)
    size = chunk_rows or max(1, len(batch))
    count = max(1, -(-len(batch) // size))
    chunks = list(_chunks(batch, size))
    return len(batch), [
        (chunk, chunk_key(idempotency_key, index, count)) for index, chunk in enumerate(chunks)
    ]


def chunk_nbytes(chunk: pa.Table | list[dict[str, Any]]) -> int:
    """The bytes a chunk puts on the wire, roughly (for the MB/s shown)."""
    return chunk.nbytes if not isinstance(chunk, list) else len(json.dumps(chunk, default=str))


def recipe_document(recipe: Any) -> dict[str, Any] | str:
    """A recipe as the API's ``recipe`` field takes it, read as ``load_recipe`` reads
    it: a ``Recipe`` or a mapping as its document; a :class:`~pathlib.Path`, or a
    one-line string naming a ``.yaml``/``.yml``/``.json`` file, as that file's text;
    any other string as recipe text (YAML or JSON: the server parses it).

    Raises:
        InvalidRecipe: the file cannot be read, or ``recipe`` is none of these.
    """
    if hasattr(recipe, "to_canonical_json"):
        document: dict[str, Any] = json.loads(recipe.to_canonical_json())
        return document
    if isinstance(recipe, Mapping):
        return dict(recipe)
    names_file = (
        isinstance(recipe, str)
        and "\n" not in recipe
        and recipe.strip().lower().endswith((".yaml", ".yml", ".json"))
    )
    if isinstance(recipe, Path) or names_file:
        try:
            return Path(recipe).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidRecipe(f"cannot read recipe {str(recipe)!r}: {exc}") from None
    if isinstance(recipe, str):
        return recipe
    raise InvalidRecipe(
        f"a recipe is a Recipe, a mapping, YAML/JSON text or a file path, "
        f"not a {type(recipe).__name__}"
    )


# -- progress ---------------------------------------------------------------------------
class Bar:
    """A progress display of ``total`` units (rows, bytes) and the MB/s behind them."""

    def __init__(self, label: str, total: int, unit: str, enabled: bool) -> None:
        self.label, self.total, self.unit, self.enabled = label, total, unit, enabled
        self.done = 0
        self.nbytes = 0
        self.started = time.monotonic()
        self._rich: Any = None
        self._task: Any = None
        self._last_line = 0.0

    def __enter__(self) -> Bar:
        if self.enabled:
            self._start_rich()
        return self

    def _start_rich(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
            )
        except ImportError:
            return
        count = DownloadColumn() if self.unit == "bytes" else MofNCompleteColumn()
        unit = "" if self.unit == "bytes" else f"{self.unit} "
        self._rich = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            count,
            TextColumn(unit + "{task.fields[rate]}"),
            console=Console(stderr=True),
            transient=False,
        )
        self._rich.start()
        self._task = self._rich.add_task(self.label, total=self.total or None, rate="")

    def rate(self) -> str:
        """MB/s so far ("" when nothing was sent: a job's stages)."""
        if not self.nbytes:
            return ""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return f"{self.nbytes / elapsed / 1e6:.1f} MB/s"

    def advance(self, units: int, nbytes: int) -> None:
        """Count ``units`` more done, ``nbytes`` of them sent."""
        self.done += units
        self.nbytes += nbytes
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, rate=self.rate())
        elif time.monotonic() - self._last_line > 1.0 or self.done >= self.total:
            self._last_line = time.monotonic()
            line = f"{self.label}: {self.done}/{self.total} {self.unit} {self.rate()}".rstrip()
            print(line, file=sys.stderr)

    def stage(self, name: str, fraction: float) -> None:
        """A job's stage and progress (0-1), as :data:`~service.client.Progress`."""
        self.label = name
        self.advance(int(fraction * self.total) - self.done, 0)
        if self._rich is not None:
            self._rich.update(self._task, description=name)

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.stop()


@contextmanager
def bar(label: str, total: int, unit: str, *, enabled: bool) -> Iterator[Bar]:
    """A :class:`Bar`, drawn only when ``enabled``."""
    with Bar(label, total, unit, enabled) as shown:
        yield shown


# -- objects ----------------------------------------------------------------------------
#: Bytes per read of a file being uploaded.
UPLOAD_CHUNK = 1 << 20


def file_chunks(path: Path, shown: Bar) -> Iterator[bytes]:
    """``path``'s bytes, :data:`UPLOAD_CHUNK` at a time, counted on ``shown``."""
    with open(path, "rb") as f:
        while chunk := f.read(UPLOAD_CHUNK):
            shown.advance(len(chunk), len(chunk))
            yield chunk


def upload_file(
    path: str | Path,
    sha256: str | None,
    *,
    present: Callable[[str], bool],
    put: Callable[[str, Path, Bar], object],
    progress: bool,
    attempts: int,
    retryable: Callable[[Exception], bool],
) -> str:
    """Upload ``path`` unless ``present(sha256)``; its SHA-256. ``put(sha256, path,
    bar)`` sends one attempt (counting what it sent on ``bar``).

    The file is hashed first (unless ``sha256`` is given: the server verifies it), so
    that an object stored already, by this upload interrupted or by anyone, is not
    sent again; a failed attempt ``retryable`` says is transient is retried (after
    asking ``present`` again) up to ``attempts`` times in all.

    Raises:
        NotFound: ``path`` is not a file.
        VidlakeError: the upload failed (``HashMismatch``: the file's bytes are not
            ``sha256``, or changed while it was sent; nothing was stored).
    """
    from catalog.hashing import sha256_file

    source = upload_source(path)
    digest = sha256 or sha256_file(source)[0]
    size = source.stat().st_size
    for attempt in range(1, attempts + 1):
        if present(digest):
            return digest
        try:
            with bar(f"upload {source.name}", size, "bytes", enabled=progress) as shown:
                put(digest, source, shown)
            return digest
        except Exception as exc:
            if attempt == attempts or not retryable(exc):
                raise
            time.sleep(retry_delay(attempt))
    return digest


def upload_source(path: str | Path) -> Path:
    """``path`` as the file an upload sends.

    Raises:
        NotFound: ``path`` is not a file.
    """
    source = Path(path)
    if not source.is_file():
        raise NotFound(f"file {source} not found", path=str(source))
    return source


def retry_delay(attempt: int) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1, 2, …) of an upload."""
    return min(2.0, 0.25 * 2.0**attempt)
