"""The catalog's behaviour suite: every ingest rule and read, on SQLite and PostgreSQL.

Each test gets a fresh catalog from the ``catalog_config`` fixture (parametrised over
both SQL backends in ``tests/fixtures/postgres.py``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from catalog import rules
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import Conflict, InvalidBatch, InvalidInput
from catalog.pins import Pin
from catalog.tables import TABLE_NAMES, TABLES
from tests.catalog._latents import npy_bytes, safetensors_bytes

RNG_SEED = 7


# -- data helpers ---------------------------------------------------------------------
def aid(i: int | str) -> str:
    return hashlib.sha256(f"asset-{i}".encode()).hexdigest()


def fingerprint(rng: np.random.Generator, frames: int = 8) -> list[int]:
    """Random informative frame hashes (about half the bits set)."""
    out = []
    while len(out) < frames:
        h = int(rng.integers(0, 2**63)) | (int(rng.integers(0, 2)) << 63)
        if 16 <= h.bit_count() <= 48:
            out.append(h)
    return out


def flip(frames: list[int], bits: int, rng: np.random.Generator) -> list[int]:
    """Each frame with ``bits`` distinct bits flipped."""
    return [h ^ sum(1 << int(b) for b in rng.choice(64, bits, replace=False)) for h in frames]


def asset(i: int | str, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "asset_id": aid(i),
        "uri": f"s3://raw/{i}.mp4",
        "size": 1000,
        "source_tier": "crawl",
        "probe": {"codec": "h264", "width": 1280, "height": 720, "bitrate": 1_000_000},
    }
    row.update(over)
    return row


def clip(asset_id: str, k: int = 0, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "asset_id": asset_id,
        "t_start_s": 2.0 * k,
        "t_end_s": 2.0 * k + 1.5,
        "split_version": "scenes-v1",
        "num_frames": 36,
        "width": 1280,
        "height": 720,
        "fps": 24.0,
    }
    row.update(over)
    return row


def cid(asset_id: str, k: int = 0) -> str:
    return rules.clip_id(asset_id, 2.0 * k, 2.0 * k + 1.5, "scenes-v1")


def train_ids(cat: VidlakeCatalog, n: int, start: int = 0) -> list[str]:
    """``n`` asset ids that the catalog's carve-out puts in train."""
    ids = [aid(i) for i in range(start, start + 4 * n + 50)]
    mask = rules.eval_mask(ids, cat.eval_salt, cat.eval_fraction)
    return [a for a, e in zip(ids, mask, strict=True) if not e][:n]


@pytest.fixture
def cat(catalog_config: CatalogConfig) -> Any:
    with VidlakeCatalog.open(catalog_config) as c:
        yield c


def count(cat: VidlakeCatalog, table: str, pin: Pin | None = None) -> int:
    return cat.scan(table, pin, include_eval=True).num_rows


# -- opening --------------------------------------------------------------------------
def test_open_creates_every_table_with_its_schema_and_freezes_eval(
    catalog_config: CatalogConfig,
) -> None:
    with VidlakeCatalog.open(catalog_config) as cat:
        for name in TABLE_NAMES:
            tbl = cat.iceberg_table(name)
            assert tbl.schema().as_struct() == TABLES[name].schema.as_struct(), name
            assert [f.source_id for f in tbl.spec().fields] == [
                TABLES[name].schema.find_field(c).field_id for c in TABLES[name].partition_by
            ]
        salt, fraction = cat.eval_salt, cat.eval_fraction
        assert len(bytes.fromhex(salt)) == 32 and fraction == 0.02
        assert cat.pin().to_dict() == dict.fromkeys(TABLE_NAMES)
    # Reopening finds the frozen values; naming them again is fine, changing them is not.
    with VidlakeCatalog.open(catalog_config) as again:
        assert (again.eval_salt, again.eval_fraction) == (salt, fraction)
    same = catalog_config.model_copy(update={"eval_fraction": 0.02, "eval_salt": salt})
    VidlakeCatalog.open(same).close()
    with pytest.raises(Conflict) as exc:
        VidlakeCatalog.open(catalog_config.model_copy(update={"eval_fraction": 0.05}))
    assert exc.value.field == "eval_fraction"
    with pytest.raises(Conflict):
        VidlakeCatalog.open(catalog_config.model_copy(update={"eval_salt": "ab" * 32}))


