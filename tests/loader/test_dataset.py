"""SnapshotDataset: exact rank batches, decoding, resume, prefetch, clean shutdown."""

from __future__ import annotations

import gc
import io
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save as st_save

from catalog.errors import ChecksumMismatch, IntegrityError, InvalidInput
from catalog.hashing import sha256_bytes
from catalog.objects import ObjectStore
from loader.cache import NodeCache
from loader.cache_anchor import release_all
from loader.dataset import SnapshotDataset, StatefulLoader
from loader.decode import (
    decode_bytes,
    decode_file,
    read_into,
    read_member,
    safetensors_specs,
    sniff_format,
)
from loader.source import StoreSource
from manifests.synthetic import SynthSnapshot, write_snapshot
from tests.loader.synth import CorruptingSource, serve_http

MB = 1 << 20


def _dataset(snap: SynthSnapshot | str, cache: Path, **kw: Any) -> SnapshotDataset:
    source = snap.url if isinstance(snap, SynthSnapshot) else snap
    kw.setdefault("cache_budget_bytes", 64 * MB)
    kw.setdefault("cache_reserve_bytes", 0)
    return SnapshotDataset(kw.pop("source", source), kw.pop("version", 1), cache_dir=cache, **kw)


def _check_batch(snap: SynthSnapshot, batch: dict[str, Any], rank: int, world: int) -> None:
    step = batch["step"]
    rows = snap.plan[step]
    b = len(rows)
    expected = rows[rank * b // world : (rank + 1) * b // world]
    np.testing.assert_array_equal(batch["rows"].numpy(), expected)
    # Every latent of row r is filled with r: the tensors belong to the rows named.
    assert torch.equal(batch["latent"].flatten(1)[:, 0], batch["rows"].float())
    assert batch["clip_ids"] == [f"clip-{r:06d}" for r in expected]
    assert batch["bucket"] == snap.buckets[step]
    for row, caption in zip(expected.tolist(), batch["captions"], strict=True):
        variants = snap.index.column("captions")[row].as_py()
        stream = snap.index.column("stream")[row].as_py()
        epoch = snap.stream_epochs[step][stream]
        assert caption == variants[(epoch + row) % len(variants)]


def _record_torch_load(mp: pytest.MonkeyPatch) -> list[object]:
    """Patch ``torch.load`` to record its calls (and still load)."""
    calls: list[object] = []
    real_load = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_load(*args, **kwargs)

    mp.setattr(torch, "load", load)
    return calls


# -- decode ------------------------------------------------------------------------------
def _encoded(fmt: str) -> bytes:
    t = {"latent": torch.arange(6.0).reshape(2, 3), "mean": torch.ones(2)}
    if fmt == "safetensors":
        return st_save(t)
    buf = io.BytesIO()
    if fmt == "pt":
        torch.save(t, buf)
    else:
        np.save(buf, t["latent"].numpy())
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["safetensors", "pt", "npy"])
def test_decode_each_format_from_file_and_bytes(tmp_path: Path, fmt: str) -> None:
    data = _encoded(fmt)
    path = tmp_path / "x"
    path.write_bytes(data)
    assert sniff_format(data[:16]) == fmt
    sha = sha256_bytes(data)
    for tensors in (
        decode_file(path, fmt, ["latent"], sha256=sha),
        decode_bytes(data, fmt, ["latent"], sha256=sha),
    ):
        assert list(tensors) == ["latent"]
        assert torch.equal(tensors["latent"].float(), torch.arange(6.0).reshape(2, 3))
    with pytest.raises(IntegrityError, match=r"lacks|names keys"):
        decode_file(path, fmt, ["latent", "nope"], sha256=sha)
    with pytest.raises(InvalidInput):
        decode_bytes(data, "tar", [], sha256=None)


def test_corrupt_pt_never_reaches_torch_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _encoded("pt")
    sha = sha256_bytes(data)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    packed = tmp_path / "packed"
    packed.write_bytes(b"head" + bytes(bad) + b"tail")
    calls = _record_torch_load(monkeypatch)
    with pytest.raises(ChecksumMismatch):
        read_member(packed, 4, len(data), sha)
    with pytest.raises(ChecksumMismatch):
        decode_bytes(bytes(bad), "pt", [], sha256=sha)
    single = tmp_path / "single"
    single.write_bytes(bytes(bad))
    with pytest.raises(ChecksumMismatch):
        decode_file(single, "pt", [], sha256=sha)
    assert calls == []
    assert decode_bytes(data, "pt", ["mean"], sha256=sha)["mean"].shape == (2,)
    assert len(calls) == 1


