"""Pack entries (``loader.packs``): small members of a pack are read at their offsets
from the whole pack, cached as one entry; each member proved by its ``member_sha256``
over the bytes read, the pack hashed whole only when downloaded (or when a member
fails); a rotten stored member is reported as any corrupt member."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import loader.cache as cache_mod
import loader.packs as packs_mod
from catalog.errors import InvalidInput
from catalog.objects.local import LocalObjectStore
from catalog.objects.refs import list_failed_members
from loader.cache import NodeCache, forget_verified
from loader.dataset import SnapshotDataset
from manifests.synthetic import SynthSnapshot, write_snapshot

MB = 1 << 20
PACK = 32  # members per pack: each is 1/32 of its object, under the 1/16 bound


def _snap(tmp_path: Path, pack: int = PACK, **kw: Any) -> SynthSnapshot:
    kw = {"num_rows": 64, "num_steps": 8, "batch_size": 8, **kw}
    return write_snapshot(tmp_path / f"store{pack}", pack=pack, **kw)


def _ds(snap: SynthSnapshot, cache: Path, **kw: Any) -> SnapshotDataset:
    kw = {
        "cache_budget_bytes": 64 * MB,
        "cache_reserve_bytes": 0,
        "prefetch_steps": 1,
        "prefetch_threads": 2,
        **kw,
    }
    return SnapshotDataset(snap.url, 1, cache_dir=cache, **kw)


def _batches(ds: SnapshotDataset) -> list[dict[str, Any]]:
    with ds:
        return list(ds)


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b, strict=True):
        assert x["clip_ids"] == y["clip_ids"]
        assert torch.equal(x["latent"], y["latent"])
        assert torch.equal(x["latent"].flatten(1)[:, 0], x["rows"].float())
        if "aux" in x:
            assert torch.equal(x["aux"], y["aux"])
            assert torch.equal(x["aux"].flatten(1)[:, 0], x["rows"].float() + 0.5)


def _stats(cache: Path) -> dict[str, Any]:
    with NodeCache(cache / "latents", None) as c:
        return c.stats()


def _packs(snap: SynthSnapshot) -> dict[str, int]:
    store = snap.store
    shas = set(snap.index.column("object_sha256").to_pylist())
    return {sha: info.size for sha in shas if (info := store.head(sha)) is not None}


@pytest.mark.parametrize("keys", [("latent",), ("latent", "aux")])
def test_a_pack_is_one_entry_downloaded_once_and_hit_after(
    tmp_path: Path, keys: tuple[str, ...]
) -> None:
    snap = _snap(tmp_path, tensor_keys=keys)
    packs = _packs(snap)
    assert len(packs) == 2
    reference = _batches(_ds(snap, tmp_path / "per-member", pack_max_bytes=0))
    assert _stats(tmp_path / "per-member")["entries"] == 64  # one entry per member
    cold = _batches(_ds(snap, tmp_path / "node"))
    _same(cold, reference)
    after_cold = _stats(tmp_path / "node")
    assert after_cold["entries"] == 2
    assert after_cold["misses"] == 2
    assert after_cold["bytes"] == after_cold["bytes_downloaded"] == sum(packs.values())
    warm = _batches(_ds(snap, tmp_path / "node"))
    _same(warm, reference)
    after_warm = _stats(tmp_path / "node")
    assert after_warm["misses"] == 2  # no download
    assert after_warm["hits"] > after_cold["hits"]
    assert after_warm["leases"] == 0


def test_members_too_large_for_their_pack_keep_their_own_entries(tmp_path: Path) -> None:
    snap = _snap(tmp_path, pack=4)  # a member is 1/4 of its object: not a pack entry
    _batches(_ds(snap, tmp_path / "node"))
    assert _stats(tmp_path / "node")["entries"] == 64
    big = _snap(tmp_path)  # 1/32, but the objects are over the bound
    size = max(_packs(big).values())
    _batches(_ds(big, tmp_path / "bound", pack_max_bytes=size - 1))
    assert _stats(tmp_path / "bound")["entries"] == 64
    with pytest.raises(InvalidInput, match="pack_max_bytes"):
        _ds(big, tmp_path / "x", pack_max_bytes=-1)


def test_a_pack_hit_never_hashes_the_pack_but_proves_each_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snap(tmp_path)
    reference = _batches(_ds(snap, tmp_path / "node"))
    whole: list[str] = []
    real = cache_mod.sha256_file
    monkeypatch.setattr(cache_mod, "sha256_file", lambda p: whole.append(str(p)) or real(p))
    forget_verified()  # as a fresh process: every member is hashed on its first read
    hashed: list[int] = []

    def counting(data: Any = b"") -> Any:
        hashed.append(len(data))
        return hashlib.sha256(data)

    monkeypatch.setattr(packs_mod, "hashlib", types.SimpleNamespace(sha256=counting))
    _same(_batches(_ds(snap, tmp_path / "node", verify_hits=True)), reference)
    assert whole == []  # no 64-member pack hashed to serve a member
    assert len(hashed) == 64  # each member once: its header then its tensor
    hashed.clear()
    _same(_batches(_ds(snap, tmp_path / "node", verify_hits=True)), reference)
    assert hashed == [] and whole == []  # proved from these very files already


def _flip_in_cached_pack(cache: Path, snap: SynthSnapshot, row: int) -> None:
    obj = snap.index.column("object_sha256")[row].as_py()
    off = snap.index.column("offset")[row].as_py()
    n = snap.index.column("length")[row].as_py()
    path = cache / "latents" / "objects" / obj[:2] / obj
    data = bytearray(path.read_bytes())
    data[off + n - 1] ^= 0xFF  # the member's last tensor byte
    path.chmod(0o644)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("verify", [True, False])
def test_a_damaged_cached_pack_is_dropped_and_its_member_served_right(
    tmp_path: Path, verify: bool
) -> None:
    snap = _snap(tmp_path)
    reference = _batches(_ds(snap, tmp_path / "node"))
    _flip_in_cached_pack(tmp_path / "node", snap, int(snap.plan[3][2]))
    # Even without verify_hits: the write moved the file's ctime, so this process has
    # not proved that file's members, and a member's first read is always hashed.
    again = _batches(_ds(snap, tmp_path / "node", verify_hits=verify))
    _same(again, reference)
    stats = _stats(tmp_path / "node")
    assert stats["corrupt_refetches"] == 1
    assert stats["misses"] == 3  # two packs, one of them again
    assert list_failed_members(snap.store) == []  # a local fault, not the data's


def test_a_rotten_stored_member_of_a_pack_is_skipped_and_recorded(tmp_path: Path) -> None:
    snap = _snap(tmp_path)
    victim = int(snap.plan[2][1])
    store = snap.store
    assert isinstance(store, LocalObjectStore)
    obj = snap.index.column("object_sha256")[victim].as_py()
    off = snap.index.column("offset")[victim].as_py()
    path = store.object_path(obj)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[off + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    got = _batches(_ds(snap, tmp_path / "node"))
    served = [c for b in got for c in b["clip_ids"]]
    assert f"clip-{victim:06d}" not in served
    assert len(served) == 63
    assert sum(b["corrupt"] for b in got) == 1
    assert list_failed_members(store) == [snap.member_sha[victim]]
    for b in got:  # the rest of the rotten pack is served, member by member
        assert torch.equal(b["latent"].flatten(1)[:, 0], b["rows"].float())


def test_resume_reads_the_same_rows_through_packs(tmp_path: Path) -> None:
    snap = _snap(tmp_path)
    full = _batches(_ds(snap, tmp_path / "node"))
    ds = _ds(snap, tmp_path / "node")
    ds.load_state_dict({"version": 1, "plan_sha256": ds.plan.plan_sha256, "next_step": 5})
    _same(_batches(ds), full[5:])


def test_two_dataloader_workers_share_a_pack(tmp_path: Path) -> None:
    snap = _snap(tmp_path, num_rows=64, num_steps=8)
    reference = _batches(_ds(snap, tmp_path / "ref", pack_max_bytes=0))
    ds = _ds(snap, tmp_path / "node")
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = list(loader)
    _same(got, reference)
    stats = _stats(tmp_path / "node")
    assert stats["entries"] == 2 and stats["misses"] == 2  # one download across workers


_HOLD = """
import json, sys, time
from pathlib import Path
from loader.cache import NodeCache
cfg = json.loads(sys.argv[1])
cache = NodeCache(cfg["root"], None)
with cache.leases([(cfg["key"], cfg["size"])]) as held:
    path, _ = held.open_pack(cfg["key"], cfg["size"], lambda tmp: None)
    Path(cfg["marker"]).write_text(path)
    time.sleep(60)
