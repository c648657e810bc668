"""The corrupt-member policy (issue 18, item 5; ``loader.corrupt``): a member whose
stored bytes fail their SHA-256 is skipped the same way by whichever rank is handed it,
recorded for quarantine, counted; ``on_corrupt="fail"`` raises; a local (cache) fault is
never blamed on the data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from catalog.errors import ChecksumMismatch, InvalidInput
from catalog.objects.local import LocalObjectStore
from catalog.objects.refs import list_failed_members
from loader.dataset import SnapshotDataset
from manifests.synthetic import SynthSnapshot, write_snapshot

MB = 1 << 20


def _dataset(snap: SynthSnapshot, cache: Path, **kw: Any) -> SnapshotDataset:
    return SnapshotDataset(
        snap.url,
        1,
        cache_dir=cache,
        cache_budget_bytes=64 * MB,
        cache_reserve_bytes=0,
        prefetch_steps=1,
        **kw,
    )


def _rot_one_member(snap: SynthSnapshot, row: int) -> None:
    """Flip one byte inside row ``row``'s member, in the stored object itself."""
    store = snap.store
    assert isinstance(store, LocalObjectStore)
    obj = snap.index.column("object_sha256")[row].as_py()
    off = snap.index.column("offset")[row].as_py()
    n = snap.index.column("length")[row].as_py()
    path = store.object_path(obj)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[off + n // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _run(ds: SnapshotDataset) -> dict[int, dict[str, Any]]:
    with ds:
        return {int(b["step"]): b for b in ds}


@pytest.mark.parametrize("pack", [1, 3])
def test_every_rank_skips_a_corrupt_member_at_the_same_step_and_it_is_recorded(
    tmp_path: Path, pack: int
) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=6, pack=pack, num_rows=24)
    victim = int(snap.plan[2][1])
    bad_clip = f"clip-{victim:06d}"
    _rot_one_member(snap, victim)
    # Two ranks of a world of two, each on its own node cache: every step comes on both.
    ranks = [_dataset(snap, tmp_path / f"cache{r}", rank=r, world_size=2) for r in (0, 1)]
    runs = [_run(ds) for ds in ranks]
    assert [sorted(r) for r in runs] == [list(range(6))] * 2
    served = [c for run in runs for b in run.values() for c in b["clip_ids"]]
    assert bad_clip not in served
    wanted = {f"clip-{int(r):06d}" for rows in snap.plan for r in rows} - {bad_clip}
    assert wanted <= set(served)
    corrupt = {(rank, s): b["corrupt"] for rank, run in enumerate(runs) for s, b in run.items()}
    hits = {k: v for k, v in corrupt.items() if v}
    assert set(hits) == {(0, s) for s in range(6) if victim in snap.plan[s][:4].tolist()} | {
        (1, s) for s in range(6) if victim in snap.plan[s][4:].tolist()
    }
    assert sum(ds.stats()["corrupt_skipped"] for ds in ranks) == sum(hits.values())
    for run in runs:  # a dropped row leaves a consistent, shorter batch
        for b in run.values():
            n = len(b["clip_ids"])
            assert b["latent"].shape[0] == n == b["rows"].shape[0] == len(b["captions"])
            assert torch.equal(b["latent"].flatten(1)[:, 0], b["rows"].float())
    assert list_failed_members(snap.store) == [snap.member_sha[victim]]

    # A later run at another world size skips the recorded member unread, at the same
    # steps: the decision is the record's, not the reading rank's.
    again = _run(_dataset(snap, tmp_path / "cache-w1", world_size=1))
    for s, b in again.items():
        assert bad_clip not in b["clip_ids"]
        assert b["corrupt"] == sum(corrupt[(r, s)] for r in (0, 1))


def test_on_corrupt_fail_raises_and_still_records(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=2, num_rows=16)
    victim = int(snap.plan[0][0])
    _rot_one_member(snap, victim)
    with pytest.raises(ChecksumMismatch) as exc:
        _run(_dataset(snap, tmp_path / "c1", on_corrupt="fail"))
    assert exc.value.details["clip_id"] == f"clip-{victim:06d}"
    assert list_failed_members(snap.store) == [snap.member_sha[victim]]
    # Recorded now: fail mode refuses it before reading anything.
    with pytest.raises(ChecksumMismatch, match="recorded as corrupt"):
        _run(_dataset(snap, tmp_path / "c2", on_corrupt="fail"))


def test_a_damaged_cache_file_is_not_blamed_on_the_data(tmp_path: Path) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=2, num_rows=16, formats=("pt",))
    cache = tmp_path / "cache"
    first = next(iter(_dataset(snap, cache, world_size=8, verify_hits=False)))
    row = int(first["rows"][0])
    victim = cache / "latents" / "objects" / snap.member_sha[row][:2] / snap.member_sha[row]
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        next(iter(_dataset(snap, cache, world_size=8, verify_hits=False)))
    assert list_failed_members(snap.store) == []


def test_an_unknown_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="on_corrupt"):
        SnapshotDataset(
            tmp_path,
            1,
            cache_dir=tmp_path,
            cache_budget_bytes=MB,
            on_corrupt="ignore",  # type: ignore[arg-type]
        )