def test_safetensors_read_in_place_checks_the_header(tmp_path: Path) -> None:
    data = _encoded("safetensors")
    path = tmp_path / "x"
    path.write_bytes(data)
    with open(path, "rb") as f:
        specs = safetensors_specs(f, ["latent", "mean"], "x")
        out = torch.empty(2, 3)
        read_into(f, specs["latent"], out)
    assert torch.equal(out, torch.arange(6.0).reshape(2, 3))
    for bad in (data[:-4], b"\xff" * 8 + data[8:], data[:8] + b"{not json" + data[17:]):
        path.write_bytes(bad)
        with open(path, "rb") as f, pytest.raises(IntegrityError):
            safetensors_specs(f, ["latent", "mean"], "x")
    with pytest.raises(InvalidInput):
        read_into(io.BufferedReader(io.BytesIO(data)), specs["latent"], torch.empty(3, 2))


# -- batches -----------------------------------------------------------------------------
def test_rank_batches_are_exact(tmp_path: Path) -> None:
    snap = write_snapshot(
        tmp_path / "store",
        num_steps=12,
        formats=("safetensors", "pt", "npy"),
        pack=5,
        text_embeddings=True,
    )
    world = 2
    seen: dict[int, list[int]] = {}
    for rank in range(world):
        ds = _dataset(snap, tmp_path / "cache", rank=rank, world_size=world)
        steps = []
        for batch in ds:
            _check_batch(snap, batch, rank, world)
            seen.setdefault(batch["step"], []).extend(batch["rows"].tolist())
            steps.append(batch["step"])
            shape = batch["latent"].shape
            assert shape[0] == 4 and len({tuple(shape[1:])}) == 1
            emb = batch["text_embeddings"]
            assert emb.shape == (4, 4)
            for row, cap, e in zip(batch["rows"].tolist(), batch["captions"], emb, strict=True):
                variant = int(cap.rsplit("v", 1)[1])
                assert torch.all(e == row * 100 + variant)
        assert steps == list(range(12))
        assert ds.state_dict()["next_step"] == 12
        ds.close()
    for step, rows in seen.items():
        assert rows == snap.plan[step].tolist()


def test_dataset_reads_through_each_store(tmp_path: Path, store: ObjectStore) -> None:
    snap = write_snapshot(store, num_steps=4, pack=3, formats=("safetensors", "pt"))
    for batch in _dataset(snap, tmp_path / "cache", rank=1, world_size=4):
        _check_batch(snap, batch, 1, 4)


def test_dataset_reads_from_a_service_url(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=4, pack=4, formats=("npy", "pt"))
    with serve_http(snap.store) as (url, requests):
        batches = list(_dataset(url, tmp_path / "cache", rank=0, world_size=2))
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    for batch in batches:
        _check_batch(snap, batch, 0, 2)
    assert any("Range" in r or "bytes=" in r for r in requests)


@pytest.mark.parametrize("start", [0, 5])
def test_dataloader_workers_keep_step_order(tmp_path: Path, start: int) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=13, formats=("safetensors", "npy"))
    loader = torch.utils.data.DataLoader(
        _dataset(snap, tmp_path / "cache", rank=1, world_size=4, start_step=start),
        batch_size=None,
        num_workers=2,
    )
    batches = list(loader)
    assert [b["step"] for b in batches] == list(range(start, 13))
    for batch in batches:
        _check_batch(snap, batch, 1, 4)


def test_world_size_must_divide_every_batch(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=3, skip={1: 1})
    ds = _dataset(snap, tmp_path / "cache", rank=0, world_size=3)
    with pytest.raises(InvalidInput, match=r"allowed world sizes: \[1, 2, 4, 8\]"):
        next(iter(ds))