"""


def test_a_pack_leased_by_another_process_is_not_evicted(tmp_path: Path) -> None:
    snap = _snap(tmp_path)
    _batches(_ds(snap, tmp_path / "node"))
    packs = _packs(snap)
    key = next(iter(packs))
    marker = tmp_path / "held"
    cfg = {"root": str(tmp_path / "node" / "latents"), "key": key, "size": packs[key]}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, json.dumps({**cfg, "marker": str(marker)})], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with NodeCache(tmp_path / "node" / "latents", None) as cache:
            freed = cache.gc(0)
            assert freed["evicted"] == 1  # the other pack, by its whole size
            assert freed["bytes_freed"] == sum(v for k, v in packs.items() if k != key)
            assert cache.stats()["bytes"] == packs[key]
            assert Path(marker.read_text()).exists()
    finally:
        child.kill()
        child.wait()
    with NodeCache(tmp_path / "node" / "latents", None) as cache:  # reclaims the dead lease
        assert cache.gc(0)["evicted"] == 1
        assert cache.stats()["bytes"] == 0


def test_packs_over_a_sixteenth_of_the_budget_keep_per_member_entries(tmp_path: Path) -> None:
    snap = _snap(tmp_path)
    size = max(_packs(snap).values())
    reference = _batches(_ds(snap, tmp_path / "ref"))
    # A budget under 16 packs: pinning whole packs would crowd it, so members go alone.
    small = _ds(snap, tmp_path / "node", cache_budget_bytes=16 * size - 1)
    _same(_batches(small), reference)
    assert _stats(tmp_path / "node")["entries"] == 64


def test_pack_proofs_are_bounded_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long job touches many packs: the proofs it remembers stay within a member budget
    (the least recent packs are forgotten first), so a process's memory does not grow
    with the packs it has read."""
    monkeypatch.setattr(cache_mod, "_PACK_MEMBERS_MAX", 1000)
    verified = cache_mod._Verified()
    for p in range(50):
        got = verified.members(f"{p:064x}", (p,))
        for off in range(100):
            got[off] = "m"
            verified.proved()
    held = sum(len(d) for d in verified._members.values())
    assert held <= 1100
    assert verified.members(f"{49:064x}", (49,))  # the most recent pack is kept
    assert not verified.members(f"{0:064x}", (0,))  # the oldest was forgotten


