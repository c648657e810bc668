"""The per-table ingest planners: what one batch adds, checked against the catalog.

A planner takes a coerced batch (:func:`catalog.coerce.coerce_batch`) and the table it
goes to, checks it against the catalog's key index (:mod:`catalog.key_index`), and returns a
:class:`Plan`: the rows to append, the counts of the result, and for assets the
near-duplicate events of a second commit. A bad row raises
:class:`~catalog.errors.InvalidBatch` naming the row and the field; a planner never
writes. :mod:`catalog.commit` runs them (again after a lost commit race).

=============== ===================================================================
table           rule
=============== ===================================================================
assets          dedup by id, eval carve-out, near-duplicate links (:mod:`catalog.rules`)
clips           the asset exists, ``split`` is the asset's, ``clip_id`` is the rule's
latents         the clip exists; objects, ranges and headers checked once per batch
scores,captions the clip exists (checked while the rows are written)
tombstones,     the asset (and ``related_asset_id``) exists
asset_events
jobs            none
=============== ===================================================================
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pyiceberg.table import Table

from catalog import link_events, rules
from catalog.errors import InvalidBatch
from catalog.key_index import KeyStore, Matches, Prepared
from catalog.key_index_rows import Packed, asset_clip_digests, packed_digests
from catalog.keycache import combined, first_occurrence, latent_key, to_numpy
from catalog.latent_headers import check_latent_headers, member_hashes, member_ranges
from catalog.objects import ObjectStore
from catalog.objects.refs import resolve_head

__all__ = ["Plan", "Planner", "first_bad"]

_HEAD_WORKERS = 16


@dataclass
class Plan:
    """What one batch adds: rows, counts, and the events of a second commit."""

    rows: pa.Table
    duplicates: int = 0
    eval: int = 0
    near_duplicates: int = 0
    events: pa.Table | None = None
    #: A check whose answer does not change the rows, run while they are written and
    #: before the commit (the Parquet write releases the GIL, so the two overlap): a
    #: clip batch's id re-derivation, a score or caption batch's clip references.
    verify: Callable[[], object] | None = None
    #: Key-index digests of ``rows`` the plan already made, per view (own, asset-keyed),
    #: each with its row in ``rows``: :meth:`KeyStore.prepare` does not make them again.
    digests: Prepared | None = None

    def counts(self, inserted: int) -> dict[str, int]:
        """The result's counts when ``inserted`` rows commit."""
        return {
            "inserted": inserted,
            "duplicates": self.duplicates,
            "eval": self.eval,
            "near_duplicates": self.near_duplicates,
        }


def _side_check(check: Callable[[], object]) -> Future[object]:
    """``check`` started on a thread of its own; its future holds the result or error."""
    done: Future[object] = Future()

    def run() -> None:
        try:
            done.set_result(check())
        except BaseException as exc:  # handed to whoever waits on the future
            done.set_exception(exc)

    threading.Thread(target=run, name="vidlake-clip-ids", daemon=True).start()
    return done


def _verified_ids(batch: pa.Table, given: pa.ChunkedArray | None) -> pa.Array:
    """The rule's clip ids of ``batch``; InvalidBatch where a ``given`` one disagrees."""
    computed = rules.clip_ids(
        batch["asset_id"],
        to_numpy(batch["t_start_s"]),
        to_numpy(batch["t_end_s"]),
        batch["split_version"],
    )
    if given is not None:
        agree = pc.or_kleene(pc.is_null(given), pc.equal(given, computed))
        if (row := first_bad(agree)) is not None:
            raise InvalidBatch(
                f"row {row}, field 'clip_id': {given[row]} is not rules.clip_id("
                f"asset_id, t_start_s, t_end_s, split_version) = {computed[row]}",
                row=row,
                field="clip_id",
            )
    return computed


def first_bad(mask: pa.ChunkedArray | pa.Array | NDArray[np.bool_]) -> int | None:
    """Index of the first False in a good-row mask (null counts as bad), or None."""
    good = mask if isinstance(mask, np.ndarray) else to_numpy(pc.fill_null(mask, False))
    bad = np.flatnonzero(~good.astype(np.bool_))
    return int(bad[0]) if len(bad) else None


