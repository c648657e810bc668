"""Plan access: download a snapshot's plan once per node, memory-map it in every rank.

:func:`open_plan` resolves ``version`` through a :class:`~loader.source.SnapshotSource`
to ``snapshot.json``, and makes sure ``plan.arrow`` and ``index.arrow`` sit verified in
``cache_dir``. One process per node does the download, under a file lock that the
others wait on; files go through :class:`manifests.artifacts.ArtifactCache` (temp name,
hashed against ``snapshot.json``, only then renamed into place), so a file under its
final name is always verified. ``snapshot.json`` and erasure marks are checked by
:mod:`loader.snapshot`.

Every process then memory-maps both files (:class:`loader.mapped.MappedFile`, over
:mod:`manifests.ipc`). Nothing is copied: :meth:`PlanReader.rows` returns a read-only
numpy view into the mapped ``rows`` buffer, so resident memory grows with the steps a
rank touches, not with the plan's size.

Locating a step is O(1) when the plan's record batches hold a fixed number of steps
(all but the last; the materializer's chunks do while the global batch is constant):
step ``s`` lives in batch ``s // L`` at position ``s % L``, and the ``step`` column
confirms it. A plan with uneven batches still reads correctly: opening it (or the first
miss) builds an offsets array, one entry per record batch, and steps are located by
binary search from then on. The index is located the same way by its ``row`` column.

Layout of ``cache_dir``::

    snapshots/v000001.json                   snapshot.json of version 1 (verified)
    snapshots/v000001.lock                   the download lock
    artifacts/<sha256>.plan.arrow            verified artifacts, content-addressed
    artifacts/<sha256>.plan.arrow.gcd.json   gcd of the steps' batch sizes
    artifacts/<sha256>.index.arrow
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from filelock import FileLock
from numpy.typing import NDArray

from catalog.atomic import write_bytes
from catalog.errors import IntegrityError, InvalidInput
from catalog.hashing import sha256_bytes
from loader.gather import gather
from loader.mapped import MappedFile, int_view, list_views
from loader.rowlists import Gathered, RowLists
from loader.snapshot import (
    LOADER_ARTIFACTS,
    effective_snapshot,
    erasure_mark,
    local_snapshot,
    parse_snapshot,
)
from loader.source import SnapshotSource, open_source
from manifests.artifacts import ArtifactCache
from manifests.format import (
    INDEX_NAME,
    INDEX_SCHEMA,
    PLAN_NAME,
    PLAN_SCHEMA,
)
from manifests.ipc import iter_batches

#: What :meth:`PlanReader._placed` reads: an Arrow table or gathered lists.
_Read = TypeVar("_Read", pa.Table, Gathered)

__all__ = ["PlanReader", "StepInfo", "open_plan"]


@dataclass(frozen=True)
class StepInfo:
    """One global step's scalars (the rows come from :meth:`PlanReader.rows`)."""

    step: int
    phase: int
    bucket: int
    #: Epoch of each stream at this step, indexed by stream id.
    stream_epochs: NDArray[np.int32]
    #: Rows in the step now (after a patch removed ``skipped`` of them).
    batch_size: int
    skipped: int

    @property
    def original_batch_size(self) -> int:
        """The batch size the plan was cut with; world sizes must divide it."""
        return self.batch_size + self.skipped