def test_explicit_salt_and_fraction_are_frozen_at_creation(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path, eval_fraction=0.5, eval_salt="00" * 32)
    with VidlakeCatalog.open(config) as cat:
        assert (cat.eval_fraction, cat.eval_salt) == (0.5, "00" * 32)
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path)) as cat:
        assert (cat.eval_fraction, cat.eval_salt) == (0.5, "00" * 32)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        CatalogConfig(eval_fraction=1.5)
    with pytest.raises(ValueError):
        CatalogConfig(eval_salt="not hex")
    with pytest.raises(ValueError):
        CatalogConfig(near_dup_min_frames=9, near_dup_window=8)


# -- assets ---------------------------------------------------------------------------
def test_assets_are_idempotent_and_batch_duplicates_collapse(cat: VidlakeCatalog) -> None:
    rows = [asset(i) for i in range(20)]
    first = cat.add_assets([*rows, rows[3], rows[7]])
    assert (first.inserted, first.duplicates) == (20, 2)
    assert first.snapshot_id == cat.pin()["assets"]
    again = cat.add_assets(pa.Table.from_pylist(rows[:10]))
    assert (again.inserted, again.duplicates) == (0, 10)
    assert again.snapshot_id == first.snapshot_id  # nothing committed
    ids = cat.scan("assets", include_eval=True)["asset_id"]
    assert len(ids) == 20 and pc.count_distinct(ids).as_py() == 20
    stored = cat.scan("assets", columns=["asset_id", "probe_codec", "opt_out"], include_eval=True)
    assert set(stored["probe_codec"].to_pylist()) == {"h264"}
    assert not any(stored["opt_out"].to_pylist())  # the default


def test_eval_split_is_the_salted_hash_and_never_recomputed(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path, eval_fraction=0.3)
    with VidlakeCatalog.open(config) as cat:
        ids = [aid(i) for i in range(300)]
        result = cat.add_assets([asset(i) for i in range(300)])
        expected = rules.eval_mask(ids, cat.eval_salt, 0.3)
        assert result.eval == int(expected.sum()) > 0
        got = cat.scan("assets", columns=["asset_id", "split"], include_eval=True)
        split = dict(zip(got["asset_id"].to_pylist(), got["split"].to_pylist(), strict=True))
        assert [split[a] == "eval" for a in ids] == expected.tolist()
        # Only train rows without include_eval.
        assert set(cat.scan("assets", columns=["split"])["split"].to_pylist()) == {"train"}
        # A producer may force eval, never train.
        fresh = [i for i in range(1000, 1100) if rules.eval_mask([aid(i)], cat.eval_salt, 0.3)[0]]
        forced = cat.add_assets([asset(fresh[0], split="eval"), asset("forced", split="eval")])
        assert forced.eval == 2
        before = cat.pin()["assets"]
        with pytest.raises(InvalidBatch) as exc:
            cat.add_assets([asset("new-a"), asset(fresh[1], split="train"), asset("new-b")])
        assert (exc.value.row, exc.value.field) == (1, "split")
        assert cat.pin()["assets"] == before
    # The same catalog reopened gives every asset the split it already has: the same
    # batch replays its first result, and under a new key it is all duplicates.
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path)) as cat:
        res = cat.add_assets([asset(i) for i in range(300)])
        assert (res.replayed, res.inserted, res.eval) == (True, 300, result.eval)
        res = cat.add_assets([asset(i) for i in range(300)], idempotency_key="again")
        assert (res.replayed, res.inserted, res.duplicates) == (False, 0, 300)