class Planner:
    """The planners of one catalog.

    Args:
        keys: The catalog's key index.
        rule: The near-duplicate rule.
        eval_fraction: The frozen eval carve-out fraction.
        eval_salt: The frozen eval carve-out salt.
        objects: The object store latents live in (opened on first use).
    """

    def __init__(
        self,
        keys: KeyStore,
        rule: rules.NearDupRule,
        eval_fraction: float,
        eval_salt: str,
        objects: Callable[[], ObjectStore],
    ) -> None:
        self._keys = keys
        self._rule = rule
        self._eval_fraction = eval_fraction
        self._eval_salt = eval_salt
        self._objects = objects

    def plan_plain(self, batch: pa.Table, tbl: Table) -> Plan:
        """Jobs: no rule against the catalog."""
        return Plan(batch)

    def plan_clip_refs(self, batch: pa.Table, tbl: Table) -> Plan:
        """Scores and captions: every row's clip exists.

        The rows do not depend on the check, so it is the plan's ``verify``: it runs
        while the data file is written (the key index's searches and the Parquet write
        both release the GIL), and an unknown clip still rejects the batch with nothing
        committed (the file written for it is removed)."""
        self._keys.sync("clips")

        def verify() -> None:
            known = self._keys.has("clips", batch["clip_id"], expect=True)
            if (row := first_bad(known)) is not None:
                raise InvalidBatch(
                    f"row {row}, field 'clip_id': unknown clip {batch['clip_id'][row]}",
                    row=row,
                    field="clip_id",
                )

        return Plan(batch, verify=verify)

    def plan_asset_refs(self, batch: pa.Table, tbl: Table) -> Plan:
        """Tombstones and asset events: the asset (and a related one) exists."""
        self._keys.sync("assets")
        for col in ("asset_id", "related_asset_id"):
            if col in batch.column_names:
                known = to_numpy(pc.is_null(batch[col])) | self._keys.has(
                    "assets", batch[col], expect=True
                )
                if (row := first_bad(known)) is not None:
                    raise InvalidBatch(
                        f"row {row}, field {col!r}: unknown asset", row=row, field=col
                    )
        return Plan(batch)

    def plan_assets(self, batch: pa.Table, tbl: Table) -> Plan:
        """Assets: dedup by id, the eval carve-out, near-duplicate links."""
        self._keys.sync("assets", tbl)
        self._keys.sync("near_dup_events")
        ids = batch["asset_id"]
        dup = self._keys.has("assets", ids) | ~first_occurrence(ids, rules.hex_prefix64(ids))
        keep = np.flatnonzero(~dup)
        new = batch.take(pa.array(keep))
        if new.num_rows == 0:
            return Plan(new, duplicates=len(batch))
        is_eval = rules.eval_mask(new["asset_id"], self._eval_salt, self._eval_fraction)
        if "split" in new.column_names:
            forced_train = to_numpy(pc.fill_null(pc.equal(new["split"], "train"), False)) & is_eval
            if forced_train.any():
                row = int(keep[np.argmax(forced_train)])
                raise InvalidBatch(
                    f"row {row}, field 'split': the asset is carved into eval",
                    row=row,
                    field="split",
                )
            is_eval |= to_numpy(pc.fill_null(pc.equal(new["split"], "eval"), False))
        dup_of, near, events = self._link_near_duplicates(new)
        rows = new.drop_columns(
            [c for c in ("split", "duplicate_of", "near_duplicates") if c in new.column_names]
        )
        rows = rows.append_column(
            "split", pa.array(np.where(is_eval, "eval", "train"), pa.large_string())
        )
        rows = rows.append_column("duplicate_of", dup_of).append_column("near_duplicates", near)
        return Plan(
            rows,
            duplicates=len(batch) - new.num_rows,
            eval=int(is_eval.sum()),
            near_duplicates=new.num_rows - dup_of.null_count,
            events=events,
        )

    def _link_near_duplicates(self, new: pa.Table) -> tuple[pa.Array, pa.Array, pa.Table | None]:
        """``duplicate_of`` and ``near_duplicates`` of new assets, and the link events.

        The near-duplicate graph has an edge for every match ever recorded (each
        asset's ``near_duplicates``, ``duplicate_of``, and ``near_duplicate`` events);
        each connected group's canonical copy is :func:`rules.canonical_indices`. Only
        the groups this batch's matches touch are read (:meth:`KeyStore.near_duplicates`):
        the others cannot change.
        """
        m, rule = new.num_rows, self._rule
        none = pa.nulls(m, pa.large_string()), pa.nulls(m, pa.large_list(pa.large_string()))
        fps = (
            new["fingerprint"]
            if "fingerprint" in new.column_names
            else pa.nulls(m, pa.large_binary())
        )
        q, q_len = rules.fingerprint_matrix(fps, rule.window)
        bi, bj = rules.near_duplicate_pairs(q, q_len, q, q_len, rule, same=True)
        found = self._keys.near_duplicates(q, q_len)
        if len(found.query) == 0 and len(bi) == 0:
            return *none, None
        return _links(found, new, (bi, bj))

    def check_clip_ids(self, batch: pa.Table) -> Future[object] | None:
        """Start re-deriving a clip batch's ids, when every one is given, on a side
        thread: as soon as the batch is coerced, before its SHA-256 and key look-up,
        so that the hashing (in a worker process for a large batch,
        :mod:`catalog.hash_worker`) has the longest start on the planning. The caller
        waits for it before it returns, whatever happens; :meth:`plan_clips` takes it."""
        given = batch["clip_id"] if "clip_id" in batch.column_names else None
        if given is None or given.null_count:
            return None
        return _side_check(lambda: _verified_ids(batch, given))

    def plan_clips(
        self, batch: pa.Table, tbl: Table, checking: Future[object] | None = None
    ) -> Plan:
        """Clips: ``clip_id`` is the rule's (computed when absent), then
        :meth:`_plan_clip_rows`. ``checking``: :meth:`check_clip_ids` of the batch, if
        started (else it starts here)."""
        given = batch["clip_id"] if "clip_id" in batch.column_names else None
        if given is None or given.null_count:
            return self._plan_clip_rows(batch, tbl, _verified_ids(batch, given))
        # Every id is given: plan with them while every one is re-derived on a side
        # thread, beside the planning and then the data file's write (a large batch's
        # hashing runs in a worker process; the key index's numpy searches and the
        # Parquet write release the GIL). A wrong id still rejects the batch, and its
        # error comes first, as if checked first.
        if checking is None:
            checking = self.check_clip_ids(batch)
            assert checking is not None
        try:
            todo = self._plan_clip_rows(batch, tbl, combined(given))
        except BaseException as exc:
            error = checking.exception()  # waits: nothing outlives the call
            if isinstance(exc, InvalidBatch) and isinstance(error, InvalidBatch):
                raise error from None
            raise
        todo.verify = checking.result
        return todo

    def _plan_clip_rows(self, batch: pa.Table, tbl: Table, ids: pa.Array) -> Plan:
        """Clip rows with ``ids``: asset references, splits and duplicates."""
        self._keys.sync("assets")
        refs = pc.dictionary_encode(combined(batch["asset_id"]))  # each asset once
        splits = pa.array(self._keys.splits(refs.dictionary), pa.large_string())
        split = pc.take(splits, refs.indices)
        if (row := first_bad(pc.is_valid(split))) is not None:
            raise InvalidBatch(
                f"row {row}, field 'asset_id': unknown asset", row=row, field="asset_id"
            )
        if "split" in batch.column_names:
            agree = pc.or_kleene(pc.is_null(batch["split"]), pc.equal(batch["split"], split))
            if (row := first_bad(agree)) is not None:
                raise InvalidBatch(
                    f"row {row}, field 'split': differs from the asset's", row=row, field="split"
                )
        self._keys.sync("clips", tbl)
        # The clips' digests, made once: the duplicate check asks by the asset-keyed
        # ones (sorted here, so that it does not sort them itself), and the key index's
        # advance adds both kinds (KeyStore.prepare takes them from the plan).
        own = packed_digests(ids)
        by_asset = [g.sorted() for g in asset_clip_digests(batch["asset_id"], ids, own)]
        dup = self._keys.has("clips", ids, assets=batch["asset_id"], digests=by_asset)
        dup |= ~first_occurrence(ids, rules.hex_prefix64(ids))
        rows = batch.drop_columns([c for c in ("clip_id", "split") if c in batch.column_names])
        rows = rows.append_column("clip_id", ids).append_column("split", split)
        if dup.any():
            rows = rows.filter(pa.array(~dup))
        n_eval = int(pc.sum(pc.equal(rows["split"], "eval")).as_py() or 0)
        digests = {"clips": (_kept(own, dup), _kept(by_asset, dup))}
        return Plan(rows, duplicates=int(dup.sum()), eval=n_eval, digests=digests)

    def prepare_latents(self, batch: pa.Table) -> pa.Table:
        """The state-free latent checks, once per batch: each object exists and holds
        the member's range, a whole-object member's hash is the object's, and every
        header agrees with its row (:mod:`catalog.latent_headers`). Returns the batch
        with ``length``, ``member_sha256`` and ``object_size`` filled from the store."""
        size = self._object_sizes(batch["object_sha256"])
        if (row := first_bad(size >= 0)) is not None:
            raise InvalidBatch(
                f"row {row}, field 'object_sha256': not in the object store",
                row=row,
                field="object_sha256",
            )
        if "object_size" in batch.column_names:
            stated = to_numpy(pc.fill_null(batch["object_size"], -1)).astype(np.int64)
            if (row := first_bad((stated < 0) | (stated == size))) is not None:
                raise InvalidBatch(
                    f"row {row}, field 'object_size': the store holds {size[row]} bytes",
                    row=row,
                    field="object_size",
                )
        offset, length = member_ranges(batch, size)
        member = member_hashes(batch, (offset == 0) & (length == size))
        check_latent_headers(self._objects(), batch, offset.tolist(), length.tolist())
        rows = batch.drop_columns(
            [c for c in ("length", "member_sha256", "object_size") if c in batch.column_names]
        )
        rows = rows.append_column("length", pa.array(length, pa.int64()))
        return rows.append_column("member_sha256", member).append_column(
            "object_size", pa.array(size, pa.int64())
        )

    def plan_latents(self, batch: pa.Table, tbl: Table) -> Plan:
        """Latents (after :meth:`prepare_latents`): the clip exists; a latent already
        present (clip, rung, tokenizer, member SHA-256) is a duplicate."""
        self._keys.sync("clips")
        if (row := first_bad(self._keys.has("clips", batch["clip_id"], expect=True))) is not None:
            raise InvalidBatch(
                f"row {row}, field 'clip_id': unknown clip", row=row, field="clip_id"
            )
        key = latent_key(
            batch["clip_id"], batch["rung"], batch["tokenizer_version"], batch["member_sha256"]
        )
        self._keys.sync("latents", tbl)
        dup = self._keys.has("latents", key) | ~first_occurrence(key)
        return Plan(batch.filter(pa.array(~dup)), duplicates=int(dup.sum()))

    def _object_sizes(self, shas: pa.ChunkedArray) -> NDArray[np.int64]:
        """Stored size of each row's object (-1 where absent), one ``head`` per object."""
        unique = pc.unique(shas)
        names = unique.to_pylist()
        store = self._objects()

        def head(sha: str) -> Any:
            # An object adopted by reference (catalog.objects.refs: a TAR shard that
            # stays at its publisher's URL) counts as present at its referenced size.
            return resolve_head(store, sha)

        if len(names) > 8:
            with ThreadPoolExecutor(max_workers=_HEAD_WORKERS) as pool:
                infos = list(pool.map(head, names))
        else:
            infos = [head(s) for s in names]
        sizes = np.array([-1 if i is None else i.size for i in infos], dtype=np.int64)
        return sizes[to_numpy(pc.index_in(shas, value_set=unique)).astype(np.int64)]


