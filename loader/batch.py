"""Assembling one step's batch: pooled tensor memory, in-place rows, the final dict.

:class:`BufferPool` recycles the memory of batch tensors the consumer let go of (one
per process, :func:`shared_pool`); :data:`SHARED_MEMORY` allocates them in shared
memory instead, for a DataLoader worker, whose batches cross to the training process;
:class:`BatchBuffer` holds one step's tensors, written in place row by row by the
fetch threads of :class:`loader.dataset.SnapshotDataset`; :class:`Step` is one step in
flight and :meth:`Step.assemble` turns it into the batch a training loop receives.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from catalog.errors import IntegrityError
from loader.corrupt import Corrupt
from loader.plan import StepInfo

__all__ = [
    "RESERVED_KEYS",
    "SHARED_MEMORY",
    "Allocator",
    "BatchBuffer",
    "BufferPool",
    "Outcome",
    "PartOut",
    "SharedMemory",
    "Step",
    "StepParts",
    "outcome",
    "shared_pool",
]

#: Keys of a batch that are not tensors from the latent (tensor keys may not use them).
RESERVED_KEYS = frozenset(
    {
        "clip_ids",
        "rows",
        "step",
        "phase",
        "bucket",
        "captions",
        "text_embeddings",
        "erased",
        "corrupt",
    }
)


#: What reading one row gave: (value, None) or (None, the exception it raised).
Outcome = tuple[Any, BaseException | None]


def outcome(fn: Callable[..., Any], *args: Any) -> Outcome:
    """Call ``fn`` and keep its result or its exception (a row's failure is its own)."""
    try:
        return fn(*args), None
    except Exception as exc:
        return None, exc


#: What a part task returns: its rows' latent results and text-embedding results, in
#: row order, and the exceptions of the rows that failed ({row in part: exception}).
PartOut = tuple[list[Any], dict[int, BaseException], list[Any], dict[int, BaseException]]


class StepParts:
    """A step's rows as the results of its part tasks, in row order.

    One Future a part and one list of results a part, not one object a row: creating
    512 of those a 256-row step and calling each one's ``result()`` cost ~0.5 ms of
    the consuming thread's GIL time at 16 KB samples (round 5's profile)."""

    __slots__ = ("_done", "_tasks")

    def __init__(self, tasks: list[Future[PartOut]]) -> None:
        self._tasks = tasks
        self._done: list[PartOut] | None = None

    def _outs(self) -> list[PartOut]:
        if self._done is None:
            self._done = [t.result() for t in self._tasks]
        return self._done

    def latents(self) -> list[Any]:
        """Each row's latent result; raises the first failed row's exception."""
        out: list[Any] = []
        for values, errors, _, _ in self._outs():
            if errors:
                raise errors[min(errors)]
            out += values
        return out

    def embeds(self) -> list[Any]:
        """Each row's text embedding (None: none); raises the first failed row's."""
        out: list[Any] = []
        for _, _, values, errors in self._outs():
            if errors:
                raise errors[min(errors)]
            out += values
        return out

    def cancel(self) -> None:
        for t in self._tasks:
            t.cancel()


class Allocator(Protocol):
    """Where a step's batch tensors live: :class:`BufferPool` or :class:`SharedMemory`."""

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor: ...


class SharedMemory:
    """Batch tensors born in shared memory, for a DataLoader worker.

    A worker's batch is pickled to the training process, and torch moves a tensor that
    is not in shared memory there first: a fresh shared block and a copy of every byte
    (``share_memory_``). Written in place into shared memory, the batch crosses as a
    handle, as ``default_collate`` does for its own batches in workers: one copy of
    each row (page cache to batch), not two. Nothing is recycled here: once handed
    over, the block belongs to the training process.
    """

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        new_shared = torch.UntypedStorage._new_shared
        storage: torch.UntypedStorage = new_shared(max(nbytes, 1))  # type: ignore[no-untyped-call]
        strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
        return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)


#: The allocator of a DataLoader worker's batches (see :class:`SharedMemory`).
SHARED_MEMORY = SharedMemory()


