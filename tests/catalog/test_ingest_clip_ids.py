"""A clip batch's given ids are re-derived on a side thread that starts with the
planning (``catalog/ingest.py``): the hashing overlaps the key index's checks, a wrong
id still rejects the batch first, and no check outlives the call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from catalog import _append, idempotency, ingest, key_index, key_index_rows, rules
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidBatch, StorageError
from catalog.key_index import KeyStore, Prepared
from tests.catalog.test_append import _assets, _clips


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[VidlakeCatalog]:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path))
    yield catalog
    catalog.close()


def test_the_ids_are_re_derived_while_the_batch_is_planned(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = _assets(5)["asset_id"].to_pylist()
    cat.add_assets(_assets(5))
    batch = _clips(assets, 20)
    hashing = threading.Event()
    real_ids, real_plan = rules.clip_ids, ingest.Planner._plan_clip_rows

    def clip_ids(*args: Any) -> pa.Array:
        hashing.set()
        return real_ids(*args)

    def plan(self: ingest.Planner, *args: Any) -> ingest.Plan:
        # Planning goes on only once the re-derivation has begun beside it.
        assert hashing.wait(timeout=5), "the ids were not re-derived during planning"
        return real_plan(self, *args)

    monkeypatch.setattr(rules, "clip_ids", clip_ids)
    monkeypatch.setattr(ingest.Planner, "_plan_clip_rows", plan)
    assert cat.add_clips(batch).inserted == 20


def test_a_planning_failure_waits_for_the_check_and_a_wrong_id_comes_first(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = _assets(5)["asset_id"].to_pylist()
    cat.add_assets(_assets(5))
    batch = _clips(assets, 20)
    done = threading.Event()
    real_ids = rules.clip_ids

    def slow_ids(*args: Any) -> pa.Array:
        out = real_ids(*args)
        done.wait(timeout=0.2)  # still hashing when the planning fails
        done.set()
        return out

    def broken(self: ingest.Planner, *args: Any) -> ingest.Plan:
        raise StorageError("the key index is unreadable")

    monkeypatch.setattr(rules, "clip_ids", slow_ids)
    monkeypatch.setattr(ingest.Planner, "_plan_clip_rows", broken)
    with pytest.raises(StorageError):
        cat.add_clips(batch)
    assert done.is_set()  # the side check ended before the error reached the caller
    ids = batch["clip_id"].to_pylist()
    ids[3] = "0" * 32
    wrong = batch.set_column(0, "clip_id", pa.array(ids))

    def invalid(self: ingest.Planner, *args: Any) -> ingest.Plan:
        raise InvalidBatch("row 9, field 'asset_id': unknown asset", row=9, field="asset_id")

    monkeypatch.setattr(ingest.Planner, "_plan_clip_rows", invalid)
    with pytest.raises(InvalidBatch) as exc:
        cat.add_clips(wrong)
    assert (exc.value.row, exc.value.field) == (3, "clip_id")
    # The check's thread ends right after handing over its answer (joined, not polled:
    # it may still be returning when the error reaches the caller).
    for thread in [t for t in threading.enumerate() if t.name == "vidlake-clip-ids"]:
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_the_key_digests_are_sorted_while_the_data_file_is_written(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key index's sorted digests of a clip batch (KeyStore.prepare) are made beside
    # the Parquet write, not after the commit, and the commit's advance uses them.
    assets = _assets(5)["asset_id"].to_pylist()
    cat.add_assets(_assets(5))
    prepared = threading.Event()
    real_prepare, real_write = KeyStore.prepare, _append._write_data_file
    sorted_after: list[str] = []  # each time a batch's digests are sorted

    def prepare(table: str, rows: pa.Table, known: Prepared | None = None) -> Prepared:
        out = real_prepare(table, rows, known)
        prepared.set()
        return out

    def write(*args: Any) -> Any:
        # The file is still being written until the digests are ready.
        assert prepared.wait(timeout=5), "the digests were not prepared during the write"
        return real_write(*args)

    def groups(*args: Any) -> Any:
        sorted_after.append("sorted")
        return real_groups(*args)

    real_groups = key_index._sorted
    monkeypatch.setattr(KeyStore, "prepare", staticmethod(prepare))
    monkeypatch.setattr(_append, "_write_data_file", write)
    batch = _clips(assets, 20)
    assert cat.add_clips(batch).inserted == 20
    monkeypatch.setattr(key_index, "_sorted", groups)
    assert cat.add_clips(_clips(assets, 20, start=20)).inserted == 20
    assert sorted_after == ["sorted"], "the digests were sorted twice (advance did it again)"
    # The index answers as before: every committed clip is a duplicate now.
    assert cat.add_clips(_clips(assets, 30)).duplicates == 30


def test_a_clip_batchs_digests_are_made_once_for_its_check_and_its_commit(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan's duplicate check makes the clips' digests; KeyStore.prepare takes them
    # from the plan instead of deriving them from the committed rows again.
    assets = _assets(5)["asset_id"].to_pylist()
    cat.add_assets(_assets(5))
    real_groups = key_index_rows.view_groups

    def view_groups(view: str, rows: pa.Table) -> Any:
        assert view != "clips", "the clips' digests were made again for the commit"
        return real_groups(view, rows)

    monkeypatch.setattr(key_index, "view_groups", view_groups)
    assert cat.add_clips(_clips(assets, 20)).inserted == 20
    assert cat.add_clips(_clips(assets, 40)).inserted == 20  # the first 20 are duplicates
    assert cat.add_clips(_clips(assets, 30)).duplicates == 30


def test_the_plans_digests_are_those_of_the_rows_it_commits(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = _assets(5)["asset_id"].to_pylist()
    cat.add_assets(_assets(5))
    cat.add_clips(_clips(assets, 10, start=5))
    real_prepare = KeyStore.prepare
    checked: list[int] = []

    def prepare(table: str, rows: pa.Table, known: Prepared | None = None) -> Prepared:
        got = real_prepare(table, rows, known)
        want = real_prepare(table, rows)
        assert known is not None and got.keys() == want.keys()
        for view in want:
            for mine, theirs in zip(got[view], want[view], strict=True):
                assert [(g.width, g.data, g.rows.tolist()) for g in mine] == [
                    (g.width, g.data, g.rows.tolist()) for g in theirs
                ]
        checked.append(rows.num_rows)
        return got

    monkeypatch.setattr(KeyStore, "prepare", staticmethod(prepare))
    # Rows 5-14 are stored, and the batch names rows 20-24 twice: 15 + 5 duplicates.
    batch = pa.concat_tables([_clips(assets, 30), _clips(assets, 5, start=20)])
    result = cat.add_clips(batch)
    assert (result.inserted, result.duplicates) == (20, 15)
    assert checked == [20]


def test_the_id_check_starts_before_the_batchs_sha256_and_never_outlives_the_call(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = _assets(5)["asset_id"].to_pylist()
    cat.add_assets(_assets(5))
    started, finished = threading.Event(), threading.Event()
    real_ids, real_sha = rules.clip_ids, idempotency.batch_sha256

    def clip_ids(*args: Any) -> pa.Array:
        started.set()
        out = real_ids(*args)
        time.sleep(0.2)  # a slow check: the call must still wait for it
        finished.set()
        return out

    def batch_sha256(batch: pa.Table) -> str:
        if "t_start_s" in batch.column_names:
            assert started.wait(timeout=5), "the id check did not start before the SHA-256"
        return real_sha(batch)

    monkeypatch.setattr(rules, "clip_ids", clip_ids)
    monkeypatch.setattr(idempotency, "batch_sha256", batch_sha256)
    batch = _clips(assets, 20)
    assert cat.add_clips(batch).inserted == 20
    assert finished.is_set()
    # A replay returns without planning, and still after the check it started.
    started.clear()
    finished.clear()
    assert cat.add_clips(batch).replayed
    assert finished.is_set()
    # A wrong id is still rejected.
    wrong = batch.set_column(0, "clip_id", pa.array(["0" * 32] * 20, pa.large_string()))
    with pytest.raises(InvalidBatch, match="clip_id"):
        cat.add_clips(wrong)
