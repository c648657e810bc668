"""Hits hashed from the bytes read into the batch, not by a second read (issue 16).

With ``verify_hits`` a hit this process has not verified used to be hashed by reading
the whole file, then read again into the batch. Now the hash is taken over the header
and the row's bytes as read: the cache's file hash (``sha256_file``) runs for no hit,
and a corrupt byte anywhere in the file is still caught and refetched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import loader.cache as cache_module
from catalog.hashing import sha256_file
from loader.cache import NodeCache, forget_verified
from loader.dataset import SnapshotDataset
from manifests.synthetic import SynthSnapshot, write_snapshot

MB = 1 << 20


def _snapshot(tmp_path: Path, shape: tuple[int, ...] = (4, 9, 8, 8)) -> SynthSnapshot:
    return write_snapshot(
        tmp_path / "store",
        num_rows=16,
        num_steps=2,
        batch_size=8,
        num_buckets=1,
        num_streams=1,
        caption_variants=1,
        latent_shape=shape,
    )


def _latents(snap: SynthSnapshot, cache: Path, **kw: Any) -> list[torch.Tensor]:
    ds = SnapshotDataset(
        snap.url, 1, cache_dir=cache, cache_budget_bytes=64 * MB, cache_reserve_bytes=0, **kw
    )
    return [b["latent"].clone() for b in ds]


def _count_file_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = sha256_file

    def counted(path: str | Path) -> tuple[str, int]:
        seen.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(cache_module, "sha256_file", counted)
    return seen


def _objects(cache: Path) -> list[Path]:
    return sorted((cache / "latents" / "objects").glob("*/*"))


def _stats(cache: Path) -> dict[str, Any]:
    c = NodeCache(cache / "latents", None)
    try:
        return c.stats()
    finally:
        c.close()


def test_a_verified_hit_is_hashed_from_the_batch_not_by_reading_the_file_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path)
    cold = _latents(snap, tmp_path / "node")
    forget_verified()
    hashes = _count_file_hashes(monkeypatch)
    warm = _latents(snap, tmp_path / "node", verify_hits=True)
    assert hashes == []
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))
    # The digests proved the files: a second pass has nothing left to hash.
    verified = cache_module._verified_for(tmp_path / "node" / "latents")
    assert all(verified.get(p.name) is not None for p in _objects(tmp_path / "node"))
    assert _stats(tmp_path / "node")["corrupt_refetches"] == 0


@pytest.mark.parametrize("where", ["data", "header"])
def test_a_corrupt_byte_is_caught_by_the_hash_of_what_was_read_and_refetched(
    tmp_path: Path, where: str
) -> None:
    snap = _snapshot(tmp_path)
    cold = _latents(snap, tmp_path / "node")
    victim = _objects(tmp_path / "node")[3]
    with open(victim, "r+b") as f:
        f.seek(20 if where == "header" else os.path.getsize(victim) - 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x41]))
    forget_verified()
    warm = _latents(snap, tmp_path / "node", verify_hits=True)
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))
    stats = _stats(tmp_path / "node")
    assert stats["corrupt_refetches"] == 1
    assert stats["misses"] == 16 + 1  # the cold fill, then the one refetch


def test_rows_that_are_not_the_whole_file_are_hashed_as_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path, shape=(4, 16, 8, 8))  # 16 frames stored, 9 delivered
    cold = _latents(snap, tmp_path / "node")
    assert cold[0].shape[2] == 9
    forget_verified()
    hashes = _count_file_hashes(monkeypatch)
    warm = _latents(snap, tmp_path / "node", verify_hits=True)
    assert len(hashes) == 16
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every ``os.pread`` / ``os.preadv`` (the loader's reads of cached files)."""
    seen: list[str] = []
    for name in ("pread", "preadv"):
        real = getattr(os, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            seen.append(_name)
            return _real(*args)

        monkeypatch.setattr(os, name, counted)
    return seen


def test_a_warm_row_is_one_read_once_a_row_of_its_step_showed_the_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path)  # 2 steps of 8 rows, one thread
    cold = _latents(snap, tmp_path / "node", prefetch_threads=1)
    for verify in (False, True):
        forget_verified()
        reads = _count_reads(monkeypatch)
        warm = _latents(snap, tmp_path / "node", prefetch_threads=1, verify_hits=verify)
        monkeypatch.undo()
        # Per step: the first row reads its header, then its tensor (2); each other row
        # is one preadv of header and tensor (it was 2 a row: 32).
        assert len(reads) == 2 * (2 + 7), reads
        assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))
    assert _stats(tmp_path / "node")["corrupt_refetches"] == 0