def test_forcing_train_on_a_carved_asset_is_rejected(tmp_path: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=1.0)) as cat:
        with pytest.raises(InvalidBatch) as exc:
            cat.add_assets([asset(1), asset(2, split="train")])
        assert (exc.value.row, exc.value.field) == (1, "split")
        assert cat.pin()["assets"] is None


BAD_ASSETS = [
    ({"asset_id": "ABC" + "0" * 61}, "asset_id"),  # uppercase
    ({"asset_id": "0" * 63}, "asset_id"),
    ({"size": -1}, "size"),
    ({"source_tier": "scraped"}, "source_tier"),
    ({"uri": None}, "uri"),
    ({"provenance": "{not json"}, "provenance"),
    ({"fingerprint": b"\x00" * 7}, "fingerprint"),
    ({"probe": {"width": 0}}, "probe_width"),
    ({"size": "big"}, "size"),
    ({"surprise": 1}, "surprise"),
    ({"duplicate_of": aid(0)}, "duplicate_of"),
]


@pytest.mark.parametrize(("change", "field"), BAD_ASSETS)
def test_a_bad_row_rejects_the_whole_batch_and_commits_nothing(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path)) as cat:
        cat.add_assets([asset(i) for i in range(3)])
        before = cat.pin()
        batch = [asset(10), asset(11), {**asset(12), **change}, asset(13)]
        with pytest.raises(InvalidBatch) as exc:
            cat.add_assets(batch)
        assert (exc.value.row, exc.value.field) == (2, field)
        assert cat.pin() == before
        assert count(cat, "assets") == 3


def test_whole_batch_rejection_on_every_backend(cat: VidlakeCatalog) -> None:
    ids = train_ids(cat, 2)
    cat.add_assets([asset(0, asset_id=a) for a in ids])
    cat.add_clips([clip(ids[0])])
    before = cat.pin()
    with pytest.raises(InvalidBatch) as exc:
        cat.add_clips([clip(ids[1]), clip(aid("nope"))])
    assert (exc.value.row, exc.value.field) == (1, "asset_id")
    with pytest.raises(InvalidBatch) as exc:
        cat.add_scores(
            [
                {
                    "clip_id": cid(ids[0]),
                    "filter_name": "aes",
                    "filter_version": "v1",
                    "score": float("nan"),
                }
            ]
        )
    assert (exc.value.row, exc.value.field) == (0, "score")
    with pytest.raises(InvalidBatch) as exc:
        cat.add_scores(pa.table({"clip_id": [cid(ids[0])], "filter_name": ["aes"], "score": [1.0]}))
    assert exc.value.field == "filter_version"  # scores carry a version
    with pytest.raises(InvalidBatch) as exc:
        cat.add_captions([{"clip_id": cid(ids[0]), "kind": "dense", "text": "a cat"}])
    assert exc.value.field == "caption_version"
    with pytest.raises(InvalidBatch) as exc:
        cat.add_tombstones([{"asset_id": ids[0], "reason": "dmca", "kind": "erase"}])
    assert exc.value.field == "kind"
    assert cat.pin() == before