# -- state -------------------------------------------------------------------------------
def test_resume_is_a_seek_not_a_replay(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=16)
    first = _dataset(snap, tmp_path / "cache", rank=0, world_size=2)
    it = iter(first)
    for _ in range(6):
        next(it)
    state = first.state_dict()
    it.close()
    assert state == {"version": 1, "plan_sha256": snap.plan_sha256, "next_step": 6}

    fetched: list[str] = []

    class Recording(StoreSource):  # standalone objects: object == member SHA-256
        def fetch_range(self, sha256: str, offset: int, length: int, dest: Path) -> None:
            fetched.append(sha256)
            super().fetch_range(sha256, offset, length, dest)

    # A fresh cache: every object the resumed run needs is fetched, and only those.
    resumed = _dataset(snap, tmp_path / "cache2", rank=0, world_size=4)
    resumed.source = Recording(snap.store)
    resumed.load_state_dict(state)
    batches = list(resumed)
    assert [b["step"] for b in batches] == list(range(6, 16))
    needed = {snap.member_sha[r] for s in range(6, 16) for r in snap.plan[s][:2]}
    assert set(fetched) == needed
    for batch in batches:
        _check_batch(snap, batch, 0, 4)


def test_state_from_another_plan_is_refused(tmp_path: Path) -> None:
    snap1 = write_snapshot(tmp_path / "store", num_steps=6, seed=1)
    snap2 = write_snapshot(tmp_path / "store", version=2, num_steps=6, seed=2)
    ds1 = _dataset(snap1, tmp_path / "cache")
    ds2 = _dataset(snap2, tmp_path / "cache", version=2)
    with pytest.raises(InvalidInput) as exc:
        ds2.load_state_dict(ds1.state_dict(next_step=3))
    assert snap1.plan_sha256 in str(exc.value) and snap2.plan_sha256 in str(exc.value)
    assert exc.value.details["state_plan_sha256"] == snap1.plan_sha256
    for bad in ({"next_step": 1}, {"plan_sha256": snap2.plan_sha256, "next_step": 7}):
        with pytest.raises(InvalidInput):
            ds2.load_state_dict(bad)
    assert ds2.next_step == 0  # nothing changed


def test_stateful_loader_tracks_steps_across_workers(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=14)
    loader = StatefulLoader(_dataset(snap, tmp_path / "cache", rank=1, world_size=2), num_workers=2)
    seen = []
    for batch in loader:
        seen.append(batch["step"])
        if batch["step"] == 5:
            break
    state = loader.state_dict()
    assert state["next_step"] == 6
    # Resume with another world size and worker count: the sequence continues exactly.
    again = StatefulLoader(_dataset(snap, tmp_path / "cache", rank=3, world_size=4), num_workers=1)
    again.load_state_dict(state)
    rest = list(again)
    assert [b["step"] for b in rest] == list(range(6, 14))
    for batch in rest:
        _check_batch(snap, batch, 3, 4)
    assert again.state_dict()["next_step"] == 14
    with pytest.raises(InvalidInput):
        StatefulLoader(loader.dataset, num_workers=1, persistent_workers=True, hand_over=False)


def test_dataset_pickles_before_and_after_use(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=5)
    ds = _dataset(snap, tmp_path / "cache", rank=0, world_size=2)
    clone = pickle.loads(pickle.dumps(ds))
    it = iter(ds)
    first = next(it)
    clone2 = pickle.loads(pickle.dumps(ds))  # mid-iteration: the cursor travels along
    same = next(iter(clone))
    assert same["step"] == 0 and torch.equal(same["latent"], first["latent"])
    later = next(iter(clone2))
    assert later["step"] == 1
    _check_batch(snap, later, 0, 2)
    it.close()


def test_without_prefetch_every_step_comes(tmp_path: Path) -> None:
    """prefetch_steps=0 used to stop after the first step (nothing was submitted after it)."""
    snap = write_snapshot(tmp_path / "store", num_steps=4)
    with _dataset(snap, tmp_path / "cache", prefetch_steps=0) as ds:
        assert [b["step"] for b in ds] == [0, 1, 2, 3]


# -- verification ------------------------------------------------------------------------
@pytest.mark.parametrize("pack", [1, 4])
def test_corrupt_source_bytes_raise(tmp_path: Path, pack: int) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=3, pack=pack, formats=("pt",))
    with pytest.MonkeyPatch.context() as mp:
        calls = _record_torch_load(mp)
        ds = _dataset(
            snap,
            tmp_path / "cache",
            source=CorruptingSource(snap.store, artifacts=False),
            on_corrupt="fail",
        )
        with pytest.raises(ChecksumMismatch):
            next(iter(ds))
    assert calls == []
    with NodeCache(tmp_path / "cache" / "latents", None) as cache:
        stats = cache.stats()
    assert stats["entries"] == 0 and stats["reserved"] == 0 and stats["leases"] == 0


