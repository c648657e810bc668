"""Reruns are no-ops: every batch's idempotency key is recorded in its snapshot
summary, and a rerun returns the first result (issue 11, item 6). The kill -9 loops
are in ``test_ingest_crash.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import catalog.commit as commit_module
from catalog import idempotency
from catalog.catalog import VidlakeCatalog
from catalog.coerce import coerce_batch
from catalog.commit import Ingester
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput
from catalog.tables import TABLES
from tests.catalog.test_catalog import asset, cid, clip, fingerprint, flip, train_ids


@pytest.fixture
def cat(catalog_config: CatalogConfig) -> Any:
    """A catalog with one asset and four clips, on each SQL backend."""
    with VidlakeCatalog.open(catalog_config) as c:
        a = train_ids(c, 1)[0]
        c.add_assets([asset(0, asset_id=a)])
        c.add_clips([clip(a, k) for k in range(4)])
        c.test_clips = [cid(a, k) for k in range(4)]  # type: ignore[attr-defined]
        yield c


def _scores(cat: VidlakeCatalog, job: str = "job-1") -> list[dict[str, Any]]:
    clips = cat.test_clips  # type: ignore[attr-defined]
    return [
        {
            "clip_id": c,
            "filter_name": "aesthetic",
            "filter_version": "2",
            "score": i / 2,
            "job_id": job,
        }
        for i, c in enumerate(clips)
    ]


def test_a_rerun_returns_the_first_result_and_writes_nothing(cat: VidlakeCatalog) -> None:
    first = cat.add_scores(_scores(cat))
    assert (first.inserted, first.replayed) == (4, False)
    assert first.idempotency_key is not None and first.idempotency_key.startswith("sha256:")
    pin = cat.pin()
    again = cat.add_scores(_scores(cat))  # computed_at absent: filled now, not hashed
    assert again.replayed and (again.inserted, again.snapshot_id) == (4, first.snapshot_id)
    assert again.idempotency_key == first.idempotency_key
    assert cat.pin() == pin and cat.scan("scores").num_rows == 4
    # Another batch is another key.
    assert cat.add_scores(_scores(cat, job="job-2")).inserted == 4


def test_the_key_and_counts_are_in_the_snapshot_summary(cat: VidlakeCatalog) -> None:
    result = cat.add_scores(_scores(cat), idempotency_key="filter-job-7:shard-3")
    props = cat.iceberg_table("scores").current_snapshot().summary.additional_properties  # type: ignore[union-attr]
    assert props[idempotency.PROP_KEY] == "filter-job-7:shard-3"
    assert props["vidlake.inserted"] == "4" and props["vidlake.duplicates"] == "0"
    assert len(props[idempotency.PROP_BATCH]) == 64
    # Tables that dedupe by id record their key too.
    clips = cat.iceberg_table("clips").current_snapshot().summary.additional_properties  # type: ignore[union-attr]
    assert clips[idempotency.PROP_KEY].startswith("sha256:") and clips["vidlake.inserted"] == "4"
    assert result.idempotency_key == "filter-job-7:shard-3"


def test_a_callers_key_names_the_batch(
    cat: VidlakeCatalog, caplog: pytest.LogCaptureFixture
) -> None:
    first = cat.add_scores(_scores(cat), idempotency_key="k1")
    changed = [{**r, "score": 9.0} for r in _scores(cat)]  # a recomputed rerun
    with caplog.at_level("WARNING", logger="vidlake.catalog"):
        again = cat.add_scores(changed, idempotency_key="k1")
    assert again.replayed and again.snapshot_id == first.snapshot_id
    assert "was recorded for other rows" in caplog.text  # an operator can see it
    assert cat.scan("scores").num_rows == 4
    for bad in ("", "has space", "x" * 201, "caf\u00e9"):
        with pytest.raises(InvalidInput) as exc:
            cat.add_scores(_scores(cat), idempotency_key=bad)
        assert exc.value.field == "idempotency_key"


def test_canonical_bytes_ignore_column_order_and_input_form(cat: VidlakeCatalog) -> None:
    rows = _scores(cat)
    as_dicts = coerce_batch(TABLES["scores"], rows, fill_time=False)
    table = pa.Table.from_pylist([dict(reversed(list(r.items()))) for r in rows])
    as_arrow = coerce_batch(TABLES["scores"], table, fill_time=False)
    assert idempotency.batch_sha256(as_dicts) == idempotency.batch_sha256(as_arrow)
    reordered = coerce_batch(TABLES["scores"], rows[::-1], fill_time=False)
    assert idempotency.batch_sha256(reordered) != idempotency.batch_sha256(as_dicts)
    # Sent as Arrow, the same rows replay the JSON-shaped batch.
    cat.add_scores(rows)
    assert cat.add_scores(table).replayed


def test_a_lost_commit_race_rechecks_the_key(cat: VidlakeCatalog) -> None:
    """Two writers with one key: the loser's retry finds the winner's commit."""
    other = VidlakeCatalog.open(cat.config)
    real = commit_module.fast_append
    raced: list[Any] = []
    calls: list[str] = []

    def append_after_the_other(*args: Any, **kw: Any) -> None:
        calls.append(args[0].name()[-1])
        if calls == ["scores"]:  # the other writer commits between our plan and commit
            raced.append(other.add_scores(_scores(cat), idempotency_key="same"))
        real(*args, **kw)

    try:
        commit_module.fast_append = append_after_the_other  # type: ignore[assignment]
        mine = cat.add_scores(_scores(cat), idempotency_key="same")
    finally:
        commit_module.fast_append = real
        other.close()
    assert raced[0].inserted == 4 and not raced[0].replayed
    assert mine.replayed and mine.snapshot_id == raced[0].snapshot_id
    assert cat.scan("scores").num_rows == 4
    assert calls == ["scores", "scores"]  # ours lost the race and was not retried


@pytest.mark.parametrize("table", ["captions", "jobs", "tombstones", "asset_events"])
def test_every_append_only_table_replays(cat: VidlakeCatalog, table: str) -> None:
    a = cat.scan("assets", columns=["asset_id"])["asset_id"][0].as_py()
    c = cat.test_clips[0]  # type: ignore[attr-defined]
    row = {
        "captions": {"clip_id": c, "caption_version": "1", "kind": "dense", "text": "a cat"},
        "jobs": {"job_id": "j-1", "stage": "filter"},
        "tombstones": {"asset_id": a, "reason": "dmca", "kind": "soft"},
        "asset_events": {"asset_id": a, "event": "quarantined"},
    }[table]
    add = getattr(cat, f"add_{table}")
    assert add([row]).inserted == 1
    assert add([row]).replayed
    assert cat.scan(table, include_eval=True).num_rows == 1


# -- add_assets: the events commit ---------------------------------------------------------
def _near_dup_batch(cat: VidlakeCatalog, start: int) -> list[dict[str, Any]]:
    """Originals and lower-bitrate re-uploads of them: each re-upload links to its
    original (an event each)."""
    rng = np.random.default_rng(start)
    ids = train_ids(cat, 8, start=start)
    rows = []
    for k in range(4):
        fp = fingerprint(rng)
        rows.append(asset(f"o{start}-{k}", asset_id=ids[2 * k], fingerprint=fp))
        rows.append(
            asset(
                f"c{start}-{k}",
                asset_id=ids[2 * k + 1],
                fingerprint=flip(fp, 1, rng),
                probe={"bitrate": 10},
            )
        )
    return rows


def _links(cat: VidlakeCatalog) -> list[tuple[str, str]]:
    ev = cat.scan("asset_events", include_eval=True)
    pairs = zip(ev["asset_id"].to_pylist(), ev["related_asset_id"].to_pylist(), strict=True)
    return sorted(pairs)


def test_events_lost_between_the_two_commits_are_rederived(tmp_path: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "ref")) as ref:
        batch = _near_dup_batch(ref, 1000)
        first = ref.add_assets(batch)
        assert first.near_duplicates == 4
        expected = _links(ref)
    assert len(expected) == 4
    with VidlakeCatalog.open(
        CatalogConfig.embedded(
            tmp_path / "crashed", eval_salt=ref.eval_salt, eval_fraction=ref.eval_fraction
        )
    ) as cat:
        real = Ingester.append_links
        try:  # the writer dies after the assets commit, before the events commit
            Ingester.append_links = lambda self, events, sid: None  # type: ignore[method-assign,assignment]
            assert cat.add_assets(batch).near_duplicates == 4
        finally:
            Ingester.append_links = real  # type: ignore[method-assign]
        assert _links(cat) == []
        again = cat.add_assets(batch)
        assert again.replayed and again.near_duplicates == 4
        assert _links(cat) == expected
        assert cat.add_assets(batch).replayed and _links(cat) == expected  # once only


def test_any_later_add_assets_repairs_lost_events(tmp_path: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path)) as cat:
        batch = _near_dup_batch(cat, 2000)
        real = Ingester.append_links
        try:
            Ingester.append_links = lambda self, events, sid: None  # type: ignore[method-assign,assignment]
            cat.add_assets(batch)
        finally:
            Ingester.append_links = real  # type: ignore[method-assign]
    # Another process, another batch: it finds the assets commit without its events.
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path)) as cat:
        cat.add_assets(_near_dup_batch(cat, 3000))
        assert len(_links(cat)) == 8