def test_a_step_makes_its_one_read_layout_once_not_a_row_slot_dict_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm row's slots are slices of the step's one-read layout (loader.rowread
    ``_one_read``), made once a step: the locked layout check and dict of every
    tensor's row (``BatchBuffer.row_bytes``) is the header-first row's only."""
    from loader.batch import BatchBuffer

    snap = _snapshot(tmp_path)  # 2 steps of 8 rows, one thread
    cold = _latents(snap, tmp_path / "node", prefetch_threads=1)
    calls: list[int] = []
    real = BatchBuffer.row_bytes

    def counted(self: BatchBuffer, i: int, layout: Any) -> Any:
        calls.append(i)
        return real(self, i, layout)

    for verify in (False, True):
        forget_verified()
        calls.clear()
        monkeypatch.setattr(BatchBuffer, "row_bytes", counted)
        warm = _latents(snap, tmp_path / "node", prefetch_threads=1, verify_hits=verify)
        monkeypatch.undo()
        assert calls == [0, 0], calls  # it was every row: 16
        assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))
    assert _stats(tmp_path / "node")["corrupt_refetches"] == 0


def test_a_row_of_another_shape_but_the_same_size_still_fails_its_step(tmp_path: Path) -> None:
    from catalog.errors import IntegrityError

    snap = _snapshot(tmp_path)
    _latents(snap, tmp_path / "node", prefetch_threads=1)
    victim = _objects(tmp_path / "node")[3]
    data = victim.read_bytes()
    n = int.from_bytes(data[:8], "little")
    old = next(s for s in (b"[4,9,8,8]", b"[4, 9, 8, 8]") if s in data[8 : 8 + n])
    new = old.replace(b"4", b"@").replace(b"8", b"4", 1).replace(b"@", b"8")  # (8, 9, 4, 8)
    victim.write_bytes(data.replace(old, new, 1))  # same bytes, same size, another shape
    with pytest.raises(IntegrityError, match="rest of its bucket"):
        _latents(snap, tmp_path / "node", prefetch_threads=1, verify_hits=False)


def test_a_known_header_read_in_one_go_still_honours_the_tensor_keys_asked(
    tmp_path: Path,
) -> None:
    from safetensors.torch import save_file

    from loader.batch import BatchBuffer
    from loader.rowread import _read

    paths = []
    for i in range(2):  # two files of one header, byte for byte
        path = tmp_path / f"{i}.safetensors"
        save_file({"a": torch.full((2, 3), float(i)), "b": torch.zeros(4)}, str(path))
        paths.append(str(path))
    size = os.path.getsize(paths[0])
    buffer = BatchBuffer(2, None)
    assert _read(paths[0], size, "m0", [], None, buffer, 0, False, False)[0]  # all tensors
    assert buffer.whole_rows is not None
    # Asking only "a" is another layout than the batch's: a misfit, not a full row.
    assert not _read(paths[1], size, "m1", ["a"], None, buffer, 1, False, False)[0]
    assert _read(paths[1], size, "m1", [], None, buffer, 1, False, False)[0]
    assert torch.equal(buffer.tensors["a"][1], torch.ones(2, 3))


def test_a_smaller_row_after_the_step_learned_its_layout_is_a_misfit_not_a_crash(
    tmp_path: Path,
) -> None:
    """A file shorter than a row of the batch, read after a row taught the step its
    one-read layout, goes the ordinary way and comes back as a misfit (the step then
    fails naming both layouts); it raised ValueError (a negative header length)."""
    from safetensors.torch import save_file

    from loader.batch import BatchBuffer
    from loader.rowread import _read

    big, small = tmp_path / "big.safetensors", tmp_path / "small.safetensors"
    save_file({"a": torch.ones(4, 9, 8, 8)}, str(big))
    save_file({"a": torch.ones(1, 9, 8, 8)}, str(small))
    buffer = BatchBuffer(2, None)
    assert _read(str(big), big.stat().st_size, "m0", [], None, buffer, 0, False, False)[0]
    assert buffer.whole_rows is not None
    got = _read(str(small), small.stat().st_size, "m1", [], None, buffer, 1, False, False)
    assert got == (False, None, None, False)
    assert torch.equal(buffer.tensors["a"][0], torch.ones(4, 9, 8, 8))


def _count_stats(monkeypatch: pytest.MonkeyPatch, under: Path) -> list[str]:
    """Record every ``os.stat`` / ``os.fstat`` of a cached object (the size checks)."""
    seen: list[str] = []
    real_stat, real_fstat = os.stat, os.fstat

    inside = f"{under}{os.sep}"

    def stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        if str(path).startswith(inside):
            seen.append("stat")
        return real_stat(path, *args, **kw)

    def fstat(fd: int) -> os.stat_result:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(inside):
            seen.append("fstat")
        return real_fstat(fd)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "fstat", fstat)
    return seen


def test_a_warm_row_without_verification_is_size_checked_by_its_own_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path)  # 2 steps of 8 rows, one thread
    cold = _latents(snap, tmp_path / "node", prefetch_threads=1)
    stats = _count_stats(monkeypatch, tmp_path / "node" / "latents" / "objects")
    warm = _latents(snap, tmp_path / "node", prefetch_threads=1, verify_hits=False)
    monkeypatch.undo()
    # One size check per step (its first row's fstat); the rows read in one go learn
    # the size from a spare byte of that read. It was one stat a row (16).
    assert stats == ["fstat", "fstat"], stats
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))


@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_a_cached_file_of_the_wrong_size_is_still_refetched_without_verification(
    tmp_path: Path, change: str
) -> None:
    snap = _snapshot(tmp_path)
    cold = _latents(snap, tmp_path / "node", prefetch_threads=1)
    for victim in _objects(tmp_path / "node")[2:4]:  # rows read in one go
        data = victim.read_bytes()
        victim.write_bytes(data + b"\0" if change == "longer" else data[:-1])
    warm = _latents(snap, tmp_path / "node", prefetch_threads=1, verify_hits=False)
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))
    assert _stats(tmp_path / "node")["corrupt_refetches"] == 2
