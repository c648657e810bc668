"""StatefulLoader's hand-over: the first steps read in-process while workers start,
the same batch sequence for any num_workers, resume and world size."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import InvalidInput
from loader.dataset import SnapshotDataset
from loader.stateful import StatefulLoader, _HandOver
from manifests.synthetic import SynthSnapshot, write_snapshot

MB = 1 << 20
STEPS = 24


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> SynthSnapshot:
    return write_snapshot(tmp_path_factory.mktemp("store"), num_steps=STEPS, num_rows=64)


def _ds(snap: SynthSnapshot, cache: Path, rank: int = 0, world: int = 1) -> SnapshotDataset:
    return SnapshotDataset(
        snap.url,
        1,
        rank=rank,
        world_size=world,
        cache_dir=cache,
        cache_budget_bytes=64 * MB,
        cache_reserve_bytes=0,
        prefetch_steps=2,
        prefetch_threads=2,
    )


def _expected(snap: SynthSnapshot, steps: range) -> list[tuple[int, list[int]]]:
    return [(s, [int(r) for r in snap.plan[s]]) for s in steps]


def _seen(batches: list[dict[str, Any]]) -> list[tuple[int, list[int]]]:
    return [(int(b["step"]), b["rows"].tolist()) for b in batches]


def _late_claim(mp: pytest.MonkeyPatch, lead: int) -> None:
    """Workers (forked: they inherit the patch) claim only once the training process
    has submitted ``lead`` steps or all of them: a hand-over mid-way, deterministically."""
    real = _HandOver.claim

    def claim(self: _HandOver) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with self._cell.get_lock():
                if self._cell[0] >= lead or self._cell[1] >= 0:
                    break
            time.sleep(0.002)
        return real(self)

    mp.setattr(_HandOver, "claim", claim)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_same_sequence_for_any_workers_with_a_hand_over_mid_way(
    snap: SynthSnapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    _late_claim(monkeypatch, lead=7)
    loader = StatefulLoader(_ds(snap, tmp_path / "c"), num_workers=workers)
    batches = list(loader)
    assert _seen(batches) == _expected(snap, range(STEPS))
    assert loader.state_dict()["next_step"] == STEPS
    if workers:
        assert loader.handed_over_at is not None and 7 <= loader.handed_over_at < STEPS
    else:
        assert loader.handed_over_at is None


def test_training_process_reads_everything_when_workers_never_come(
    snap: SynthSnapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _late_claim(monkeypatch, lead=STEPS + 1)  # never before the end
    loader = StatefulLoader(_ds(snap, tmp_path / "c"), num_workers=2)
    assert _seen(list(loader)) == _expected(snap, range(STEPS))
    assert loader.handed_over_at == STEPS


def test_resume_across_the_hand_over_with_another_world_size(
    snap: SynthSnapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _late_claim(monkeypatch, lead=5)
    loader = StatefulLoader(_ds(snap, tmp_path / "c", rank=0, world=2), num_workers=2)
    first: list[dict[str, Any]] = []
    for batch in loader:
        first.append(batch)
        if batch["step"] == 11:  # past the hand-over (5 <= H): workers' batches too
            break
    assert loader.handed_over_at is not None and loader.handed_over_at <= 11
    state = loader.state_dict()
    assert state["next_step"] == 12
    # Each of 4 ranks resumes there with 2 workers; together they give every row once.
    ranks = []
    for rank in range(4):
        again = StatefulLoader(_ds(snap, tmp_path / "c", rank=rank, world=4), num_workers=2)
        again.load_state_dict(state)
        ranks.append(list(again))
        assert again.state_dict()["next_step"] == STEPS
    for i, step in enumerate(range(12, STEPS)):
        assert [int(b["step"]) for b in (r[i] for r in ranks)] == [step] * 4
        rows = [x for r in ranks for x in r[i]["rows"].tolist()]
        assert rows == [int(x) for x in snap.plan[step]]
    half = [x for b in first for x in b["rows"].tolist()]
    assert half == [x for s in range(12) for x in [int(r) for r in snap.plan[s]][:4]]


def _hold(event: Any, _worker_id: int) -> None:
    event.wait(60)


def test_first_batches_do_not_wait_for_the_workers(snap: SynthSnapshot, tmp_path: Path) -> None:
    """Workers that are not ready (held in worker_init_fn) do not delay the first batch."""
    import functools

    event = multiprocessing.get_context("fork").Event()
    loader = StatefulLoader(
        _ds(snap, tmp_path / "c"),
        num_workers=2,
        worker_init_fn=functools.partial(_hold, event),
        multiprocessing_context="fork",
    )
    it = iter(loader)
    t0 = time.monotonic()
    head = [next(it) for _ in range(3)]
    assert time.monotonic() - t0 < 30  # before the workers, held for up to 60 s, run
    event.set()
    batches = head + list(it)
    assert _seen(batches) == _expected(snap, range(STEPS))
    assert loader.handed_over_at is not None and loader.handed_over_at >= 3


def test_hand_over_off_and_bad_arguments(snap: SynthSnapshot, tmp_path: Path) -> None:
    loader = StatefulLoader(_ds(snap, tmp_path / "c"), num_workers=2, hand_over=False)
    assert _seen(list(loader)) == _expected(snap, range(STEPS))
    assert loader.handed_over_at is None
    with pytest.raises(InvalidInput, match="multiprocessing_context"):
        StatefulLoader(loader.dataset, num_workers=1, multiprocessing_context="nope")
    with pytest.raises(InvalidInput, match="num_workers"):
        StatefulLoader(loader.dataset, num_workers=-1)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_hand_over_under_forkserver(snap: SynthSnapshot, tmp_path: Path, persistent: bool) -> None:
    """The shared hand-over cell travels to workers that are not forks of this process;
    a second iter() (resumed mid-way; kept workers or new ones) continues the sequence."""
    loader = StatefulLoader(
        _ds(snap, tmp_path / "c"),
        num_workers=2,
        multiprocessing_context="forkserver",
        persistent_workers=persistent,
    )
    it = iter(loader)
    head = [next(it)]
    deadline = time.monotonic() + 120
    while loader.handed_over_at is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the workers claim while this process holds its first steps
    assert loader.handed_over_at is not None and loader.handed_over_at < 9
    for batch in it:
        head.append(batch)
        if batch["step"] == 9:
            break
    it.close()
    rest = list(loader)  # a new iter(): new workers from the recorded step
    assert _seen(head + rest) == _expected(snap, range(STEPS))
    assert loader.state_dict()["next_step"] == STEPS


def test_a_worker_start_failure_is_raised_even_when_no_step_was_left(
    snap: SynthSnapshot, tmp_path: Path
) -> None:
    """A spawn worker's start that fails (an unpicklable worker_init_fn) is not lost
    because the training process happened to read every step itself."""
    loader = StatefulLoader(
        _ds(snap, tmp_path / "c"),
        num_workers=1,
        worker_init_fn=lambda _: None,  # a lambda cannot be pickled for spawn
        multiprocessing_context="spawn",
    )
    with pytest.raises(Exception, match=r"pickle|lambda"):
        list(loader)


def test_persistent_workers_take_their_start_from_the_hand_over_each_iter(
    snap: SynthSnapshot, tmp_path: Path
) -> None:
    """Kept workers used to keep the cursor they were started with; now each iter()
    they claim the hand-over step again: continuing, and after load_state_dict."""
    loader = StatefulLoader(_ds(snap, tmp_path / "c"), num_workers=2, persistent_workers=True)
    head = []
    for batch in loader:
        head.append(batch)
        if batch["step"] == 9:
            break
    kept = loader._kept
    rest = list(loader)  # the same workers, from step 10
    assert _seen(head + rest) == _expected(snap, range(STEPS))
    loader.load_state_dict(loader.dataset.state_dict(next_step=3))
    again = list(loader)
    assert _seen(again) == _expected(snap, range(3, STEPS))
    assert loader._kept is kept and loader.state_dict()["next_step"] == STEPS
    for bad in ({"num_workers": 0}, {"num_workers": 2, "hand_over": False}):
        with pytest.raises(InvalidInput, match="persistent_workers"):
            StatefulLoader(loader.dataset, persistent_workers=True, **bad)  # type: ignore[arg-type]


def test_the_shared_cell_is_made_off_the_training_thread(
    snap: SynthSnapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under spawn the shared array (~40 ms: it starts the resource tracker) is made in
    the workers' starting thread, not before the first batch; workers that never come
    (a DataLoader that starts none) leave every step to the training process."""
    import threading

    from torch.utils.data import DataLoader

    made: list[bool] = []
    real = _HandOver.share

    def share(self: _HandOver) -> None:
        made.append(threading.current_thread() is threading.main_thread())
        real(self)

    monkeypatch.setattr(_HandOver, "share", share)
    monkeypatch.setattr(DataLoader, "__iter__", lambda self: iter(()))
    loader = StatefulLoader(
        _ds(snap, tmp_path / "c"), num_workers=2, multiprocessing_context="spawn"
    )
    assert _seen(list(loader)) == _expected(snap, range(STEPS))
    assert made == [False]


def test_sharing_the_cell_mid_way_keeps_the_hand_over_exact() -> None:
    import threading

    hand = _HandOver(multiprocessing.get_context("spawn"), 5, 50)
    steps = hand.own_steps()
    taken = [next(steps) for _ in range(3)]
    sharer = threading.Thread(target=hand.share)
    sharer.start()
    taken += [next(steps) for _ in range(10)]  # while the cell is being made
    sharer.join()
    taken.append(next(steps))
    assert hand.claim() == 19 and hand.step == 19  # the first step not taken
    assert taken == list(range(5, 19)) and list(steps) == []
