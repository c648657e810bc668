"""The GPU prefetch ring (loader.device): scheduling with a fake backend, the CPU path."""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from catalog.errors import InvalidInput
from loader import device as device_mod
from loader.dataset import SnapshotDataset, StatefulLoader
from loader.device import check_device, prefetch_to_device
from manifests.synthetic import write_snapshot

MB = 1 << 20


class FakeBackend:
    """Records every primitive; a "device" tensor is a clone the backend made."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.events = 0
        self.on_device: set[int] = set()

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        self.log.append(("pin", int(tensor.flatten()[0])))
        return tensor

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        self.on_device.add(id(out))
        self.log.append(("copy", int(tensor.flatten()[0])))
        return out

    def record(self) -> int:
        self.events += 1
        self.log.append(("record", self.events))
        return self.events

    def wait(self, event: Any) -> None:
        self.log.append(("wait", event))

    def hand_over(self, tensor: torch.Tensor) -> None:
        assert id(tensor) in self.on_device
        self.log.append(("hand_over", int(tensor.flatten()[0])))


def _batches(n: int, pulled: list[int]) -> Generator[dict[str, Any], None, None]:
    for i in range(n):
        pulled.append(i)
        yield {
            "latent": torch.full((2, 3), float(i)),
            "extra": [torch.full((1,), float(i)), "text"],
            "meta": torch.empty(2, device="meta"),  # not a CPU tensor: left as it is
            "step": i,
            "clip_ids": [f"c{i}"],
        }


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_ring_stays_depth_batches_ahead_in_order(depth: int) -> None:
    backend = FakeBackend()
    pulled: list[int] = []
    n = 7
    ring = prefetch_to_device(_batches(n, pulled), depth, "cuda", backend=backend)
    for i, batch in enumerate(ring):
        assert batch["step"] == i and batch["clip_ids"] == [f"c{i}"]
        # While batch i is held, batches i+1 .. i+depth are staged, and no more.
        assert pulled[-1] == min(i + depth, n - 1)
        copied = [v for op, v in backend.log if op == "copy"]
        assert max(copied) == min(i + depth, n - 1)
        assert id(batch["latent"]) in backend.on_device
        assert id(batch["extra"][0]) in backend.on_device and batch["extra"][1] == "text"
        assert batch["meta"].device.type == "meta"
        assert torch.equal(batch["latent"], torch.full((2, 3), float(i)))
    assert pulled == list(range(n))


def test_consumer_waits_on_its_batch_event_then_takes_the_tensors() -> None:
    backend = FakeBackend()
    ring = prefetch_to_device(_batches(4, []), 2, "cuda", backend=backend)
    for i, _batch in enumerate(ring):
        log = backend.log
        # Batch i's event is the one recorded right after batch i's two copies.
        copies_i = [k for k, (op, v) in enumerate(log) if op == "copy" and v == i]
        event_i = next(v for op, v in log[copies_i[-1] :] if op == "record")
        waits = [v for op, v in log if op == "wait"]
        assert waits[-1] == event_i and waits == sorted(waits) and len(waits) == i + 1
        # Each copy reads a pinned tensor; the hand-over follows the wait.
        for k in copies_i:
            assert log[k - 1] == ("pin", i)
        last_wait = max(k for k, (op, _) in enumerate(log) if op == "wait")
        handed = [v for op, v in log[last_wait:] if op == "hand_over"]
        assert handed == [i, i]


def test_closing_the_ring_closes_the_source() -> None:
    closed: list[bool] = []

    def source() -> Iterator[dict[str, Any]]:
        try:
            yield from _batches(10, [])
        finally:
            closed.append(True)

    ring = prefetch_to_device(source(), 2, "cuda", backend=FakeBackend())
    next(ring)
    ring.close()
    assert closed == [True]


def test_an_error_in_the_source_reaches_the_consumer_in_order() -> None:
    def source() -> Iterator[dict[str, Any]]:
        yield from _batches(2, [])
        raise RuntimeError("fetch failed")

    ring = prefetch_to_device(source(), 3, "cuda", backend=FakeBackend())
    with pytest.raises(RuntimeError, match="fetch failed"):
        list(ring)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_without_cuda_one_log_line_and_ordinary_tensors(caplog: pytest.LogCaptureFixture) -> None:
    device_mod._say_no_ring.cache_clear()
    batches = list(_batches(3, []))
    with caplog.at_level(logging.INFO, logger="loader.device"):
        for _ in range(2):
            out = list(prefetch_to_device(iter(batches), 2, "cuda"))
            assert all(a is b for a, b in zip(out, batches, strict=True))
    lines = [r.getMessage() for r in caplog.records if r.name == "loader.device"]
    assert len(lines) == 1 and "CUDA is not available" in lines[0]


def test_cpu_device_and_depth_zero_pass_batches_through() -> None:
    batches = list(_batches(2, []))
    for depth, dev in ((2, "cpu"), (0, "cuda"), (0, None)):
        out = list(prefetch_to_device(iter(batches), depth, dev))
        assert all(a is b for a, b in zip(out, batches, strict=True))


@pytest.mark.parametrize(
    ("depth", "dev"), [(-1, "cuda"), (1.5, "cuda"), (True, "cuda"), (2, "nonsense")]
)
def test_bad_options_are_refused(tmp_path: Path, depth: Any, dev: str) -> None:
    with pytest.raises(InvalidInput):
        check_device(depth, dev)
    with pytest.raises(InvalidInput):
        SnapshotDataset(
            tmp_path,
            1,
            cache_dir=tmp_path,
            cache_budget_bytes=MB,
            prefetch_to_device=depth,
            device=dev,
        )


# -- wired into the dataset -----------------------------------------------------------------
@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[FakeBackend]:
    """Make the default backend a fake one, as if CUDA were present."""
    made: list[FakeBackend] = []

    def backend(_device: torch.device) -> FakeBackend:
        made.append(FakeBackend())
        return made[-1]

    monkeypatch.setattr(device_mod, "CudaBackend", backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return made


def _dataset(tmp_path: Path, **kw: Any) -> SnapshotDataset:
    snap = write_snapshot(tmp_path / "store", num_steps=8)
    return SnapshotDataset(
        snap.url,
        1,
        cache_dir=tmp_path / "cache",
        cache_budget_bytes=64 * MB,
        cache_reserve_bytes=0,
        **kw,
    )


def test_dataset_cursor_is_the_handed_over_batch_not_the_ring(
    tmp_path: Path, fake_cuda: list[FakeBackend]
) -> None:
    plain = [b["latent"] for b in _dataset(tmp_path / "a")]
    ds = _dataset(tmp_path / "b", prefetch_to_device=3, device="cuda:0")
    it = iter(ds)
    for step in range(5):
        batch = next(it)
        assert batch["step"] == step and torch.equal(batch["latent"], plain[step])
        assert id(batch["latent"]) in fake_cuda[0].on_device
        assert ds.state_dict()["next_step"] == step + 1  # three more already staged
    it.close()
    assert len(fake_cuda) == 1


def test_stateful_loader_runs_the_ring_over_worker_batches(
    tmp_path: Path, fake_cuda: list[FakeBackend]
) -> None:
    loader = StatefulLoader(_dataset(tmp_path, prefetch_to_device=2), num_workers=2)
    steps = []
    for batch in loader:
        steps.append(batch["step"])
        assert id(batch["latent"]) in fake_cuda[-1].on_device
        if batch["step"] == 4:
            break
    assert steps == [0, 1, 2, 3, 4] and loader.state_dict()["next_step"] == 5
    assert len(fake_cuda) == 1  # one ring, in this process; none in the workers
    loader = StatefulLoader(_dataset(tmp_path / "w0", prefetch_to_device=2), num_workers=0)
    assert [b["step"] for b in loader] == list(range(8))
    assert len(fake_cuda) == 2  # the dataset's own iterator ran it


def test_another_device_type_gets_a_plain_move(caplog: pytest.LogCaptureFixture) -> None:
    device_mod._say_no_ring.cache_clear()
    with caplog.at_level(logging.WARNING, logger="loader.device"):
        out = list(prefetch_to_device(_batches(2, []), 2, "meta"))
    assert [b["latent"].device.type for b in out] == ["meta", "meta"]
    assert out[1]["extra"][0].device.type == "meta" and out[1]["step"] == 1
    assert "plain .to(meta)" in caplog.records[-1].getMessage()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_the_benchmark_says_it_skipped_without_cuda() -> None:
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gpu_prefetch.py"), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    (line,) = out.stdout.splitlines()
    assert json.loads(line) == {
        "benchmark": "gpu_prefetch",
        "skipped": f"CUDA is not available (torch {torch.__version__})",
    }