class PlanReader:
    """A memory-mapped snapshot plan and index (see the module docstring).

    Create it with :func:`open_plan`. Safe to pickle: the maps are dropped and reopened
    from the verified local files on first use in the receiving process.
    """

    def __init__(
        self,
        *,
        version: int,
        snapshot: dict[str, Any],
        snapshot_sha256: str,
        plan_path: Path,
        index_path: Path,
        erased_rows: NDArray[np.int64] | None = None,
        erasure_ids: tuple[str, ...] = (),
    ) -> None:
        self.version = version
        #: Manifest rows a hard-takedown erasure blanked (sorted): the dataset skips
        #: them and counts them. Empty for a version that never held erased data.
        self.erased_rows: NDArray[np.int64] = (
            erased_rows if erased_rows is not None else np.empty(0, dtype=np.int64)
        )
        self.erasure_ids = erasure_ids
        self.snapshot = snapshot
        self.snapshot_sha256 = snapshot_sha256
        self.plan_sha256: str = snapshot["artifacts"]["plan.arrow"]["sha256"]
        self.index_sha256: str = snapshot["artifacts"]["index.arrow"]["sha256"]
        self.plan_path = plan_path
        self.index_path = index_path
        self._plan_file: MappedFile | None = None
        self._index_file: MappedFile | None = None
        #: RowLists per column selection (loader.rowlists); they pin the index mapping.
        self._row_lists: dict[tuple[str, ...], RowLists] = {}
        self._allowed: list[int] | None = None
        #: The last step located (a step's info and rows are asked for in turn).
        self._last_step: tuple[int, pa.RecordBatch, int, NDArray[np.int64]] | None = None
        self._open()

    # -- lifecycle ---------------------------------------------------------------------
    def _open(self) -> None:
        self._plan_file = MappedFile(self.plan_path, PLAN_SCHEMA, "step", "plan.arrow")
        try:
            self._index_file = MappedFile(self.index_path, INDEX_SCHEMA, "row", "index.arrow")
        except BaseException:
            self._plan_file.close()
            raise
        declared = int(self.snapshot["num_steps"])
        if self._plan_file.length != declared:
            self._plan_file.build_offsets()
        found = self._plan_file.length
        if found != declared:
            self.close()
            raise IntegrityError(
                f"plan.arrow holds {found} steps, snapshot.json says {declared}",
                path=str(self.plan_path),
            )

    @property
    def _plan(self) -> MappedFile:
        if self._plan_file is None:
            self._open()
        assert self._plan_file is not None
        return self._plan_file

    @property
    def _index(self) -> MappedFile:
        if self._index_file is None:
            self._open()
        assert self._index_file is not None
        return self._index_file

    def close(self) -> None:
        """Unmap both files (reopened lazily if the reader is used again)."""
        for f in (self._plan_file, self._index_file):
            if f is not None:
                f.close()
        self._plan_file = self._index_file = None
        self._row_lists = {}
        self._last_step = None

    def __enter__(self) -> PlanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plan_file"] = state["_index_file"] = None
        state["_row_lists"] = {}
        state["_last_step"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- steps -------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Global steps in the plan."""
        return int(self.snapshot["num_steps"])

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.num_steps:
            raise InvalidInput(
                f"step {step} is outside snapshot {self.version}'s plan (0..{self.num_steps - 1})",
                step=step,
                num_steps=self.num_steps,
            )

    def _step_rows(self, step: int) -> tuple[pa.RecordBatch, int, NDArray[np.int64]]:
        last = self._last_step
        if last is not None and last[0] == step and self._plan_file is not None:
            return last[1], last[2], last[3]
        self._check_step(step)
        batch, p = self._plan.locate(step)
        offsets, values = list_views(batch.column("rows"), np.int64)
        rows = values[offsets[p] : offsets[p + 1]]
        self._last_step = (step, batch, p, rows)
        return batch, p, rows

    def step_info(self, step: int) -> StepInfo:
        """Phase, bucket, stream epochs and batch size of global step ``step``."""
        batch, p, rows = self._step_rows(step)
        eo, ev = list_views(batch.column("stream_epochs"), np.int32)
        return StepInfo(
            step=step,
            phase=int(int_view(batch.column("phase"), np.int32)[p]),
            bucket=int(int_view(batch.column("bucket"), np.int32)[p]),
            stream_epochs=ev[eo[p] : eo[p + 1]],
            batch_size=len(rows),
            skipped=int(int_view(batch.column("skipped"), np.int32)[p]),
        )

    def global_rows(self, step: int) -> NDArray[np.int64]:
        """The whole global batch of ``step`` (manifest row numbers), zero-copy."""
        return self._step_rows(step)[2]

    def rows(self, step: int, rank: int, world_size: int) -> NDArray[np.int64]:
        """Rank ``rank`` of ``world_size``'s rows of ``step``: a zero-copy, read-only view.

        Rank ``r`` takes ``rows[r*B//W:(r+1)*B//W]``. ``W`` must divide the step's
        original batch size (``B + skipped``); a patched step with skipped rows is then
        split as evenly as floor division allows.

        Raises:
            InvalidInput: bad step or rank, or a world size that does not divide the
                batch (the message names the allowed sizes).
        """
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidInput(
                f"rank {rank} is not in 0..{world_size - 1}", rank=rank, world_size=world_size
            )
        batch, p, rows = self._step_rows(step)
        original = len(rows) + int(int_view(batch.column("skipped"), np.int32)[p])
        if original % world_size:
            self.check_world_size(world_size)  # names every allowed size
            raise InvalidInput(  # pragma: no cover - check_world_size raised already
                f"world size {world_size} does not divide step {step}'s batch {original}"
            )
        b = len(rows)
        return rows[rank * b // world_size : (rank + 1) * b // world_size]

    def allowed_world_sizes(self) -> list[int]:
        """Every world size that divides all steps' original batch sizes (ascending)."""
        if self._allowed is None:
            self._allowed = _divisors(_batch_gcd(self.plan_path, self.plan_sha256))
        return list(self._allowed)

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`InvalidInput` naming the allowed sizes unless ``world_size`` is one."""
        allowed = self.allowed_world_sizes()
        if world_size not in allowed and self.num_steps:
            raise InvalidInput(
                f"world size {world_size} does not divide the global batch of every step of "
                f"snapshot {self.version}; allowed world sizes: {allowed}",
                world_size=world_size,
                allowed=allowed,
            )

    # -- index -------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Manifest rows in the index."""
        return self._index.length

    def index_columns(
        self, rows: NDArray[np.int64] | list[int], columns: list[str] | None = None
    ) -> pa.Table:
        """The index records of ``rows``, in the order given (``row`` always included).

        Gathered from the mapped record batches (:func:`loader.gather.gather`); only the
        pages those rows live on are read.

        Raises:
            InvalidInput: an unknown column or a row outside the index.
        """
        keys, names = self._checked(rows, columns)
        index = self._index
        schema = pa.schema([INDEX_SCHEMA.field(n) for n in names])
        return self._placed(keys, lambda: gather(index, keys, names, schema))

    def index_rows(self, rows: NDArray[np.int64] | list[int], columns: list[str]) -> Gathered:
        """The index records of ``rows`` (columns ``columns``), in the order given, read
        straight from the mapped buffers when asked for: ``list(name)`` is what
        :meth:`index_columns` then ``to_pylist`` give (:mod:`loader.rowlists`: one
        vectorised gather a column, whatever the number of record batches the rows
        are in).

        Raises:
            InvalidInput: an unknown column or a row outside the index.
            IntegrityError: rows not where the index says, buffers outside the file.
        """
        keys, names = self._checked(rows, columns)
        index = self._index
        lists = self._row_lists.get(tuple(names))
        if lists is None:
            lists = self._row_lists[tuple(names)] = RowLists(index, names)
        return self._placed(keys, lambda: lists.gather(keys))

    def _placed(self, keys: NDArray[np.int64], read: Callable[[], _Read]) -> _Read:
        """``read()``, once the rows it read are ``keys``: a record batch not where the
        equal-batches estimate put it makes the index build its true batch offsets and
        read again, once.

        Raises:
            IntegrityError: the rows are misplaced with the true offsets too.
        """
        index = self._index
        for _ in range(2):
            got = read()
            placed = got.column("row").to_numpy() if isinstance(got, pa.Table) else got.row
            if np.array_equal(placed, keys):
                return got
            if index._offsets is not None:
                break
            index.build_offsets()
        raise IntegrityError(
            f"index.arrow at {index.path}: rows are misplaced", path=str(index.path)
        )

    def _checked(
        self, rows: NDArray[np.int64] | list[int], columns: list[str] | None
    ) -> tuple[NDArray[np.int64], list[str]]:
        """``rows`` as keys, and the column names asked (``row`` first), both checked."""
        index = self._index
        keys = np.asarray(rows, dtype=np.int64)
        names = ["row", *[c for c in (columns or INDEX_SCHEMA.names) if c != "row"]]
        unknown = set(names) - set(INDEX_SCHEMA.names)
        if unknown:
            raise InvalidInput(f"unknown index columns {sorted(unknown)}", columns=sorted(unknown))
        if len(keys) and (keys.min() < 0 or keys.max() >= index.length):
            index.build_offsets()  # the equal-batches estimate of the length may be short
            if keys.min() < 0 or keys.max() >= index.length:
                bad = int(keys[(keys < 0) | (keys >= index.length)][0])
                raise InvalidInput(f"row {bad} is outside 0..{index.length - 1}", row=bad)
        return keys, names


def _gcd_path(plan_path: Path) -> Path:
    return plan_path.with_name(plan_path.name + ".gcd.json")


def _batch_gcd(plan_path: Path, plan_sha256: str) -> int:
    """The gcd of every step's original batch size (``len(rows) + skipped``).

    A whole-plan pass, so its result is kept next to the plan (``*.gcd.json``, written
    atomically, derived from the verified file): the process that downloads the plan
    computes it once and every later open on the node reads it in O(1).
    """
    side = _gcd_path(plan_path)
    try:
        doc = json.loads(side.read_bytes())
        if doc.get("plan_sha256") == plan_sha256 and isinstance(doc.get("batch_gcd"), int):
            return int(doc["batch_gcd"])
    except (FileNotFoundError, ValueError, AttributeError):
        pass
    g = 0
    # A private mapping: its pages leave with it.
    for batch in iter_batches(plan_path, what="plan.arrow"):
        offsets, _ = list_views(batch.column("rows"), np.int64)
        sizes = np.diff(offsets).astype(np.int64)
        sizes += int_view(batch.column("skipped"), np.int32)
        if len(sizes):
            g = math.gcd(g, int(np.gcd.reduce(sizes)))
        del offsets, sizes, batch  # nothing may pin the mapping
    with contextlib.suppress(OSError):  # a read-only cache dir still works, just slower
        write_bytes(side, json.dumps({"plan_sha256": plan_sha256, "batch_gcd": g}).encode())
    return g


def _divisors(n: int) -> list[int]:
    if n <= 0:
        return []
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


# -- opening ---------------------------------------------------------------------------
def _artifacts(cache_dir: Path) -> ArtifactCache:
    # Ranks on a node share these files; one that has the right size was verified
    # before it took its name, so the ranks do not re-hash a multi-GB plan.
    return ArtifactCache(cache_dir / "artifacts", rehash=False)


def _ready(doc: dict[str, Any], cache: ArtifactCache) -> bool:
    return all(
        cache.ready(doc["artifacts"][name]["sha256"], int(doc["artifacts"][name]["size"]), name)
        for name in LOADER_ARTIFACTS
    )


def _download(
    source: SnapshotSource, version: int, doc: dict[str, Any], cache: ArtifactCache
) -> None:
    """Fetch missing artifacts into place: temp file, SHA-256 and size check, rename."""
    for name in LOADER_ARTIFACTS:
        sha, size = doc["artifacts"][name]["sha256"], int(doc["artifacts"][name]["size"])

        def fetch(tmp: Path, name: str = name, sha: str = sha) -> None:
            source.download_artifact(version, name, sha, tmp)

        cache.get(
            sha, size, fetch, name=name, what=f"{name} of snapshot {version} from {source.url}"
        )


def _local_path(cache: ArtifactCache, doc: dict[str, Any], name: str) -> Path:
    return cache.path(doc["artifacts"][name]["sha256"], name)


def open_plan(
    source: str | os.PathLike[str] | SnapshotSource,
    version: int,
    cache_dir: str | os.PathLike[str],
    *,
    lock_timeout_s: float = -1,
) -> PlanReader:
    """Open snapshot ``version``'s plan, downloading it once per node.

    Args:
        source: where the snapshot is published (see :func:`loader.source.open_source`).
        version: the snapshot version.
        cache_dir: a node-local directory shared by every rank of the node.
        lock_timeout_s: how long to wait for another process's download (-1: forever).

    Returns:
        A :class:`PlanReader` over the memory-mapped, verified files.

    Raises:
        NotFound: the version is not published.
        ChecksumMismatch: a downloaded file does not match ``snapshot.json``.
        IntegrityError: the files do not follow :mod:`manifests.format`.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidInput(f"version must be a non-negative int, got {version!r}", version=version)
    root = Path(cache_dir)
    cache = _artifacts(root)
    snap_path = root / "snapshots" / f"v{version:06d}.json"
    src = open_source(source)
    mark = erasure_mark(src, version)
    local = local_snapshot(snap_path, version)
    if local is None or not _ready(effective_snapshot(local[1], mark), cache):
        (root / "snapshots").mkdir(parents=True, exist_ok=True)
        (root / "artifacts").mkdir(parents=True, exist_ok=True)
        with FileLock(str(snap_path.with_suffix(".lock")), timeout=lock_timeout_s):
            # Whoever held the lock before us may have done the work already.
            local = local_snapshot(snap_path, version)
            if local is None:
                data, _ = src.snapshot_bytes(version)
                local = data, parse_snapshot(data, version)
                write_bytes(snap_path, data)
            if not _ready(effective_snapshot(local[1], mark), cache):
                _download(src, version, effective_snapshot(local[1], mark), cache)
                plan_sha = local[1]["artifacts"][PLAN_NAME]["sha256"]
                _batch_gcd(cache.path(plan_sha, PLAN_NAME), plan_sha)
    data, doc = local
    doc = effective_snapshot(doc, mark)
    return PlanReader(
        version=version,
        snapshot=doc,
        snapshot_sha256=sha256_bytes(data),
        plan_path=_local_path(cache, doc, PLAN_NAME),
        index_path=_local_path(cache, doc, INDEX_NAME),
        erased_rows=np.asarray(mark["erased_rows"] if mark else [], dtype=np.int64),
        erasure_ids=(str(mark["erasure_id"]),) if mark else (),
    )
