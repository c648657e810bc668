"""Integrity errors of the loader name the clip and the object (issue 11, item 5), so
that a bad latent is traced to its catalog row, not to a batch position."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from catalog.errors import ChecksumMismatch, IntegrityError
from loader.batch import BatchBuffer, PartOut, Step, StepParts
from loader.dataset import SnapshotDataset
from loader.plan import StepInfo
from manifests.synthetic import write_snapshot
from tests.loader.synth import CorruptingSource

MB = 1 << 20


@pytest.mark.parametrize("pack", [1, 3])
def test_a_corrupt_member_names_its_clip_and_object(tmp_path: Path, pack: int) -> None:
    snap = write_snapshot(tmp_path / "store", num_steps=2, pack=pack)
    ds = SnapshotDataset(
        CorruptingSource(snap.store, artifacts=False),
        1,
        cache_dir=tmp_path / "cache",
        cache_budget_bytes=64 * MB,
        cache_reserve_bytes=0,
        prefetch_steps=0,
        on_corrupt="fail",
    )
    with pytest.raises(ChecksumMismatch) as exc:
        next(iter(ds))
    err = exc.value
    row = snap.index.filter(pa.compute.equal(snap.index["clip_id"], err.clip_id))
    assert row.num_rows == 1
    assert err.object_sha256 == row["object_sha256"][0].as_py()
    assert err.offset == row["offset"][0].as_py() and err.length == row["length"][0].as_py()
    assert err.clip_id in err.message and err.object_sha256 in err.message


def test_a_latent_that_does_not_fit_its_bucket_names_its_clip() -> None:
    info = StepInfo(
        step=4, phase=0, bucket=1, stream_epochs=np.zeros(1, np.int32), batch_size=2, skipped=0
    )
    buffer = BatchBuffer(2, None)
    assert buffer.slots(0, {"latent": (torch.float32, (2, 9, 3, 3))}) is not None
    part: Future[PartOut] = Future()
    part.set_result(([None, {"latent": torch.zeros(2, 4, 3, 3)}], {}, [None, None], {}))
    table = {"clip_id": ["clip-a", "clip-b"], "object_sha256": ["aa" * 32, "bb" * 32]}
    step = Step(info, np.array([10, 11]), table, [None, None], buffer, StepParts([part]))
    with pytest.raises(IntegrityError) as exc:
        step.assemble()
    assert (exc.value.clip_id, exc.value.object_sha256, exc.value.row) == ("clip-b", "bb" * 32, 11)
    assert "clip-b" in exc.value.message


def test_a_steps_parts_give_rows_in_order_and_raise_the_first_failed_row() -> None:
    info = StepInfo(
        step=2, phase=0, bucket=0, stream_epochs=np.zeros(1, np.int32), batch_size=4, skipped=0
    )
    buffer = BatchBuffer(4, None)
    assert buffer.slots(0, {"latent": (torch.float32, (1, 2))}) is not None
    table = {"clip_id": ["a", "b", "c", "d"], "object_sha256": ["aa" * 32] * 4}

    def part(*out: object) -> Future[PartOut]:
        f: Future[PartOut] = Future()
        f.set_result(out)  # type: ignore[arg-type]
        return f

    emb = torch.ones(3)
    parts = StepParts(
        [part([None, None], {}, [emb, None], {}), part([None, None], {}, [emb, emb], {})]
    )
    batch = Step(info, np.arange(4), table, ["w"] * 4, buffer, parts).assemble()
    assert batch["clip_ids"] == ["a", "b", "c", "d"]
    assert batch["text_embeddings"][0] is emb and batch["text_embeddings"][1] is None
    # Row 1's failure, not row 3's (in a later part), nor row 2's embedding's.
    first, later = IntegrityError("row 1"), IntegrityError("row 3")
    parts = StepParts(
        [
            part([None, None], {1: first}, [None, None], {}),
            part([None, None], {1: later}, [None, None], {0: ValueError("embedding")}),
        ]
    )
    with pytest.raises(IntegrityError) as exc:
        Step(info, np.arange(4), table, ["w"] * 4, buffer, parts).assemble()
    assert exc.value is first