class BufferPool:
    """Recycles the memory of batch tensors that the consumer has let go of.

    Writing into fresh pages costs a fault and a zeroing per 4 KiB, about as much as
    the copy itself. Each batch tensor is a view of a pooled block; a finalizer on the
    numpy array that backs the tensor's storage returns the block when the last tensor
    (or view) using it is freed — in any thread. At most ``keep`` free blocks of each
    size are kept. Only used in the training process: a DataLoader worker's tensors
    move to shared memory anyway.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: dict[int, list[NDArray[np.uint8]]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            blocks = self._free.get(nbytes)
            block = blocks.pop() if blocks else None
        if block is None:
            block = _new_block(nbytes)
        view = block[:nbytes]  # a new array object: torch holds it, we watch it
        weakref.finalize(view, self._give_back, block)
        return torch.from_numpy(view).view(dtype).reshape(shape)

    def _give_back(self, block: NDArray[np.uint8]) -> None:
        with self._lock:
            blocks = self._free.setdefault(len(block), [])
            if len(blocks) < self.keep:
                blocks.append(block)


_SHARED: BufferPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool(keep: int) -> BufferPool:
    """The process's one :class:`BufferPool`, keeping at least ``keep`` free blocks of
    each size. Shared by every dataset and iterator of the process: a new dataset
    (a new epoch's, an evaluation's, a benchmark pass's) writes into pages an earlier
    one already faulted in, instead of fresh ones at a fault per page. What it retains
    is bounded as before: ``keep`` blocks per batch size."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = BufferPool(keep)
        _SHARED.keep = max(_SHARED.keep, keep)
        return _SHARED


def _drop_shared_pool() -> None:
    """After fork: the child's own pool, not one whose lock another thread may hold."""
    global _SHARED, _SHARED_LOCK
    _SHARED, _SHARED_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_shared_pool)

_HUGE = 2 << 20


def _new_block(nbytes: int) -> NDArray[np.uint8]:
    """Fresh batch memory. Blocks of 2 MiB or more are anonymous maps advised for
    transparent huge pages: the first write into fresh 4 KiB pages costs a fault per
    page, which on a VM ran at ~0.3 GB/s against 2.7-4.7 GB/s with huge pages (a
    64 MB batch of 8 MB latents). Elsewhere (no madvise, small blocks) ``np.empty``."""
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < _HUGE or advise is None:
        return np.empty(max(nbytes, 1), dtype=np.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):
        region.madvise(advise)
    return np.frombuffer(region, dtype=np.uint8)