# -- near-duplicates --------------------------------------------------------------------
def test_near_duplicates_link_to_the_higher_bitrate_copy(cat: VidlakeCatalog) -> None:
    rng = np.random.default_rng(RNG_SEED)
    fp = fingerprint(rng)
    low, high, lower, other = aid("low"), aid("high"), aid("lower"), aid("other")
    t = cat.config.near_dup_hamming
    cat.add_assets(
        [
            asset("low", fingerprint=fp, probe={"bitrate": 1_000}),
            asset("other", fingerprint=fingerprint(rng)),
        ]
    )
    # A better copy arrives: it is canonical, the old one gets linked to it by an event.
    res = cat.add_assets([asset("high", fingerprint=flip(fp, t, rng), probe={"bitrate": 5_000})])
    assert res.near_duplicates == 0  # the new asset is itself the canonical copy
    rows = {r["asset_id"]: r for r in cat.scan("assets", include_eval=True).to_pylist()}
    assert rows[high]["duplicate_of"] is None and rows[high]["near_duplicates"] == [low]
    assert rows[low]["duplicate_of"] is None  # append-only: the old row is kept as it was
    events = cat.scan("asset_events", include_eval=True).to_pylist()
    assert [(e["asset_id"], e["event"], e["related_asset_id"]) for e in events] == [
        (low, "near_duplicate", high)
    ]
    # A worse copy links straight to the canonical one.
    res = cat.add_assets([asset("lower", fingerprint=flip(fp, t, rng), probe={"bitrate": 10})])
    assert res.near_duplicates == 1
    rows = {r["asset_id"]: r for r in cat.scan("assets", include_eval=True).to_pylist()}
    assert rows[lower]["duplicate_of"] == high
    status = {r["asset_id"]: r for r in cat.asset_status(include_eval=True).to_pylist()}
    assert status[low]["duplicate_of"] == high and status[lower]["duplicate_of"] == high
    assert status[high]["duplicate_of"] is None and status[other]["duplicate_of"] is None


