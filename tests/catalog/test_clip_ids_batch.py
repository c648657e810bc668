"""A batch's clip ids are hashed in one DuckDB statement, off the GIL
(``catalog/rules/ids.py``, docs/decisions/056-clip-ids-off-the-gil.md): the same ids as
:func:`catalog.rules.clip_id`, on any text, with or without DuckDB installed."""

from __future__ import annotations

import hashlib
import sys
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from catalog import rules
from catalog.rules import ids

N = 8192  # above the rows from which a batch is hashed in DuckDB


def _rows(n: int, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    texts = ["", "x:y", "é" * 3, "€😀", "ab" * 32, "a\x00b"]
    assets = [f"{i:064x}" if i % 5 else texts[i % len(texts)] + str(i) for i in range(n)]
    start = rng.integers(0, 10**7, n) / 2e6  # exact half microseconds among them
    end = start + rng.uniform(0.0, 30.0, n)
    versions = [("scenes-v1", "", "vé", "v:2")[i % 4] for i in range(n)]
    return assets, start, end, versions


def _reference(rows: tuple[list[str], np.ndarray, np.ndarray, list[str]]) -> list[str]:
    return [rules.clip_id(*r) for r in zip(*rows, strict=True)]


def test_a_batch_is_hashed_without_a_python_call_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = _rows(N)
    want = _reference(rows)
    calls = []
    real = hashlib.sha256

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(ids.hashlib, "sha256", counted)
    got = rules.clip_ids(*rows)
    assert got.type == pa.large_string()
    assert got.to_pylist() == want
    assert len(calls) == 0, f"{len(calls)} hashlib calls for {N} rows"


def test_the_batch_hash_equals_the_reference_on_any_text() -> None:
    rows = _rows(N, seed=1)
    chunked = pa.chunked_array([rows[0][:100], rows[0][100:]], pa.string())
    assert rules.clip_ids(chunked, rows[1], rows[2], rows[3]).to_pylist() == _reference(rows)


def test_without_duckdb_the_ids_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows(N, seed=2)
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError
    assert ids._batch_sha256_prefixes(pa.array(["a"] * N)) is None
    assert rules.clip_ids(*rows).to_pylist() == _reference(rows)


def test_threads_hash_batches_at_once() -> None:
    # One connection per thread: concurrent batches neither share nor mix results.
    batches = [_rows(N, seed=s) for s in range(4)]
    got: dict[int, list[str]] = {}

    def run(k: int) -> None:
        got[k] = rules.clip_ids(*batches[k]).to_pylist()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[k] == _reference(batches[k]) for k in range(4))