class BatchBuffer:
    """The batch tensors of one step, allocated when its first row arrives.

    Rows of a step share a bucket, hence tensor names, dtypes and shapes; each fetch
    thread writes its row in place. A row that does not fit is kept aside and makes
    the step fail with an error naming both layouts.
    """

    def __init__(self, rows: int, pool: Allocator | None) -> None:
        self.rows = rows
        self.pool = pool
        self.layout: dict[str, tuple[torch.dtype, tuple[int, ...]]] | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        #: (header bytes, tensor names in file order, the tensor keys asked for) of a
        #: row whose file was that header then those tensors whole: loader.rowread
        #: reads the step's later rows in one preadv.
        self.whole_rows: tuple[bytes, tuple[str, ...], tuple[str, ...]] | None = None
        #: (the whole_rows it was made from, loader.packs' one-read layout of them):
        #: made once a step, shared by the step's pack readers.
        self.pack_layout: tuple[object, Any] | None = None
        #: (the whole_rows it was made from, loader.rowread's one-read layout of them):
        #: as ``pack_layout``, for rows that are one object each.
        self.one_read: tuple[object, Any] | None = None
        self._flat: dict[str, memoryview] = {}
        self._lock = threading.Lock()

    def _fits(self, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> bool:
        """Allocate the batch for the first row's layout; False for a row that differs."""
        with self._lock:
            if self.layout is None:
                self.layout = layout
                self.tensors = {
                    k: self._empty((self.rows, *shape), dtype)
                    for k, (dtype, shape) in layout.items()
                }
                self._flat = {
                    k: t.reshape(-1).view(torch.uint8).numpy().data for k, t in self.tensors.items()
                }
            elif layout != self.layout:
                return False
        return True

    def slots(
        self, i: int, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    ) -> dict[str, torch.Tensor] | None:
        """Row ``i`` of each batch tensor, or None when ``layout`` differs from the batch's."""
        if not self._fits(layout):
            return None
        return {k: t[i] for k, t in self.tensors.items()}

    def row_bytes(
        self, i: int, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    ) -> dict[str, memoryview] | None:
        """Row ``i`` of each batch tensor as writable bytes (slices of one view per
        tensor, made with the batch), or None when ``layout`` differs from the batch's."""
        if not self._fits(layout):
            return None
        out = {}
        for k, flat in self._flat.items():
            n = len(flat) // self.rows
            out[k] = flat[i * n : (i + 1) * n]
        return out

    def flats(self, names: Sequence[str]) -> list[tuple[memoryview, int]]:
        """Tensors ``names`` of the batch, each as writable bytes of the whole batch
        tensor with its bytes a row: a row's slots are then one slice each, with no lock
        and no dict (what a reader of many rows of one layout wants)."""
        return [(flat, len(flat) // self.rows) for flat in map(self._flat.__getitem__, names)]

    def _empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.pool is None:
            return torch.empty(shape, dtype=dtype)
        return self.pool.empty(shape, dtype)


class Step:
    """One step in flight: the plan's facts, its batch buffer and its rows' futures."""

    def __init__(
        self,
        info: StepInfo,
        rows: NDArray[np.int64],
        table: Mapping[str, Sequence[Any]],
        captions: list[str | None],
        buffer: BatchBuffer,
        parts: StepParts,
        erased: int = 0,
        corrupt: int = 0,
    ) -> None:
        self.info = info
        self.erased = erased
        #: Rows dropped as corrupt (loader.corrupt): recorded ones, then read ones.
        self.corrupt = corrupt
        self.rows = rows
        #: The step's index columns, one value a row (``clip_id`` and
        #: ``object_sha256`` at least).
        self.table = table
        self.captions = captions
        self.buffer = buffer
        self.parts = parts

    def cancel(self) -> None:
        self.parts.cancel()

    def assemble(self) -> dict[str, Any]:
        results = self.parts.latents()
        n = len(results)
        # The common step: every row landed in the batch (one C-level count).
        landed = results.count(None) == n
        misfits = [] if landed else list(enumerate(results))
        dropped = {i for i, r in misfits if isinstance(r, Corrupt)}
        for i, tensors in misfits:
            if tensors is not None and not isinstance(tensors, Corrupt):
                found = {k: (t.dtype, tuple(t.shape)) for k, t in tensors.items()}
                clip, obj = (self.table[c][i] for c in ("clip_id", "object_sha256"))
                raise IntegrityError(
                    f"step {self.info.step}: clip {clip} (row {int(self.rows[i])}, object "
                    f"{obj}) has tensors {found}, the rest of its bucket {self.buffer.layout}",
                    step=self.info.step,
                    row=int(self.rows[i]),
                    clip_id=clip,
                    object_sha256=obj,
                )
        batch: dict[str, Any] = {}
        for key, tensor in self.buffer.tensors.items():
            if key in RESERVED_KEYS:
                raise IntegrityError(f"tensor key {key!r} collides with a reserved batch key")
            batch[key] = tensor
        batch["clip_ids"] = list(self.table["clip_id"])
        batch["rows"] = torch.from_numpy(self.rows.copy())
        batch["step"] = self.info.step
        batch["phase"] = self.info.phase
        batch["bucket"] = self.info.bucket
        batch["captions"] = self.captions
        batch["erased"] = self.erased
        embeds = self.parts.embeds()
        if embeds.count(None) != len(embeds):
            batch["text_embeddings"] = _maybe_stack(embeds)
        self.corrupt += len(dropped)
        batch["corrupt"] = self.corrupt
        return _without(batch, dropped, n) if dropped else batch


def _without(batch: dict[str, Any], dropped: set[int], n: int) -> dict[str, Any]:
    """``batch`` without rows ``dropped`` (corrupt members): every per-row value."""
    keep = [i for i in range(n) if i not in dropped]
    index = torch.tensor(keep, dtype=torch.long)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            out[key] = value.index_select(0, index)
        elif isinstance(value, list) and len(value) == n:
            out[key] = [value[i] for i in keep]
        else:
            out[key] = value
    return out


def _maybe_stack(items: list[Any]) -> Any:
    """Stack embeddings when every row has one of one shape; else the list as is."""
    tensors = all(isinstance(t, torch.Tensor) for t in items)
    if tensors and len({tuple(t.shape) for t in items}) == 1:
        return torch.stack(items)
    return items
