"""``StatefulLoader``: a DataLoader over a :class:`~loader.dataset.SnapshotDataset`
that knows where to resume, and whose first batches do not wait for its workers.

It records ``batch["step"] + 1`` of each batch it hands out, so ``state_dict()`` is
right whatever ``num_workers`` is.

**The hand-over.** A DataLoader worker started by ``spawn`` or ``forkserver`` imports
torch and the loader before it reads anything: seconds, two at once on a small node,
while the training process, which has already imported them, sits idle. So with
workers, each ``iter()`` reads the first steps in the training process itself (the
dataset's own threaded iterator, as with ``num_workers=0``) while the workers start.
The first worker to be ready claims the hand-over step ``H``: the first step the
training process has not yet submitted for reading. The training process stops
submitting there, hands out what it read (steps ``< H``), then the DataLoader's batches,
whose workers read steps ``H + w, H + w + N, …``. A small shared array holds the two
numbers under one lock (made as the workers start, so the first batch does not wait
for it), so every step is read exactly once and the batch sequence is
the same as without the hand-over (and with any ``num_workers``). If the training
process reaches the end first, the workers find nothing left and are shut down unread.

Workers under ``fork`` are started before the training process starts its own
threads (a fork with live threads can inherit a held lock); under ``spawn`` and
``forkserver``, from a background thread once the first batch is assembled, so their
start (a fork server's ``Process.start()`` waits for the server's imports) blocks
nothing and their imports do not compete with that batch for the CPU. Under
``forkserver`` the fork server preloads
:mod:`loader.dataset` (and so torch): it imports them once, and every worker, including
the next ``iter()``'s, is a fork of it. ``loader.handed_over_at`` is the step of the
last ``iter()``'s hand-over.

**Persistent workers.** A DataLoader's kept workers start each epoch's iterator again
but keep the dataset copy (and cursor) they were started with, which is why a bare
DataLoader over the dataset must not keep them. ``StatefulLoader`` keeps one DataLoader
and one cell; each ``iter()`` resets the cell to the recorded step and the kept
workers, ready at once, claim their start from it (the first step or close to it). A
claim made late by an iterator of the epoch before lands on the new cell too, and is
then the hand-over both sides use: the DataLoader drops that iterator's batches.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import threading
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, IterableDataset

from catalog.errors import InvalidInput
from loader.device import prefetch_to_device

if TYPE_CHECKING:
    from loader.dataset import SnapshotDataset

__all__ = ["StatefulLoader"]

_Context = multiprocessing.context.BaseContext


class StatefulLoader:
    """A ``DataLoader`` over a :class:`SnapshotDataset` that knows where to resume.

    A new DataLoader (and new workers) is made for every ``iter()``, starting at the
    recorded step, unless ``persistent_workers``; with workers, the first steps are read
    in this process until they are ready (see the module docstring).

    Args:
        dataset: the dataset.
        num_workers: DataLoader worker processes.
        hand_over: with workers, read the first steps in this process while they start
            (default on; off: wait for the workers' first batch).
        **dataloader_kwargs: passed on (``pin_memory``, ``prefetch_factor``,
            ``multiprocessing_context``, ``persistent_workers``, …); ``batch_size`` is
            always None. ``persistent_workers`` needs workers and ``hand_over``: kept
            workers claim their start step from the hand-over cell on every ``iter()``.
    """

    def __init__(
        self,
        dataset: SnapshotDataset,
        *,
        num_workers: int = 0,
        hand_over: bool = True,
        **dataloader_kwargs: Any,
    ):
        persistent = bool(dataloader_kwargs.pop("persistent_workers", False))
        if persistent and not (num_workers and hand_over):
            # Without the shared hand-over step a persistent worker keeps the cursor it
            # was started with: after load_state_dict it would read the wrong steps.
            raise InvalidInput("persistent_workers needs num_workers > 0 and hand_over")
        if num_workers < 0:
            raise InvalidInput(f"num_workers must be >= 0, got {num_workers}")
        dataloader_kwargs.pop("batch_size", None)
        self.dataset = dataset
        self.num_workers = num_workers
        self.hand_over = hand_over
        self._context = _context(dataloader_kwargs.pop("multiprocessing_context", None))
        self._kwargs = dataloader_kwargs
        self._next_step = dataset.next_step
        self._hand: _HandOver | None = None
        self.persistent_workers = persistent
        self._kept: tuple[DataLoader[dict[str, Any]], _HandOver] | None = None

    @property
    def handed_over_at(self) -> int | None:
        """The step at which the workers took over in the last ``iter()`` (the end step
        when this process read them all; None: not decided yet, or no hand-over)."""
        step = -1 if self._hand is None else self._hand.step
        return None if step < 0 else step

    def __iter__(self) -> Generator[dict[str, Any], None, None]:
        self.dataset.seek(self._next_step)
        self._hand = None
        if self.num_workers and self.hand_over:
            batches: Iterator[dict[str, Any]] = self._handed_over()
        else:
            batches = iter(self._dataloader(self.dataset))
        # Without workers the dataset's own iterator runs the device ring (depth 0: none).
        depth = self.dataset.prefetch_to_device if self.num_workers else 0
        ring = prefetch_to_device(batches, depth, self.dataset.device)
        try:
            for batch in ring:
                self._next_step = int(batch["step"]) + 1
                yield batch
        finally:
            ring.close()

    def _dataloader(self, dataset: IterableDataset[dict[str, Any]]) -> DataLoader[dict[str, Any]]:
        if self.num_workers:
            self._kwargs["multiprocessing_context"] = self._context
            self._kwargs["persistent_workers"] = self.persistent_workers
        return DataLoader(dataset, batch_size=None, num_workers=self.num_workers, **self._kwargs)

    def _handed_over(self) -> Generator[dict[str, Any], None, None]:
        """This process's batches up to the hand-over step, then the workers'."""
        ds = self.dataset
        end = max(ds.next_step, ds._end())
        loader, hand = self._loader_and_hand(ds.next_step, end)
        # Workers already running (persistent) are not forked again: start them later.
        workers = _Workers(loader, hand, self._context, forks=hand.fresh)
        hand.fresh = False
        if workers.early:
            workers.start()
        own = ds._iterate(hand.own_steps(), track=True)
        try:
            for batch in own:
                workers.start()  # once; after the first batch is assembled unless early
                yield batch
            if workers.started:
                # Raises what starting them raised, even when none of their steps is left.
                batches = workers.batches()
                if hand.step < end:
                    yield from batches
        finally:
            own.close()
            workers.close()

    def _loader_and_hand(
        self, start: int, end: int
    ) -> tuple[DataLoader[dict[str, Any]], _HandOver]:
        """A new DataLoader and hand-over cell; with persistent workers, the kept ones,
        the cell reset to ``start`` (the workers claim from it again each ``iter()``)."""
        if self._kept is not None:
            loader, hand = self._kept
            hand.reset(start, end)
        else:
            hand = _HandOver(self._context, start, end)
            loader = self._dataloader(_FromHandOver(self.dataset, hand))
            if self.persistent_workers:
                self._kept = (loader, hand)
        self._hand = hand
        return loader, hand

    def __len__(self) -> int:
        return max(0, self.dataset._end() - self._next_step)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's state at the step after the last batch handed out."""
        return self.dataset.state_dict(next_step=self._next_step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state["next_step"]`` (see :meth:`SnapshotDataset.load_state_dict`)."""
        self.dataset.load_state_dict(state)
        self._next_step = self.dataset.next_step


class _HandOver:
    """Where the training process stops reading and the workers start, decided once.

    ``cell[0]`` is the next step the training process would submit, ``cell[1]`` the
    hand-over step (-1: not yet). Both change under the array's lock, so the step a
    worker claims is exactly the first one the training process did not take. Until
    :meth:`share` (as the workers start) the two numbers are this process's alone,
    under a thread lock: making the shared array costs ~40 ms under ``spawn`` (it starts
    multiprocessing's resource tracker), which the first batch then does not wait for.
    """

    def __init__(self, context: _Context, start: int, end: int):
        self._end = end
        self._context: _Context | None = context
        self._local = [start, -1]
        self._switch = threading.Lock()
        self._cell: Any = None
        self.fresh = True  # no iter() has used it yet

    def share(self) -> None:
        """Move the two numbers into shared memory (any thread; before a worker starts)."""
        if self._cell is not None:
            return
        assert self._context is not None
        cell = self._context.Array("q", 2)  # the slow part, outside the lock
        with self._switch:
            cell[0], cell[1] = self._local
            self._cell = cell

    @contextlib.contextmanager
    def _numbers(self) -> Iterator[Any]:
        """The two numbers, locked: this process's until shared, then the shared cell."""
        with self._switch:
            if self._cell is None:
                yield self._local
                return
        with self._cell.get_lock():
            yield self._cell

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into a starting worker, which takes the shared cell (and no context).
        assert self._cell is not None, "share() before the workers start"
        return {"_end": self._end, "_context": None, "_local": [], "_cell": self._cell}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _switch=threading.Lock(), fresh=False)

    def reset(self, start: int, end: int) -> None:
        """A new ``iter()`` over kept workers: nothing claimed, the rank starts at ``start``."""
        with self._numbers() as cell:
            cell[0], cell[1] = start, -1
        self._end = end

    @property
    def step(self) -> int:
        """The hand-over step (the end when the training process read every step)."""
        with self._numbers() as cell:
            return int(cell[1])

    def own_steps(self) -> Generator[int, None, None]:
        """The steps the training process reads: from the start until a worker claims
        the rest (or to the end, which then leaves the workers nothing)."""
        while True:
            with self._numbers() as cell:
                step = int(cell[0])
                if cell[1] >= 0:
                    return
                if step >= self._end:
                    cell[1] = self._end
                    return
                cell[0] = step + 1
            yield step

    def claim(self) -> int:
        """In a worker: the hand-over step, fixed by the first worker to ask."""
        with self._numbers() as cell:
            if cell[1] < 0:
                cell[1] = cell[0]
            return int(cell[1])


class _FromHandOver(IterableDataset[dict[str, Any]]):
    """What each DataLoader worker iterates: the dataset from the hand-over step on."""

    def __init__(self, dataset: SnapshotDataset, hand: _HandOver):
        super().__init__()
        self.dataset = dataset
        self.hand = hand

    def __iter__(self) -> Generator[dict[str, Any], None, None]:
        # Claimed on the first request, when this worker is ready to read; the dataset
        # then gives worker w the steps H + w, H + w + N, … as without a hand-over.
        self.dataset.seek(self.hand.claim())
        yield from self.dataset


class _Workers:
    """The DataLoader's iterator, started once: in the training thread under ``fork``
    (before this process has threads of its own to fork), else in a background thread,
    because a ``forkserver`` ``Process.start()`` blocks until the server has imported
    its preloads (seconds) and a ``spawn`` one pickles the dataset per worker."""

    def __init__(
        self,
        loader: DataLoader[dict[str, Any]],
        hand: _HandOver,
        context: _Context,
        *,
        forks: bool,
    ):
        self.early = forks and context.get_start_method() == "fork"
        self.started = False
        self._loader = loader
        self._hand = hand
        self._iter: Iterator[dict[str, Any]] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        if self.early:
            self._hand.share()
            self._iter = iter(self._loader)
        else:
            self._thread = threading.Thread(target=self._run, name="vidlake-workers")
            self._thread.start()

    def _run(self) -> None:
        try:
            self._hand.share()  # here, not in the training thread: ~40 ms under spawn
            self._iter = iter(self._loader)
        except BaseException as exc:  # re-raised in the training thread by batches()
            self._error = exc

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def batches(self) -> Iterator[dict[str, Any]]:
        self._join()
        if self._error is not None:
            raise self._error
        assert self._iter is not None
        return self._iter

    def close(self) -> None:
        """Drop the iterator: the DataLoader shuts its workers down when it is collected."""
        self._join()
        self._iter = None


def _context(given: str | _Context | None) -> _Context:
    """The workers' multiprocessing context (the DataLoader's default: the platform's)."""
    try:
        ctx = multiprocessing.get_context(given) if isinstance(given, str | None) else given
    except ValueError as exc:
        raise InvalidInput(f"unknown multiprocessing_context {given!r}") from exc
    if ctx.get_start_method() == "forkserver":
        _preload_loader()
    return ctx


def _preload_loader() -> None:
    """Have the fork server import the loader (and torch) once, before its first fork;
    no effect once it runs. Keeps the modules already asked for (``__main__``)."""
    server = multiprocessing.forkserver._forkserver
    wanted = list(getattr(server, "_preload_modules", ["__main__"]))
    if "loader.dataset" not in wanted:
        server.set_forkserver_preload([*wanted, "loader.dataset"])
