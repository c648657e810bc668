"""Eval decontamination against the pinned catalog's eval clips."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from catalog.embeddings import EmbeddingIndex
from materializer.dedup import decontaminate


def test_decontaminate_checks_train_clips_against_the_eval_ids_given(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 8))
    near = base[0] + 1e-4 * rng.standard_normal(8)  # t0 sits on top of e0
    index = EmbeddingIndex(tmp_path, "m")
    # e1 is labelled 'train' by its producer; the catalog says eval, and that wins.
    index.add(
        ["t0", "t1", "t2", "e0", "e1"],
        ["A", "B", "C", "D", "E"],
        ["train", "train", "train", "eval", "train"],
        np.stack([near, base[1], base[2], base[0], base[2] + 1e-4]),
    )
    found = decontaminate(index, ["t0", "t1", "t2", "t9"], ["e0", "e1", "e2"], 0.01)
    assert found.dropped == {"t0", "t2"}
    assert (found.eval_clips, found.eval_clips_with_vectors) == (3, 2)
    assert found.coverage == 2 / 3
    assert (found.train_clips, found.train_clips_checked) == (4, 3)
    pinned = index.at(index.version)
    index.add(["e2"], ["F"], ["eval"], base[1:2])
    assert decontaminate(pinned, ["t1"], ["e2"], 0.01).dropped == frozenset()
    assert decontaminate(index, ["t1"], ["e2"], 0.01).dropped == {"t1"}
    none = decontaminate(index, ["t1"], [], 0.01)
    assert none.coverage == 1.0 and none.dropped == frozenset()
