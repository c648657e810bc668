"""The GPU prefetch ring: batches copied to the device ``k`` steps ahead of the consumer.

:func:`prefetch_to_device` wraps any iterator of batch dicts (a
:class:`~loader.dataset.SnapshotDataset` iterator, a DataLoader). While the consumer
holds batch ``i``, batches ``i+1 .. i+k`` are staged: every CPU tensor of each is put in
pinned host memory and copied to the device on a side CUDA stream, and an event is
recorded on that stream after the batch's last copy. Handing batch ``i`` over makes the
consumer's *current* stream wait on batch ``i``'s event (a GPU-side wait: the host does
not block, and later batches' copies keep running), then marks each device tensor as used
by the current stream so the caching allocator does not hand its memory back to the side
stream while the consumer still reads it. Pinned blocks come from torch's caching host
allocator, which keeps a block until the copies that read it have completed.

Non-tensor values (ids, captions, counts) pass through; lists, tuples and dicts are
walked. The ring holds ``k + 1`` batches of device memory at most. A tensor already
pinned (a DataLoader with ``pin_memory=True`` pins in its own thread) is copied as it
is; any other is first copied into pinned memory, on the consumer's thread.

Without CUDA (or for ``device="cpu"``) there is no ring: one log line says so, and the
batches come through as ordinary CPU tensors. Another device type (``mps``, ``xpu``)
gets a plain synchronous ``.to(device)`` per batch, also said in one log line.

The scheduling (ring depth, order, which event is waited on) is separate from the CUDA
calls: a :class:`DeviceBackend` does the four primitives, :class:`CudaBackend` is the
real one, and tests pass a fake one.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from catalog.errors import InvalidInput

__all__ = ["CudaBackend", "DeviceBackend", "check_device", "prefetch_to_device"]

log = logging.getLogger(__name__)


class DeviceBackend(Protocol):
    """The primitives of the ring; every call is made on the consumer's thread.

    ``copy`` enqueues one host-to-device copy of a pinned tensor on the side stream and
    returns the device tensor; ``record`` records an event on the side stream after the
    copies enqueued so far; ``wait`` makes the consumer's current stream wait on such an
    event; ``hand_over`` marks a device tensor as used by the current stream.
    """

    def pin(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def copy(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def record(self) -> Any: ...

    def wait(self, event: Any) -> None: ...

    def hand_over(self, tensor: torch.Tensor) -> None: ...


class CudaBackend:
    """The CUDA primitives: a side stream of its own on ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.is_pinned() else tensor.pin_memory()

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(self.stream):
            return tensor.to(self.device, non_blocking=True)

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def hand_over(self, tensor: torch.Tensor) -> None:
        tensor.record_stream(torch.cuda.current_stream(self.device))


@dataclass
class _Staged:
    """One batch in the ring: its device tensors are being copied until ``event``."""

    batch: Any
    event: Any
    tensors: list[torch.Tensor]


def check_device(depth: int, device: str | torch.device | None) -> torch.device | None:
    """Validate the dataset option; the device (``cuda`` by default) or None when off.

    Raises:
        InvalidInput: ``depth`` is not an integer >= 0, or ``device`` names no device.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise InvalidInput(f"prefetch_to_device must be an integer >= 0, got {depth!r}")
    if depth == 0:
        return None
    try:
        return torch.device("cuda" if device is None else device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidInput(f"device {device!r} is not a torch device: {exc}") from exc


def prefetch_to_device(
    batches: Iterable[Any],
    depth: int,
    device: str | torch.device | None = None,
    *,
    backend: DeviceBackend | None = None,
) -> Generator[Any, None, None]:
    """Yield ``batches`` with their tensors on ``device``, copied ``depth`` batches ahead.

    Args:
        batches: batch dicts (or any nesting of lists, tuples and dicts of tensors).
        depth: batches staged ahead of the one the consumer holds (>= 1).
        device: the target (default ``cuda``, the current CUDA device).
        backend: the primitives; default :class:`CudaBackend` when CUDA is available.

    Closing the generator closes ``batches`` when it can be closed (a dataset
    iterator's threads and cache connections are released then).
    """
    target = check_device(depth, device)
    source = iter(batches)
    try:
        if target is None:
            yield from source
        elif backend is not None:
            yield from _ring(source, depth, backend)
        elif target.type == "cuda" and torch.cuda.is_available():
            yield from _ring(source, depth, CudaBackend(target))
        else:
            _say_no_ring(str(target))
            # No CUDA: the batches as they are; another device: a plain move each.
            yield from source if target.type in ("cpu", "cuda") else _plain(source, target)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _ring(source: Iterator[Any], depth: int, backend: DeviceBackend) -> Generator[Any, None, None]:
    ring: collections.deque[_Staged] = collections.deque()

    def fill(to: int) -> None:
        while len(ring) < to and (batch := next(source, _END)) is not _END:
            ring.append(_stage(batch, backend))

    fill(1)
    while ring:
        current = ring.popleft()
        # While the consumer holds batch i, batches i+1 .. i+depth are being copied.
        fill(depth)
        backend.wait(current.event)
        for tensor in current.tensors:
            backend.hand_over(tensor)
        yield current.batch
        if not ring:
            fill(1)


_END = object()


def _stage(batch: Any, backend: DeviceBackend) -> _Staged:
    """Pin and enqueue the copies of one batch, then record its event."""
    tensors: list[torch.Tensor] = []

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                return value
            out = backend.copy(backend.pin(value))
            tensors.append(out)
            return out
        return _walk(value, move)

    staged = move(batch)
    return _Staged(staged, backend.record(), tensors)


def _walk(value: Any, move: Any) -> Any:
    if isinstance(value, dict):
        return {k: move(v) for k, v in value.items()}
    if isinstance(value, list):
        return [move(v) for v in value]
    if isinstance(value, tuple):
        return tuple(move(v) for v in value)
    return value


def _plain(source: Iterator[Any], target: torch.device) -> Generator[Any, None, None]:
    def move(value: Any) -> Any:
        return value.to(target) if isinstance(value, torch.Tensor) else _walk(value, move)

    for batch in source:
        yield move(batch)


@functools.cache
def _say_no_ring(device: str) -> None:
    """The one log line per process and device for a request the ring cannot serve."""
    if device == "cpu":
        log.info("prefetch_to_device: device is cpu; batches stay ordinary CPU tensors")
    elif device.startswith("cuda"):
        log.warning(
            "prefetch_to_device: CUDA is not available; batches are delivered as "
            "ordinary CPU tensors"
        )
    else:
        log.warning(
            "prefetch_to_device: no copy ring for device %s; each batch is moved with a "
            "plain .to(%s)",
            device,
            device,
        )
