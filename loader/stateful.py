"""``StatefulLoader``: a DataLoader over a :class:`~loader.dataset.SnapshotDataset`
that knows where to resume, whatever ``num_workers`` is."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from catalog.errors import InvalidInput
from loader.device import prefetch_to_device

if TYPE_CHECKING:
    from loader.dataset import SnapshotDataset

__all__ = ["StatefulLoader"]


class StatefulLoader:
    """A ``DataLoader`` over a :class:`SnapshotDataset` that knows where to resume.

    It records ``batch["step"] + 1`` of each batch it hands out, so ``state_dict()`` is
    right whatever ``num_workers`` is. A new DataLoader (and new workers) is made for
    every ``iter()``, starting at the recorded step.

    Args:
        dataset: the dataset.
        num_workers: DataLoader worker processes.
        **dataloader_kwargs: passed on (``pin_memory``, ``prefetch_factor``, …);
            ``batch_size`` is always None and ``persistent_workers`` must stay off.
    """

    def __init__(self, dataset: SnapshotDataset, *, num_workers: int = 0, **dataloader_kwargs: Any):
        if dataloader_kwargs.get("persistent_workers"):
            raise InvalidInput("persistent_workers would keep a stale cursor in the workers")
        dataloader_kwargs.pop("batch_size", None)
        self.dataset = dataset
        self.num_workers = num_workers
        self._kwargs = dataloader_kwargs
        self._next_step = dataset.next_step

    def __iter__(self) -> Generator[dict[str, Any], None, None]:
        self.dataset.seek(self._next_step)
        loader: DataLoader[dict[str, Any]] = DataLoader(
            self.dataset, batch_size=None, num_workers=self.num_workers, **self._kwargs
        )
        # Without workers the dataset's own iterator runs the device ring (depth 0: none).
        depth = self.dataset.prefetch_to_device if self.num_workers else 0
        batches = prefetch_to_device(loader, depth, self.dataset.device)
        try:
            for batch in batches:
                self._next_step = int(batch["step"]) + 1
                yield batch
        finally:
            batches.close()

    def __len__(self) -> int:
        return max(0, self.dataset._end() - self._next_step)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's state at the step after the last batch handed out."""
        return self.dataset.state_dict(next_step=self._next_step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state["next_step"]`` (see :meth:`SnapshotDataset.load_state_dict`)."""
        self.dataset.load_state_dict(state)
        self._next_step = self.dataset.next_step