@pytest.mark.parametrize("verify_hits", [True, False])
def test_corrupt_cached_file_is_never_decoded_as_pt(tmp_path: Path, verify_hits: bool) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=2, formats=("pt",))
    cache = tmp_path / "cache"
    first = next(iter(_dataset(snap, cache, world_size=8, verify_hits=verify_hits)))
    row = int(first["rows"][0])
    victim = cache / "latents" / "objects" / snap.member_sha[row][:2] / snap.member_sha[row]
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    ds = _dataset(snap, cache, world_size=8, verify_hits=verify_hits)
    if verify_hits:  # the cache sees it and fetches the object again
        again = next(iter(ds))
        assert torch.equal(again["latent"], first["latent"])
    else:  # the cache only checks sizes; the .pt check before torch.load catches it
        with pytest.raises(ChecksumMismatch):
            next(iter(ds))


# -- prefetch and shutdown ---------------------------------------------------------------
def _prefetch_threads() -> int:
    return sum(t.name.startswith("vidlake-prefetch") for t in threading.enumerate())


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_prefetch_runs_k_steps_ahead_and_no_further(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=10, batch_size=8)
    fetched: list[str] = []

    class Recording(StoreSource):  # standalone objects: object == member SHA-256
        def fetch_range(self, sha256: str, offset: int, length: int, dest: Path) -> None:
            fetched.append(sha256)
            super().fetch_range(sha256, offset, length, dest)

    ds = _dataset(snap, tmp_path / "cache", prefetch_steps=2, source=Recording(snap.store))
    it = iter(ds)
    assert next(it)["step"] == 0
    ahead = {snap.member_sha[r] for s in (1, 2) for r in snap.plan[s]}
    deadline = time.monotonic() + 20
    while not ahead <= set(fetched) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ahead <= set(fetched)  # steps 1 and 2 fetched while step 0 is in use
    allowed = {snap.member_sha[r] for s in (0, 1, 2) for r in snap.plan[s]}
    assert set(fetched) <= allowed  # nothing of step 3 or later yet
    it.close()


def test_shutdown_leaks_nothing(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=10, formats=("safetensors", "npy"))
    gc.collect()  # earlier tests' garbage must not close its files during the measure
    release_all()  # the caches' WAL anchors: one bounded connection per database
    threads, fds = _prefetch_threads(), _fds()
    ds = _dataset(snap, tmp_path / "cache", prefetch_steps=3, prefetch_threads=4)
    # 1. The consumer stops early and closes the iterator.
    it = iter(ds)
    next(it)
    next(it)
    assert _prefetch_threads() > threads
    it.close()
    assert _prefetch_threads() == threads
    # 2. The consumer drops the iterator without closing it.
    it = iter(ds)
    next(it)
    del it
    gc.collect()
    assert _prefetch_threads() == threads
    # 3. Decoding fails mid-run.
    corrupting = CorruptingSource(snap.store, artifacts=False)
    bad = _dataset(snap, tmp_path / "cache2", source=corrupting, on_corrupt="fail")
    with pytest.raises(ChecksumMismatch):
        list(bad)
    assert _prefetch_threads() == threads
    bad.close()
    ds.close()
    gc.collect()
    release_all()
    assert _fds() == fds
    for root in ("cache", "cache2"):
        with NodeCache(tmp_path / root / "latents", None) as cache:
            stats = cache.stats()
        assert stats["leases"] == 0 and stats["reserved"] == 0


def test_batch_memory_is_recycled_only_after_release(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=12, num_buckets=1)
    ds = _dataset(snap, tmp_path / "cache", prefetch_steps=1)
    held = list(ds)  # every batch alive at once: no two may share memory
    assert len({b["latent"].data_ptr() for b in held}) == 12
    for batch in held:
        _check_batch(snap, batch, 0, 1)
    del held, batch
    gc.collect()
    ds.seek(0)
    pointers = []
    for batch in ds:  # each batch dropped before the next: memory comes round again
        _check_batch(snap, batch, 0, 1)
        pointers.append(batch["latent"].data_ptr())
        del batch
    assert len(set(pointers)) < len(pointers)