def test_a_pack_dropped_by_another_part_between_lease_and_open_is_fetched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two parts of a step may lease the same cached pack; when one of them finds a
    member bad and drops the copy (it unlinks the file) after the other's lease but
    before its open, the other fetches the pack again instead of failing its rows
    with FileNotFoundError (seen once in four loaded runs of the test above)."""
    from loader.leases import LeaseSet

    snap = _snap(tmp_path)
    reference = _batches(_ds(snap, tmp_path / "node"))
    real = LeaseSet.open_pack
    raced: list[str] = []

    def racing(self: LeaseSet, key: str, size: int, fetch: Any, **kw: Any) -> Any:
        path, proof = real(self, key, size, fetch, **kw)
        if proof is not None and not raced:  # a hit: another part drops it now
            raced.append(key)
            with LeaseSet(self._cache, [(key, size)]) as other:
                _, theirs = real(other, key, size, fetch)
                assert theirs is not None
                other._fail(theirs)
            assert not os.path.exists(path)
        return path, proof

    monkeypatch.setattr(LeaseSet, "open_pack", racing)
    _same(_batches(_ds(snap, tmp_path / "node")), reference)
    assert raced
    stats = _stats(tmp_path / "node")
    assert stats["corrupt_refetches"] == 1
    assert stats["misses"] == 3  # two packs, the dropped one again
    assert stats["leases"] == 0


def test_a_warm_pack_step_copies_its_rows_without_a_read_per_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of a step's layout are copied out of the pack's mapping together
    (decision 060): no ``preadv`` per row, one ``pread`` only for the row of each
    part that teaches the layout; the batches stay the per-member path's."""
    snap = _snap(tmp_path)
    reference = _batches(_ds(snap, tmp_path / "ref", pack_max_bytes=0))
    _batches(_ds(snap, tmp_path / "node"))  # cold: fetch the packs
    calls = {"preadv": 0, "pread": 0}
    for name in calls:
        real = getattr(os, name)

        def counting(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(os, name, counting)
    _same(_batches(_ds(snap, tmp_path / "node")), reference)
    assert calls["preadv"] == 0
    assert calls["pread"] <= 8 * 2 * 2  # per step, part and pack: the teaching row at most


def test_pack_mappings_are_per_file_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack file is mapped once per process and fingerprint; a rewritten file (another
    fingerprint) gets its own mapping with its own bytes; at most MAPS_MAX are kept."""
    import loader.packmaps as maps

    monkeypatch.setattr(maps, "MAPS_MAX", 3)
    monkeypatch.setattr(maps, "_maps", type(maps._maps)())
    path = tmp_path / "pack"
    path.write_bytes(b"a" * 4096)

    def fp_and_map(key: str) -> tuple[tuple[int, ...], Any]:
        fd = os.open(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            fp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            return fp, maps.mapped(key, fp, fd)
        finally:
            os.close(fd)

    fp, first = fp_and_map("k")
    assert first is not None and bytes(first[:2]) == b"aa"
    assert fp_and_map("k")[1] is first  # the same file: the same mapping
    path.unlink()
    path.write_bytes(b"b" * 8192)  # replaced: another inode, size, ctime
    fp2, second = fp_and_map("k")
    assert fp2 != fp and second is not None and bytes(second[:2]) == b"bb"
    assert bytes(first[:2]) == b"aa"  # the old mapping still reads the old file
    for key in ("x", "y", "z"):
        fp_and_map(key)
    assert len(maps._maps) == 3
    assert ("k", fp2) not in maps._maps  # the least recent went first
    path.write_bytes(b"")
    assert fp_and_map("empty")[1] is None  # nothing to map: the caller reads instead


def test_a_step_of_pack_members_takes_its_leases_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step whose rows are all pack members is one part: its packs are leased (two
    SQLite transactions) and opened once a step, not once per part and thread."""
    snap = _snap(tmp_path)
    reference = _batches(_ds(snap, tmp_path / "ref", pack_max_bytes=0))
    _batches(_ds(snap, tmp_path / "node"))  # cold: fetch the packs
    sets: list[int] = []
    real = NodeCache.leases

    def counting(self: NodeCache, wanted: Any = ()) -> Any:
        sets.append(1)
        return real(self, wanted)

    monkeypatch.setattr(NodeCache, "leases", counting)
    _same(_batches(_ds(snap, tmp_path / "node", prefetch_threads=2)), reference)
    assert len(sets) == 8  # one a step (8 steps), with two threads
    sets.clear()
    _batches(_ds(snap, tmp_path / "per-member", pack_max_bytes=0))
    assert len(sets) == 16  # members alone: still one part per thread


def test_members_over_the_bulk_bound_are_read_one_preadv_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members over ``BULK_MAX`` keep one ``preadv`` a row (it releases the GIL for a
    large copy) and one part per thread; the batches are the same."""
    import loader.dataset as dataset_mod

    snap = _snap(tmp_path)
    reference = _batches(_ds(snap, tmp_path / "ref", pack_max_bytes=0))
    monkeypatch.setattr(packs_mod, "BULK_MAX", 0)
    monkeypatch.setattr(dataset_mod, "BULK_MAX", 0)
    _same(_batches(_ds(snap, tmp_path / "node")), reference)  # cold
    forget_verified()  # each member hashed again on its first read: the preadv path
    reads: list[int] = []
    real = os.preadv

    def counting(*args: Any) -> Any:
        reads.append(1)
        return real(*args)

    monkeypatch.setattr(os, "preadv", counting)
    _same(_batches(_ds(snap, tmp_path / "node")), reference)
    assert len(reads) >= 64 - 8 * 2 * 2  # all but the rows that taught a layout
