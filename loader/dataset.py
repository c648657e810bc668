"""``SnapshotDataset``: one rank-local batch per global step, exact and resumable.

The dataset is a cursor over a snapshot's plan: a pure function of (snapshot, step,
rank, world size). Step ``s`` gives rank ``r`` of ``W`` the rows
``rows[s][r*B//W:(r+1)*B//W]``; their latents come through the node cache, are decoded
by format and stacked per tensor key. Resuming is a seek (``load_state_dict``), never
a replay, and any world size that divides the batch continues the same sample
sequence.

With ``DataLoader(ds, batch_size=None, num_workers=N)`` worker ``w`` takes the steps
``start + w, start + w + N, …``, which is the order in which the DataLoader collects
them round-robin, so batches arrive in step order. Workers run in other processes, so
the dataset object in the training process cannot see their progress: record
``batch["step"] + 1`` as the next step (``ds.state_dict(next_step=…)``) or iterate
through :class:`StatefulLoader`, which does that.

Each iterator owns a bounded thread pool (one thread per CPU by default) that fetches
and decodes the rows of the next ``prefetch_steps`` steps while the current one trains,
so cache misses hide under step time. Each step is cut into one part per thread (a
step whose rows are all pack members: one part, so each pack is leased and opened once
a step), read under one :class:`~loader.leases.LeaseSet` (two SQLite transactions per
part, not two per row); leases are held only while their part is read; closing the iterator
(exhaustion, ``close()``, an exception, garbage collection) cancels what is queued and
joins the threads.

A latent member whose stored bytes fail their SHA-256 is skipped by every rank that is
handed it, the same way at the same step, and recorded for quarantine
(``on_corrupt="skip"``; ``"fail"`` raises): the rule is in :mod:`loader.corrupt`.

Why this module is near 600 lines: the dataset's cursor, its per-step
submission and its per-part reading share the plan reader, the source, the node cache
and the batch pool of one object; the pieces that stand alone already live elsewhere
(:mod:`loader.batch`, :mod:`loader.leases`, :mod:`loader.decode`, :mod:`loader.plan`).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock
from numpy.typing import NDArray
from torch.utils.data import IterableDataset, get_worker_info

from catalog.errors import ChecksumMismatch, IntegrityError, InvalidInput
from loader.batch import (
    SHARED_MEMORY,
    Allocator,
    BatchBuffer,
    BufferPool,
    Outcome,
    PartOut,
    Step,
    StepParts,
    outcome,
    shared_pool,
)
from loader.cache import NodeCache
from loader.corrupt import (
    Corrupt,
    OnCorrupt,
    check_policy,
    confirm_and_record,
    drop_recorded,
    named_error,
)
from loader.decode import (
    copy_into,
    decode_file,
    sniff_format,
    trim_frames,
)
from loader.device import check_device, prefetch_to_device
from loader.leases import LeaseSet
from loader.packs import (
    BULK_MAX,
    DEFAULT_PACK_MAX_BYTES,
    FALLBACK,
    MEMBER_FRACTION,
    UNPACKABLE,
    group_packed,
    read_pack_rows,
)
from loader.plan import PlanReader, StepInfo, open_plan
from loader.rowlists import Gathered
from loader.rowread import read_safetensors_row
from loader.source import SnapshotSource, open_source
from loader.stateful import StatefulLoader  # re-exported: it lived here before

__all__ = ["SnapshotDataset", "StatefulLoader"]

#: A step's index columns as Python lists, one value per row (``_INDEX_COLUMNS``).
_Columns = dict[str, list[Any]]


#: The columns the fetch threads read by row (captions and text embeddings are picked
#: per row's variant in the step's submission instead).
_ROW_COLUMNS = [
    "num_frames",
    "clip_id",
    "object_sha256",
    "offset",
    "length",
    "member_sha256",
    "format",
    "tensor_keys",
]

_INDEX_COLUMNS = [
    "num_frames",
    "clip_id",
    "stream",
    "object_sha256",
    "offset",
    "length",
    "member_sha256",
    "format",
    "tensor_keys",
    "captions",
    "text_embedding_sha256",
]


class SnapshotDataset(IterableDataset[dict[str, Any]]):
    """Rank-local batches of a published snapshot, in step order.

    Args:
        source: where the snapshot is published: ``http://host:port`` (a vidlake
            service), ``s3://bucket/prefix`` or a local store path, or an open source.
        version: the snapshot version.
        rank: this process's rank.
        world_size: ranks in the job; must divide every step's global batch.
        cache_dir: node-local directory shared by all ranks (plan files and cache).
        cache_budget_bytes: the node cache's budget; every process on the node must
            pass the same value.
        prefetch_steps: steps fetched ahead of the one being consumed (0: none).
        prefetch_threads: threads per iterator doing fetch and decode (default: the
            CPUs this process may use, at most 8; more threads than cores only
            contend on the GIL for warm reads).
        start_step: first step (``load_state_dict`` overrides it).
        end_step: one past the last step (default: the plan's end).
        verify_hits: have the cache re-hash objects on hit (see ``loader.cache``).
        cache_reserve_bytes: free disk the cache keeps (default: the cache's).
        cache_full_wait_s: how long a miss waits for other processes' leases when the
            budget is full, before raising :class:`CacheFull`.
        text_embeddings: fetch the caption variant's text embedding when present.
        token: bearer token for a service source.
        endpoint_url: S3-compatible endpoint for an ``s3://`` source.
        path_style: S3 path-style addressing.
        on_corrupt: ``"skip"`` drops a row whose member's stored bytes fail their
            SHA-256 (counted in ``batch["corrupt"]``), ``"fail"`` raises
            :class:`ChecksumMismatch`; both record it for quarantine (:mod:`loader.corrupt`).
        prefetch_to_device: batches copied to ``device`` ahead of the consumer, from
            pinned memory on a side CUDA stream (:mod:`loader.device`; 0: off). Done in
            the training process: by this dataset's own iterator, or by
            :class:`StatefulLoader` when DataLoader workers produce the batches.
        device: the target of ``prefetch_to_device`` (default ``cuda``).
        pack_max_bytes: rows whose latent is a small member (at most 1/16) of an
            object of at most this many bytes (and at most 1/16 of the cache budget)
            are read through the whole object, cached as one entry
            (:mod:`loader.packs`); 0: every member is its own entry.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | SnapshotSource,
        version: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        cache_dir: str | os.PathLike[str],
        cache_budget_bytes: int,
        prefetch_steps: int = 2,
        prefetch_threads: int | None = None,
        start_step: int = 0,
        end_step: int | None = None,
        verify_hits: bool = True,
        cache_reserve_bytes: int | None = None,
        cache_full_wait_s: float = 30.0,
        text_embeddings: bool = True,
        token: str | None = None,
        endpoint_url: str | None = None,
        path_style: bool | None = None,
        on_corrupt: OnCorrupt = "skip",
        prefetch_to_device: int = 0,
        device: str | torch.device | None = None,
        pack_max_bytes: int = DEFAULT_PACK_MAX_BYTES,
    ) -> None:
        super().__init__()
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidInput(f"rank {rank} is not in 0..{world_size - 1}", rank=rank)
        if prefetch_threads is None:
            prefetch_threads = _default_threads()
        if prefetch_steps < 0 or prefetch_threads < 1:
            raise InvalidInput("prefetch_steps must be >= 0 and prefetch_threads >= 1")
        if pack_max_bytes < 0:
            raise InvalidInput(f"pack_max_bytes must be >= 0, got {pack_max_bytes}")
        if start_step < 0:
            raise InvalidInput(f"start_step must be >= 0, got {start_step}", step=start_step)
        self.source = source if isinstance(source, SnapshotSource) else os.fspath(source)
        self.version = version
        self.rank = rank
        self.world_size = world_size
        self.cache_dir = Path(cache_dir)
        self.cache_budget_bytes = cache_budget_bytes
        self.prefetch_steps = prefetch_steps
        self.prefetch_threads = prefetch_threads
        self.end_step = end_step
        self.verify_hits = verify_hits
        self.cache_reserve_bytes = cache_reserve_bytes
        self.cache_full_wait_s = cache_full_wait_s
        self.text_embeddings = text_embeddings
        self.on_corrupt = check_policy(on_corrupt)
        self.device = check_device(prefetch_to_device, device)
        self.prefetch_to_device = prefetch_to_device
        self.pack_max_bytes = pack_max_bytes
        self._source_kw = {"token": token, "endpoint_url": endpoint_url, "path_style": path_style}
        self._next_step = start_step
        self._plan: PlanReader | None = None
        self._src: SnapshotSource | None = None
        self._sizes: dict[str, int] = {}
        #: Packs whose stored bytes failed their SHA-256: read member by member.
        self._unpackable: set[str] = set()
        self._erased_skipped = 0
        self._corrupt_skipped = 0
        self._buffers: BufferPool | None = None

    # -- lazily created per process ----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Clients are per process; the plan reader pickles as paths and remaps lazily.
        state.update(_src=None, _sizes={}, _buffers=None, _unpackable=set())
        return state

    @property
    def plan(self) -> PlanReader:
        """The memory-mapped plan (downloaded once per node on first use)."""
        if self._plan is None:
            plan = open_plan(self._open_source(), self.version, self.cache_dir)
            plan.check_world_size(self.world_size)
            self._plan = plan
        return self._plan

    def _buffer_pool(self) -> BufferPool:
        if self._buffers is None:
            self._buffers = shared_pool(keep=self.prefetch_steps + 3)
        return self._buffers

    def _open_source(self) -> SnapshotSource:
        if self._src is None:
            self._src = open_source(self.source, **self._source_kw)  # type: ignore[arg-type]
        return self._src

    def _node_cache(self) -> NodeCache:
        # One cache object per iterator: its SQLite connections die with it.
        kwargs: dict[str, Any] = {"full_wait_s": self.cache_full_wait_s}
        if self.cache_reserve_bytes is not None:
            kwargs["reserve_bytes"] = self.cache_reserve_bytes
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # Opening serialised per node: processes creating the cache database at the same
        # moment can trip over SQLite's switch to WAL mode ("database is locked").
        with FileLock(str(self.cache_dir / "latents.lock")):
            return NodeCache(
                self.cache_dir / "latents",
                self.cache_budget_bytes,
                verify_hits=self.verify_hits,
                **kwargs,
            )

    def close(self) -> None:
        """Unmap the plan (remapped lazily if the dataset is used again).

        Iterators own their threads and cache connections and release them when they
        end or are closed.
        """
        if self._plan is not None:
            self._plan.close()

    def __enter__(self) -> SnapshotDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Skip accounting: ``erased_rows`` of the plan (manifest rows a hard
        takedown erased); ``erased_skipped`` and ``corrupt_skipped``, the rank-local
        rows this process's iteration skipped because they were erased or corrupt
        (each batch also carries its own counts as ``batch["erased"]`` and
        ``batch["corrupt"]``, which is what DataLoader workers report)."""
        plan = self.plan
        return {
            "erased_rows": int(plan.erased_rows.size),
            "erasure_ids": list(plan.erasure_ids),
            "erased_skipped": self._erased_skipped,
            "corrupt_skipped": self._corrupt_skipped,
        }

    @property
    def next_step(self) -> int:
        """The step the next iterator starts at (advanced only by in-process iteration)."""
        return self._next_step

    def state_dict(self, next_step: int | None = None) -> dict[str, Any]:
        """``{"version", "plan_sha256", "next_step"}``.

        Args:
            next_step: the step to resume at. Pass ``batch["step"] + 1`` of the last
                batch trained on when DataLoader workers run the iteration; default is
                this object's own cursor (right for ``num_workers=0``).
        """
        step = self._next_step if next_step is None else next_step
        return {"version": self.version, "plan_sha256": self.plan.plan_sha256, "next_step": step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state["next_step"]`` in O(1).

        Raises:
            InvalidInput: a malformed state, a state from another plan (both SHA-256s
                named), or a step outside the plan.
        """
        try:
            sha, step = str(state["plan_sha256"]), int(state["next_step"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"not a SnapshotDataset state: {state!r}") from exc
        plan = self.plan
        if sha != plan.plan_sha256:
            raise InvalidInput(
                f"state is from plan {sha} (snapshot {state.get('version')}), this dataset "
                f"reads plan {plan.plan_sha256} (snapshot {self.version})",
                state_plan_sha256=sha,
                plan_sha256=plan.plan_sha256,
            )
        self.seek(step)

    def seek(self, step: int) -> None:
        """Make the next iterator start at global step ``step`` (``0..num_steps``)."""
        if not 0 <= step <= self.plan.num_steps:
            raise InvalidInput(f"step {step} is outside 0..{self.plan.num_steps}", step=step)
        self._next_step = step

    # -- iteration ---------------------------------------------------------------------
    def __len__(self) -> int:
        """Steps left from the cursor (what one iterator yields in this process)."""
        return max(0, self._end() - self._next_step)

    def _end(self) -> int:
        n = self.plan.num_steps
        return n if self.end_step is None else min(self.end_step, n)

    def __iter__(self) -> Generator[dict[str, Any], None, None]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        steps = range(self._next_step + worker, self._end(), workers)
        batches = self._iterate(steps, track=info is None)
        return batches if info is not None or self.device is None else self._on_device(batches)

    def _on_device(
        self, batches: Generator[dict[str, Any], None, None]
    ) -> Generator[dict[str, Any], None, None]:
        # The ring pulls batches ahead: the cursor is the step after the one handed over.
        ring = prefetch_to_device(batches, self.prefetch_to_device, self.device)
        try:
            for batch in ring:
                self._next_step = int(batch["step"]) + 1
                yield batch
        finally:
            ring.close()

    def _iterate(
        self, steps: Iterable[int], *, track: bool
    ) -> Generator[dict[str, Any], None, None]:
        plan = self.plan
        cache = self._node_cache()
        executor = ThreadPoolExecutor(self.prefetch_threads, thread_name_prefix="vidlake-prefetch")
        # In the training process, recycle batch memory (see BufferPool), across every
        # dataset and iterator of the process: a new epoch or a resume writes into warm pages.
        # In a DataLoader worker, write batches into shared memory: they cross without a copy.
        buffers = self._buffer_pool() if track else SHARED_MEMORY
        pending: collections.deque[Step] = collections.deque()
        todo = iter(steps)
        failed = self._open_source().failed_members()  # the shared record, once

        def top_up(depth: int) -> None:
            while len(pending) < depth and (step := next(todo, None)) is not None:
                pending.append(self._submit(executor, buffers, cache, plan, step, failed))

        try:
            top_up(self.prefetch_steps + 1)
            while pending:
                current = pending.popleft()
                # While the consumer holds step s, steps s+1 .. s+K are in flight.
                top_up(self.prefetch_steps)
                batch = current.assemble()
                if track:
                    self._next_step = current.info.step + 1
                    self._erased_skipped += current.erased
                    self._corrupt_skipped += current.corrupt
                yield batch
                # With prefetch_steps=0 nothing is in flight while the consumer holds a
                # step: submit the next one only now.
                if not pending:
                    top_up(1)
        finally:
            for item in pending:
                item.cancel()
            executor.shutdown(wait=True, cancel_futures=True)
            cache.close()

    def _submit(
        self,
        executor: ThreadPoolExecutor,
        buffers: Allocator | None,
        cache: NodeCache,
        plan: PlanReader,
        step: int,
        failed: frozenset[str] = frozenset(),
    ) -> Step:
        info = plan.step_info(step)
        rows = plan.rows(step, self.rank, self.world_size)
        erased = 0
        if plan.erased_rows.size:
            # Rows a hard takedown erased are blanked in the index: skip, and count.
            keep = ~np.isin(rows, plan.erased_rows)
            erased = int(rows.size - keep.sum())
            rows = rows[keep]
        # Lists straight from the mapped index, one vectorised gather a column
        # (loader.rowlists): a step's 256 rows cost ~5x less than Arrow takes per
        # record batch, then to_pylist, did.
        got = plan.index_rows(rows, _INDEX_COLUMNS)
        cols = {name: got.values(name) for name in _ROW_COLUMNS}
        variants = _caption_variants(got, rows, info)
        cols["captions"] = got.pick("captions", variants)
        cols["text_embedding_sha256"] = self._embedding_shas(got, variants)
        rows, cols, known = drop_recorded(rows, cols, failed, step, self.on_corrupt)
        n = len(rows)
        buffer = BatchBuffer(n, buffers)
        embed_shas: list[str | None] = cols["text_embedding_sha256"]
        # One task per part of the step (one per thread), its rows' results in lists;
        # a step of pack members is one part: its packs are leased, opened and copied
        # from once, not once per part (steps in flight still fill the threads).
        threads = 1 if _all_members(cols, self.pack_max_bytes) else self.prefetch_threads
        tasks = [
            executor.submit(self._load_part, cache, cols, buffer, embed_shas, part)
            for part in _parts(n, threads)
        ]
        parts = StepParts(tasks)
        return Step(info, rows, cols, cols["captions"], buffer, parts, erased, known)

    def _embedding_shas(self, got: Gathered, variants: NDArray[np.int64]) -> list[str | None]:
        """Each row's text embedding for its caption variant, None where it has none
        (or text embeddings are off)."""
        if not self.text_embeddings:
            return [None] * len(variants)
        counts = got.counts("text_embedding_sha256")
        pick = np.where((variants >= 0) & (variants < counts), variants, -1)
        if not (pick >= 0).any():
            return [None] * len(variants)
        return [sha or None for sha in got.pick("text_embedding_sha256", pick)]

    def _load_part(
        self,
        cache: NodeCache,
        cols: _Columns,
        buffer: BatchBuffer,
        embed_shas: list[str | None],
        part: range,
    ) -> PartOut:
        """Read rows ``part`` of a step under one :class:`LeaseSet`: the cached objects
        are leased in one transaction and all returned in one more (docs/cache.md);
        small members of a pack through one entry per pack (:mod:`loader.packs`).
        Returns the rows' latent and text-embedding results and failures
        (:data:`~loader.batch.PartOut`)."""
        # A part pins whole packs: none over a sixteenth of the budget.
        bound = min(self.pack_max_bytes, self.cache_budget_bytes // MEMBER_FRACTION)
        packs, rest = group_packed(cols, part, self._object_size, bound, self._unpackable)
        members, lengths = cols["member_sha256"], cols["length"]
        wanted = [(members[i], lengths[i]) for i in rest]
        wanted += [(obj, self._sizes[obj]) for obj in packs]
        latents: list[Any] = []
        latent_errors: dict[int, BaseException] = {}
        shas = embed_shas[part.start : part.stop]
        embeds: list[Any] = [None] * len(part)
        embed_errors: dict[int, BaseException] = {}
        with cache.leases(wanted) as held:
            packed: dict[int, object] = {}
            for obj, rows in packs.items():
                try:
                    packed.update(self._read_pack(held, obj, rows, cols, buffer))
                except Exception as exc:  # the pack's rows fail, each as its own
                    packed.update(dict.fromkeys(rows, exc))
            if not rest and list(packed.values()).count(None) == len(part):
                latents = [None] * len(part)  # every row landed through its pack
            else:
                for j, i in enumerate(part):
                    latent, failed = self._row_outcome(held, cols, buffer, i, packed)
                    latents.append(latent)
                    if failed is not None:
                        latent_errors[j] = failed
            if shas.count(None) != len(shas):
                for j, sha in enumerate(shas):
                    if sha:
                        embeds[j], failed = outcome(self._load_embedding, held, sha)
                        if failed is not None:
                            embed_errors[j] = failed
        return latents, latent_errors, embeds, embed_errors

    def _row_outcome(
        self, held: LeaseSet, cols: _Columns, buffer: BatchBuffer, i: int, packed: dict[int, object]
    ) -> Outcome:
        """Row ``i``'s latent outcome: as its pack read it, or read the per-member way."""
        got = packed.get(i, FALLBACK)
        if got is UNPACKABLE:
            self._unpackable.add(cols["object_sha256"][i])
        if got is FALLBACK or got is UNPACKABLE:
            return outcome(self._load_latent, held, cols, buffer, i)
        if got is None:
            return None, None
        return outcome(self._latent_failed, cols, i, got)

    def _load_latent(
        self, held: LeaseSet, cols: _Columns, buffer: BatchBuffer, i: int
    ) -> dict[str, torch.Tensor] | Corrupt | None:
        """Fetch row ``i``'s latent and decode it into its row of the batch tensors.

        Returns None when the row landed in the batch buffer, the decoded tensors
        when they do not fit it (the step then fails with a clear error), or
        :class:`Corrupt` when the member's stored bytes are corrupt and the policy is
        ``skip`` (:mod:`loader.corrupt`).

        Raises:
            IntegrityError: (or its ChecksumMismatch) the bytes are not what the index
                says; the error names the clip and the object (``clip_id``,
                ``object_sha256``, ``offset``, ``length`` attributes).
        """
        try:
            return self._read_latent(held, cols, buffer, i)
        except (IntegrityError, InvalidInput) as exc:
            return self._latent_failed(cols, i, exc)

    def _latent_failed(self, cols: _Columns, i: int, exc: object) -> Corrupt:
        """Row ``i`` failed with ``exc``: :class:`Corrupt` when its stored member is
        corrupt and the policy skips, else raise the error named after the row."""
        if not isinstance(exc, (IntegrityError, InvalidInput)):
            raise exc if isinstance(exc, BaseException) else TypeError(exc)
        rec = {name: cols[name][i] for name in _ROW_COLUMNS}
        err = named_error(rec, exc)
        # Recorded under either policy; only a failure of the source's own bytes counts.
        corrupt = isinstance(err, ChecksumMismatch) and confirm_and_record(
            self._open_source(), rec, self.version, err
        )
        if corrupt and self.on_corrupt == "skip":
            return Corrupt(rec["clip_id"], rec["member_sha256"])
        raise err

    def _read_latent(
        self, held: LeaseSet, cols: _Columns, buffer: BatchBuffer, i: int
    ) -> dict[str, torch.Tensor] | None:
        src = self._open_source()
        obj, off, n, member = (
            cols["object_sha256"][i],
            cols["offset"][i],
            cols["length"][i],
            cols["member_sha256"][i],
        )

        def fetch(tmp: Path) -> None:
            # Unverified on purpose: the cache hashes the file against `member` before
            # it renames it into place, and nothing reads it before that.
            src.fetch_range(obj, off, n, tmp)

        keys = cols["tensor_keys"][i]
        frames = cols["num_frames"][i]  # the bucket's: keep that many leading frames
        fmt = cols["format"][i]
        if fmt == "safetensors":
            # Header only, then each tensor's bytes straight into the batch: one copy,
            # and a hit's hash (when due) taken over those bytes (loader.rowread).
            misfit = read_safetensors_row(held, member, n, fetch, keys, frames, buffer, i)
            if misfit is None:
                return None
            path = misfit
        else:
            path = held.path(member, n, fetch)
        tensors = decode_file(path, fmt, keys, sha256=member)
        tensors = {k: trim_frames(t, frames) for k, t in tensors.items()}
        slots = buffer.slots(i, {k: (t.dtype, tuple(t.shape)) for k, t in tensors.items()})
        if slots is None:
            return tensors
        for k, t in tensors.items():
            copy_into(slots[k], t)
        return None

    def _object_size(self, sha: str) -> int:
        size = self._sizes.get(sha)
        if size is None:
            size = self._sizes[sha] = self._open_source().object_size(sha)
        return size

    def _read_pack(
        self, held: LeaseSet, obj: str, rows: list[int], cols: _Columns, buffer: BatchBuffer
    ) -> dict[int, object]:
        """Rows ``rows``, members of pack ``obj``, through its one cache entry."""
        src, size = self._open_source(), self._sizes[obj]

        def fetch(tmp: Path) -> None:
            src.fetch_range(obj, 0, size, tmp)  # hashed whole by the cache before use

        return read_pack_rows(held, obj, size, fetch, rows, cols, buffer)

    def _load_embedding(self, held: LeaseSet, sha: str) -> Any:
        src = self._open_source()
        size = self._object_size(sha)

        def fetch(tmp: Path) -> None:
            src.fetch_range(sha, 0, size, tmp)  # verified by the cache, as above

        path = held.path(sha, size, fetch)
        with open(path, "rb") as f:
            fmt = sniff_format(f.read(16))
        tensors = decode_file(path, fmt, [], sha256=sha)
        return next(iter(tensors.values())) if len(tensors) == 1 else tensors


def _default_threads() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cpus or 1))


def _all_members(cols: _Columns, pack_max_bytes: int) -> bool:
    """Whether every row's latent is a small member of a larger object (a pack
    candidate copied a pack at a time, :data:`~loader.packs.BULK_MAX`)."""
    objs, members, lengths = cols["object_sha256"], cols["member_sha256"], cols["length"]
    return (
        pack_max_bytes > 0
        and max(lengths, default=0) <= BULK_MAX
        and not any(map(str.__eq__, objs, members))
    )


def _parts(n: int, k: int) -> list[range]:
    """``range(n)`` cut into at most ``k`` contiguous, nearly equal parts."""
    k = max(1, min(k, n))
    return [range(j * n // k, (j + 1) * n // k) for j in range(k)] if n else []


def _caption_variants(got: Gathered, rows: NDArray[np.int64], info: StepInfo) -> NDArray[np.int64]:
    """Variant ``(epoch + row) % len(captions)`` of each row, epoch = the row's
    stream's epoch now (0 for a stream the plan does not know); -1: no captions."""
    stream = got.array("stream").astype(np.int64)
    epochs = info.stream_epochs
    epoch = np.zeros(len(rows), dtype=np.int64)
    known = stream < len(epochs)
    epoch[known] = epochs[stream[known]]
    counts = got.counts("captions")
    return np.where(counts > 0, (epoch + rows) % np.maximum(counts, 1), -1)