def _kept(groups: list[Packed], dup: NDArray[np.bool_]) -> list[Packed]:
    """``groups`` (digests of batch rows) without the rows ``dup`` drops, each digest
    with its row among the rows kept (the order of each group is kept)."""
    if not dup.any():
        return groups
    keep = ~dup
    row_of = np.cumsum(keep) - 1  # a kept batch row's position among the kept
    out = []
    for group in groups:
        picks = np.flatnonzero(keep[group.rows])
        data = np.frombuffer(group.data, f"V{group.width}")[picks].tobytes()
        out.append(Packed(group.width, data, row_of[group.rows[picks]].astype(np.int64)))
    return out


def _links(
    found: Matches, new: pa.Table, in_batch: tuple[NDArray[np.int64], NDArray[np.int64]]
) -> tuple[pa.Array, pa.Array, pa.Table]:
    """:func:`rules.plan_links` over the touched groups: nodes are the groups' existing
    assets (``found.ids``), then the batch's rows."""
    m, n_old = new.num_rows, len(found.ids)
    new_ids = np.asarray(combined(new["asset_id"]).to_pylist(), dtype="U64")
    every = np.concatenate([found.ids.astype("U64"), new_ids])
    new_rate = rules.bitrates(new)
    rate = np.concatenate([found.bitrate, new_rate])
    links = rules.plan_links(
        n_old,
        m,
        found.edges,
        (found.query, found.node),
        in_batch,
        lambda nodes: rate[nodes],
        lambda nodes: every[nodes],
    )
    dup_of = np.full(m, None, dtype=object)
    linked = links.duplicate_of >= 0
    dup_of[linked] = every[links.duplicate_of[linked]]
    events = link_events.event_rows(every[links.event_asset], every[links.event_canonical])
    counts = np.bincount(links.match_owner, minlength=m)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    values = pa.array(every[links.match_other].tolist(), pa.large_string())
    near = pa.LargeListArray.from_arrays(offsets, values, mask=pa.array(counts == 0))
    return pa.array(dup_of.tolist(), pa.large_string()), near, events