def test_a_bitrate_beyond_float_precision_never_blocks_later_ingest(tmp_path: Path) -> None:
    """A stored bitrate above 2**53 once made every later ``add_assets`` fail (a checked
    int64 -> float64 cast in the key cache): the row is valid, so later batches must land."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    rng = np.random.default_rng(RNG_SEED + 7)
    with VidlakeCatalog.open(config) as first:
        big = asset("big", fingerprint=fingerprint(rng), probe={"bitrate": 2**63 - 1})
        assert first.add_assets([big]).inserted == 1
        assert first.add_assets([asset("next", fingerprint=fingerprint(rng))]).inserted == 1
    with VidlakeCatalog.open(config) as fresh:  # the key cache is built from the table
        assert fresh.add_assets([asset("third", fingerprint=fingerprint(rng))]).inserted == 1


def test_same_batch_near_duplicates_and_distant_copies(cat: VidlakeCatalog) -> None:
    rng = np.random.default_rng(RNG_SEED + 1)
    fp = fingerprint(rng)
    t = cat.config.near_dup_hamming
    far = flip(fp, t + 3, rng)  # every frame beyond the threshold
    res = cat.add_assets(
        [
            asset("a", fingerprint=fp, probe={"bitrate": 7}),
            asset("b", fingerprint=flip(fp, 1, rng), probe={"bitrate": 7}),
            asset("c", fingerprint=far, probe={"bitrate": 9}),
        ]
    )
    assert res.near_duplicates == 1
    rows = {r["asset_id"]: r for r in cat.scan("assets", include_eval=True).to_pylist()}
    # Equal bitrates: the smaller asset id is canonical.
    keep, dup = sorted([aid("a"), aid("b")])
    assert rows[dup]["duplicate_of"] == keep and rows[keep]["duplicate_of"] is None
    assert rows[aid("c")]["duplicate_of"] is None and rows[aid("c")]["near_duplicates"] is None


# -- clips and latents ------------------------------------------------------------------
def test_clips_get_deterministic_ids_and_reference_assets(cat: VidlakeCatalog) -> None:
    ids = train_ids(cat, 3)
    cat.add_assets([asset(0, asset_id=a) for a in ids])
    res = cat.add_clips([clip(ids[0], 0), clip(ids[0], 1), clip(ids[1], 0, clip_id=cid(ids[1]))])
    assert (res.inserted, res.duplicates) == (3, 0)
    stored = cat.scan("clips")
    assert sorted(stored["clip_id"].to_pylist()) == sorted(
        [cid(ids[0], 0), cid(ids[0], 1), cid(ids[1])]
    )
    assert set(stored["split"].to_pylist()) == {"train"}
    again = cat.add_clips(pa.Table.from_pylist([clip(ids[0], 1), clip(ids[2], 0), clip(ids[2], 0)]))
    assert (again.inserted, again.duplicates) == (1, 2)
    with pytest.raises(InvalidBatch) as exc:
        cat.add_clips([clip(ids[2], 3), clip(ids[2], 4, clip_id=cid(ids[2], 5))])
    assert (exc.value.row, exc.value.field) == (1, "clip_id")
    with pytest.raises(InvalidBatch) as exc:
        cat.add_clips([clip(ids[2], 3, t_end_s=6.0, t_start_s=6.0)])
    assert exc.value.field == "t_end_s"


def test_latents_reference_clips_and_stored_objects(cat: VidlakeCatalog) -> None:
    a = train_ids(cat, 1)[0]
    cat.add_assets([asset(0, asset_id=a)])
    cat.add_clips([clip(a, 0), clip(a, 1)])
    blob = safetensors_bytes({"latent": ("BF16", [4, 8, 32, 32])})
    packed = b"".join(bytes([i]) * 64 for i in range(4))  # pt members: no header to read
    one = cat.objects.put_bytes(blob).info
    pack = cat.objects.put_bytes(packed).info
    member = hashlib.sha256(packed[64:128]).hexdigest()

    def latent(clip_id: str, **over: Any) -> dict[str, Any]:
        row = {
            "clip_id": clip_id,
            "rung": "256p",
            "tokenizer_version": "vae-1",
            "format": "safetensors",
            "object_sha256": one.sha256,
            "tensor_keys": ["latent"],
            "shapes": [[4, 8, 32, 32]],
            "dtypes": ["bfloat16"],
            "tokens": 4096,
        }
        row.update(over)
        return row

    res = cat.add_latents(
        [
            latent(cid(a, 0)),
            latent(
                cid(a, 1),
                format="pt",
                object_sha256=pack.sha256,
                offset=64,
                length=64,
                member_sha256=member,
            ),
        ]
    )
    assert (res.inserted, res.duplicates) == (2, 0)
    rows = {r["clip_id"]: r for r in cat.scan("latents").to_pylist()}
    whole = rows[cid(a, 0)]
    assert (whole["offset"], whole["length"], whole["member_sha256"], whole["object_size"]) == (
        0,
        len(blob),
        one.sha256,
        len(blob),
    )
    assert cat.add_latents([latent(cid(a, 0))]).duplicates == 1
    before = cat.pin()
    bad = [
        ({"clip_id": cid(a, 9)}, "clip_id"),
        ({"object_sha256": hashlib.sha256(b"absent").hexdigest()}, "object_sha256"),
        ({"object_size": len(blob) + 1}, "object_size"),
        (
            {"object_sha256": pack.sha256, "offset": 200, "length": 64, "member_sha256": member},
            "length",
        ),
        ({"object_sha256": pack.sha256, "offset": 64, "member_sha256": member}, "length"),
        ({"object_sha256": pack.sha256, "offset": 64, "length": 64}, "member_sha256"),
        ({"format": "pickle"}, "format"),
        ({"shapes": [[1], [2]]}, "shapes"),
    ]
    for change, field in bad:
        with pytest.raises(InvalidBatch) as exc:
            cat.add_latents(
                [latent(cid(a, 1), rung="512p"), {**latent(cid(a, 1), rung="512p"), **change}]
            )
        assert (exc.value.row, exc.value.field) == (1, field), change
    assert cat.pin() == before


# -- versions -------------------------------------------------------------------------
def test_latest_scores_and_captions_resolve_versions(cat: VidlakeCatalog) -> None:
    a = train_ids(cat, 1)[0]
    cat.add_assets([asset(0, asset_id=a)])
    cat.add_clips([clip(a, 0), clip(a, 1)])
    c0, c1 = cid(a, 0), cid(a, 1)
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    later = t0 + dt.timedelta(hours=1)
    cat.add_scores(
        [
            {
                "clip_id": c0,
                "filter_name": "aes",
                "filter_version": "v1",
                "score": 0.1,
                "computed_at": t0,
            },
            {
                "clip_id": c1,
                "filter_name": "aes",
                "filter_version": "v1",
                "score": 0.2,
                "computed_at": t0,
            },
            {
                "clip_id": c0,
                "filter_name": "motion",
                "filter_version": "m1",
                "score": 3.0,
                "computed_at": t0,
            },
        ]
    )
    cat.add_scores(
        [
            {
                "clip_id": c0,
                "filter_name": "aes",
                "filter_version": "v2",
                "score": 0.9,
                "computed_at": later,
            }
        ]
    )
    latest = {(r["clip_id"], r["filter_name"]): r for r in cat.latest_scores().to_pylist()}
    assert len(latest) == 3
    assert (latest[(c0, "aes")]["filter_version"], latest[(c0, "aes")]["score"]) == ("v2", 0.9)
    assert latest[(c1, "aes")]["filter_version"] == "v1"
    pinned = {
        (r["clip_id"], r["filter_name"]): r["score"]
        for r in cat.latest_scores(versions={"aes": "v1"}).to_pylist()
    }
    assert pinned == {(c0, "aes"): 0.1, (c1, "aes"): 0.2, (c0, "motion"): 3.0}
    only_v2 = cat.latest_scores(versions={"aes": "v2"})
    assert sorted(
        zip(only_v2["clip_id"].to_pylist(), only_v2["filter_name"].to_pylist(), strict=True)
    ) == sorted([(c0, "aes"), (c0, "motion")])

    cat.add_captions(
        [
            {
                "clip_id": c0,
                "caption_version": "cap-1",
                "kind": "dense",
                "text": "old dense",
                "ingested_at": t0,
            },
            {
                "clip_id": c0,
                "caption_version": "cap-1",
                "kind": "short",
                "text": "old short",
                "ingested_at": t0,
            },
            {
                "clip_id": c0,
                "caption_version": "cap-2",
                "kind": "dense",
                "text": "new dense",
                "ingested_at": later,
            },
        ]
    )
    latest_caps = {(r["clip_id"], r["kind"]): r["text"] for r in cat.latest_captions().to_pylist()}
    assert latest_caps == {(c0, "dense"): "new dense", (c0, "short"): "old short"}
    v1 = cat.latest_captions(version="cap-1", kinds=["dense"])
    assert v1["text"].to_pylist() == ["old dense"]


# -- pins and time travel ----------------------------------------------------------------
def test_pin_reads_the_old_state_after_more_appends(cat: VidlakeCatalog) -> None:
    ids = train_ids(cat, 4)
    cat.add_assets([asset(0, asset_id=a) for a in ids[:2]])
    cat.add_clips([clip(ids[0], k) for k in range(3)])
    pin = cat.pin()
    assert pin["latents"] is None
    cat.add_assets([asset(0, asset_id=a) for a in ids[2:]])
    cat.add_clips([clip(ids[2], k) for k in range(5)])
    assert count(cat, "clips", pin) == 3 and count(cat, "clips") == 8
    assert count(cat, "assets", pin) == 2 and count(cat, "assets") == 4
    # A pin survives JSON and reads the same rows.
    back = Pin.from_dict(json.loads(json.dumps(pin.to_dict())))
    assert back == pin and hash(back) == hash(pin)
    old = cat.scan("clips", back, columns=["clip_id"])
    assert sorted(old["clip_id"].to_pylist()) == sorted(cid(ids[0], k) for k in range(3))
    streamed = cat.scan_batches("clips", back, columns=["clip_id", "asset_id"]).read_all()
    assert streamed.num_rows == 3 and streamed.column_names == ["clip_id", "asset_id"]
    empty = cat.scan("latents", back, columns=["clip_id", "rung"])
    assert empty.num_rows == 0 and empty.column_names == ["clip_id", "rung"]
    with pytest.raises(InvalidInput):
        Pin({"nonsense": 1})
    with pytest.raises(AttributeError):
        pin._ids = {}  # type: ignore[misc]
    narrowed = cat.scan("clips", row_filter=f"clip_id == '{cid(ids[2], 4)}'")
    assert narrowed["clip_id"].to_pylist() == [cid(ids[2], 4)]
    with pytest.raises(InvalidInput):
        cat.scan("clips", columns=["nope"])


def test_eval_rows_are_hidden_unless_asked(tmp_path: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.5)) as cat:
        ids = [aid(i) for i in range(40)]
        is_eval = rules.eval_mask(ids, cat.eval_salt, 0.5)
        cat.add_assets([asset(i) for i in range(40)])
        cat.add_clips([clip(a) for a in ids])
        cat.add_scores(
            [
                {"clip_id": cid(a), "filter_name": "aes", "filter_version": "v1", "score": 1.0}
                for a in ids
            ]
        )
        cat.add_tombstones([{"asset_id": a, "reason": "test", "kind": "soft"} for a in ids])
        n_eval = int(is_eval.sum())
        assert 0 < n_eval < 40
        for table in ("assets", "clips", "scores", "tombstones"):
            assert cat.scan(table).num_rows == 40 - n_eval, table
            assert cat.scan(table, include_eval=True).num_rows == 40, table
        train_clips = set(cat.scan("clips")["clip_id"].to_pylist())
        assert train_clips == {cid(a) for a, e in zip(ids, is_eval, strict=True) if not e}
        assert cat.latest_scores().num_rows == 40 - n_eval
        assert cat.asset_status().num_rows == 40 - n_eval


def test_asset_status_tombstones_and_quarantine(cat: VidlakeCatalog) -> None:
    ids = train_ids(cat, 4)
    cat.add_assets([asset(0, asset_id=a) for a in ids])
    t0 = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    cat.add_tombstones(
        [
            {"asset_id": ids[0], "reason": "dmca", "kind": "soft"},
            {"asset_id": ids[1], "reason": "dmca", "kind": "soft"},
            {"asset_id": ids[1], "reason": "court order", "kind": "hard", "requested_by": "legal"},
        ]
    )
    cat.add_asset_events(
        [
            {"asset_id": ids[2], "event": "quarantined", "at": t0},
            {"asset_id": ids[2], "event": "released", "at": t0 + dt.timedelta(minutes=5)},
            {"asset_id": ids[3], "event": "released", "at": t0},
            {"asset_id": ids[3], "event": "quarantined", "at": t0 + dt.timedelta(minutes=5)},
        ]
    )
    status = {r["asset_id"]: r for r in cat.asset_status().to_pylist()}
    assert (status[ids[0]]["tombstoned"], status[ids[0]]["tombstone_kind"]) == (True, "soft")
    assert status[ids[1]]["tombstone_kind"] == "hard"
    assert (status[ids[2]]["quarantined"], status[ids[3]]["quarantined"]) == (False, True)
    assert status[ids[2]]["tombstoned"] is False and status[ids[2]]["tombstone_kind"] is None
    with pytest.raises(InvalidBatch) as exc:
        cat.add_asset_events([{"asset_id": aid("unknown"), "event": "quarantined"}])
    assert exc.value.field == "asset_id"
    with pytest.raises(InvalidBatch) as exc:
        cat.add_asset_events([{"asset_id": ids[0], "event": "near_duplicate"}])
    assert exc.value.field == "related_asset_id"


def test_jobs_are_append_only_records(cat: VidlakeCatalog) -> None:
    started = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    cat.add_jobs(
        [
            {
                "job_id": "j1",
                "stage": "encode",
                "status": "running",
                "started_at": started.isoformat(),
            }
        ]
    )
    cat.add_jobs(
        [
            {
                "job_id": "j1",
                "stage": "encode",
                "status": "succeeded",
                "counts": json.dumps({"clips": 3}),
            }
        ]
    )
    rows = cat.scan("jobs").to_pylist()
    assert [r["status"] for r in sorted(rows, key=lambda r: r["ingested_at"])] == [
        "running",
        "succeeded",
    ]
    assert rows[0]["started_at"] == started or rows[1]["started_at"] == started
    with pytest.raises(InvalidBatch) as exc:
        cat.add_jobs([{"job_id": "j2", "stage": "x", "counts": "{"}])
    assert exc.value.field == "counts"


# -- concurrency ----------------------------------------------------------------------
def test_two_writers_see_each_others_rows(catalog_config: CatalogConfig) -> None:
    """Duplicate and reference checks read what another writer appended since (the key
    caches catch up incrementally)."""
    with VidlakeCatalog.open(catalog_config) as one, VidlakeCatalog.open(catalog_config) as two:
        ids = train_ids(one, 6)
        one.add_assets([asset(0, asset_id=a) for a in ids[:3]])
        two.add_assets([asset(0, asset_id=a) for a in ids[2:5]])  # one overlaps
        res = one.add_assets([asset(0, asset_id=a) for a in ids])
        assert (res.inserted, res.duplicates) == (1, 5)
        one.add_clips([clip(ids[0])])
        assert two.add_clips([clip(ids[0]), clip(ids[4])]).duplicates == 1
        assert one.add_clips([clip(ids[4], 0), clip(ids[5], 1)]).inserted == 1
        assert count(one, "clips") == 3 and count(one, "assets") == 6


def _append_from_process(config_json: str, start: int, stop: int, batch: int) -> None:
    config = CatalogConfig.model_validate_json(config_json)
    with VidlakeCatalog.open(config) as cat:
        for lo in range(start, stop, batch):
            cat.add_assets([asset(i) for i in range(lo, min(lo + batch, stop))])
            cat.add_jobs([{"job_id": f"p{start}-{lo}", "stage": "test"}])


@pytest.mark.slow
def test_two_processes_append_to_one_sqlite_catalog(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path)
    VidlakeCatalog.open(config).close()
    ctx = multiprocessing.get_context("spawn")
    # Overlapping asset ranges: duplicates must be caught across processes too.
    procs = [
        ctx.Process(target=_append_from_process, args=(config.model_dump_json(), 0, 40, 5)),
        ctx.Process(target=_append_from_process, args=(config.model_dump_json(), 20, 60, 5)),
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with VidlakeCatalog.open(config) as cat:
        ids = cat.scan("assets", include_eval=True)["asset_id"]
        assert len(ids) == 60 and pc.count_distinct(ids).as_py() == 60
        assert cat.scan("jobs").num_rows == 16


# -- S3 warehouse -----------------------------------------------------------------------
@pytest.mark.s3
def test_warehouse_and_objects_on_s3(tmp_path: Path, s3_server: str, s3_bucket: str) -> None:
    config = CatalogConfig(
        uri=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=f"s3://{s3_bucket}/warehouse",
        objects=f"s3://{s3_bucket}/lake",
        lance=str(tmp_path / "lance"),
        s3_endpoint_url=s3_server,
        s3_path_style=True,
    )
    with VidlakeCatalog.open(config) as cat:
        a = train_ids(cat, 1)[0]
        cat.add_assets([asset(0, asset_id=a)])
        cat.add_clips([clip(a, 0)])
        data = npy_bytes([16, 2, 4, 4])
        blob = cat.objects.put_bytes(data).info
        pin = cat.pin()
        row = {"clip_id": cid(a), "rung": "256p", "tokenizer_version": "t", "format": "npy"}
        row |= {"object_sha256": blob.sha256, "tensor_keys": ["x"], "tokens": 16}
        row |= {"shapes": [[16, 2, 4, 4]], "dtypes": ["float16"], "latent_frames": 2}
        cat.add_latents([row])
        assert cat.scan("latents")["length"].to_pylist() == [len(data)]
        assert cat.scan("latents", pin).num_rows == 0
        location = cat.iceberg_table("clips").metadata_location
        assert location.startswith(f"s3://{s3_bucket}/warehouse/")
