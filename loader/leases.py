"""Many node-cache leases in two write transactions: :class:`LeaseSet`.

A lease of :meth:`loader.cache.NodeCache.lease` is two small SQLite write transactions
(take, return), about 0.1-0.3 ms on a busy node: for kilobyte-sized samples that is
most of the time a sample costs. A :class:`LeaseSet` takes the leases of every object
of a batch that is already cached in **one** transaction and returns all its leases in
**one** more, whatever the batch size. Objects that are not cached (or fail their
check) go through the ordinary per-object path — download, verify, rename — and their
leases join the set. The rules of docs/cache.md hold unchanged: each hit is still
size-checked (by a stat, or by the reader's own read: ``open(..., sized=True)``) and,
with ``verify_hits``, hashed unless this process verified that very
file; eviction still never picks a leased entry; a process that dies holding a set is
reclaimed like any dead lease holder.

A reader that reads a whole object anyway can take the hash off the cache's hands:
:meth:`LeaseSet.open` hands back a hit whose hash is still due together with a
:class:`Proof`; the reader hashes the very bytes it read (from its batch buffer) and
:meth:`LeaseSet.settle` compares the digest. Each file is then read once, not twice
(once to hash, once to decode). A reader that cannot hash what it read calls
:meth:`LeaseSet.prove`, which hashes the file as :meth:`path` would have. A failed
proof drops the entry, as a failed check does; the reader then asks :meth:`path`
again, which downloads a verified copy.

A set is used by one thread, inside a ``with`` block; every path it hands out stays
valid (not evicted) until the block ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from catalog.hashing import require_sha256

if TYPE_CHECKING:
    from loader.cache import Fetch, NodeCache

__all__ = ["LeaseSet", "Proof"]


class Proof(NamedTuple):
    """A leased hit whose SHA-256 is still due: settle it with the digest of the bytes
    read (:meth:`LeaseSet.settle`) or have the file hashed (:meth:`LeaseSet.prove`).
    An empty ``fingerprint`` owes only the size (:meth:`LeaseSet.open` ``sized``).
    A tuple, not a dataclass: one is made per warm row, and a frozen dataclass's
    ``__init__`` showed in the profile."""

    key: str
    size: int
    path: str
    fingerprint: tuple[int, ...]
    lease_id: int
    gen: str


class LeaseSet:
    """Leases on many objects of one cache, taken and returned in bulk.

    Args:
        cache: the node cache.
        wanted: ``(sha256, size)`` of the objects about to be read; the cached ones
            are leased now, in one transaction.
    """

    def __init__(self, cache: NodeCache, wanted: Iterable[tuple[str, int]] = ()) -> None:
        self._cache = cache
        keys = [(require_sha256(k, "key_sha256"), int(n)) for k, n in wanted]
        self._held = cache._claim_hits(keys) if keys else {}
        self._ids = [lease_id for lease_id, _ in self._held.values()]
        self._paths: dict[str, str] = {}
        self._closed = False

    def path(
        self, key_sha256: str, size: int, fetch: Fetch, *, timeout: float | None = None
    ) -> str:
        """A verified local copy of an object, leased until the set closes.

        Same contract as :meth:`NodeCache.lease` (``fetch`` on a miss, ``timeout`` for
        another process's download, the same errors).
        """
        if self._closed:
            raise RuntimeError("the lease set is closed")
        known = self._paths.get(key_sha256)
        if known is not None:
            return known
        cache = self._cache
        held = self._held.pop(key_sha256, None)  # keys in _held were checked on entry
        key = key_sha256 if held is not None else require_sha256(key_sha256, "key_sha256")
        if held is not None:
            lease_id, gen = held
            path = cache._object_path(key)
            if cache._check(key, size, path, force_hash=False):
                self._paths[key] = path
                return path
            self._ids.remove(lease_id)
            cache._drop_corrupt(key, gen, lease_id, was_hit=True)
        lease_id, got = cache._acquire(key, size, fetch, timeout)
        self._ids.append(lease_id)
        self._paths[key] = path = os.fspath(got)
        return path

    def open(
        self,
        key_sha256: str,
        size: int,
        fetch: Fetch,
        *,
        timeout: float | None = None,
        sized: bool = False,
    ) -> tuple[str, Proof | None]:
        """:meth:`path`, except that a hit whose hash is due is not hashed: it comes
        with a :class:`Proof` the caller must settle or prove before trusting the bytes
        (and before :meth:`path` is asked for the same object again).

        ``sized``: the caller learns the file's size from its own read (a read that
        asks one byte more than ``size``). A hit with no hash due is then not even
        stat-checked: it comes with a size-only proof (empty ``fingerprint``) that the
        caller discharges when its read got exactly ``size`` bytes, else proves."""
        held = None if self._closed else self._held.get(key_sha256)
        if held is None:
            return self.path(key_sha256, size, fetch, timeout=timeout), None
        path = self._cache._object_path(key_sha256)
        if sized and not self._cache.verify_hits:
            fp: tuple[int, ...] | None = ()  # no hash can be due: the read checks the size
        else:
            ok, fp = self._cache._hash_pending(key_sha256, size, path)
            if not ok:  # wrong size or gone: the ordinary path drops it and fetches again
                return self.path(key_sha256, size, fetch, timeout=timeout), None
        del self._held[key_sha256]
        self._paths[key_sha256] = path
        if fp is None:
            return path, None
        return path, Proof(key_sha256, size, path, fp, held[0], held[1])

    def open_pack(
        self, key_sha256: str, size: int, fetch: Fetch, *, timeout: float | None = None
    ) -> tuple[str, Proof | None]:
        """A whole pack object (one entry serving many small members), leased and
        size-checked, **never hashed on a hit**: the reader proves each member it reads
        by its ``member_sha256`` (:mod:`loader.packs`). Ask once per pack and set.

        Returns the path and, for a hit, a :class:`Proof` (``fingerprint``: the pack
        file's stat) to :meth:`prove` when a member fails its hash: the whole pack is
        then hashed once, and dropped (``corrupt_refetches`` + 1) if it is the copy at
        fault. None for a pack downloaded (and so hashed whole) just now."""
        held = None if self._closed else self._held.pop(key_sha256, None)
        if held is not None:
            path = self._cache._object_path(key_sha256)
            fp = self._cache._stat_fingerprint(key_sha256, size, path)
            if fp is not None:
                self._paths[key_sha256] = path
                return path, Proof(key_sha256, size, path, fp, held[0], held[1])
            self._ids.remove(held[0])
            self._cache._drop_corrupt(key_sha256, held[1], held[0], was_hit=True)
        return self.path(key_sha256, size, fetch, timeout=timeout), None

    def settle(self, proof: Proof, digest: str, st: os.stat_result) -> bool:
        """Whether ``digest``, the SHA-256 of every byte of ``proof``'s object as read
        through a file whose ``fstat`` (taken after the read) is ``st``, proves it.
        False drops the entry (``corrupt_refetches`` + 1): :meth:`path` then fetches a
        verified copy."""
        if self._cache._settle(proof.key, proof.fingerprint, digest, st):
            return True
        self._fail(proof)
        return False

    def prove(self, proof: Proof) -> bool:
        """Hash ``proof``'s file as :meth:`path` does (a size-only proof: check its
        size as :meth:`path` does); as :meth:`settle` otherwise."""
        hash_it = bool(proof.fingerprint)
        if self._cache._check(proof.key, proof.size, proof.path, force_hash=hash_it):
            return True
        self._fail(proof)
        return False

    def _fail(self, proof: Proof) -> None:
        self._paths.pop(proof.key, None)
        self._ids.remove(proof.lease_id)
        self._cache._drop_corrupt(proof.key, proof.gen, proof.lease_id, was_hit=True)

    def close(self) -> None:
        """Return every lease of the set in one transaction. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ids, self._ids = self._ids, []
        self._held.clear()
        self._cache._release_many(ids)

    def __enter__(self) -> LeaseSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
