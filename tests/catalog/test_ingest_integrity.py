"""Bad rows never land: latent headers, member hashes, names recipes can select, clip
references of scores and captions, and the clips' eval count (issue 11, item 5)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidBatch
from catalog.latent_headers import HeaderError, canonical_dtype, parse_header
from tests.catalog._latents import npy_bytes, safetensors_bytes
from tests.catalog.test_catalog import asset, cid, clip, train_ids

SHAPE = [16, 5, 8, 14]


@pytest.fixture
def cat(tmp_path: Path) -> Any:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path)) as c:
        a = train_ids(c, 1)[0]
        c.add_assets([asset(0, asset_id=a)])
        c.add_clips([clip(a, k) for k in range(3)])
        c.test_asset = a  # type: ignore[attr-defined]
        yield c


def _latent(cat: VidlakeCatalog, data: bytes, k: int = 0, **over: Any) -> dict[str, Any]:
    sha = cat.objects.put_bytes(data).info.sha256
    row: dict[str, Any] = {
        "clip_id": cid(cat.test_asset, k),  # type: ignore[attr-defined]
        "rung": "256p",
        "tokenizer_version": "vae-1",
        "format": "safetensors",
        "object_sha256": sha,
        "tensor_keys": ["latent"],
        "shapes": [SHAPE],
        "dtypes": ["bfloat16"],
        "latent_frames": SHAPE[1],
        "tokens": 560,
    }
    row.update(over)
    return row


def _rejects(cat: VidlakeCatalog, add: str, rows: list[dict[str, Any]], field: str) -> None:
    before = cat.pin()
    with pytest.raises(InvalidBatch) as exc:
        getattr(cat, add)(rows)
    assert (exc.value.row, exc.value.field) == (len(rows) - 1, field), exc.value.message
    assert cat.pin() == before


GOOD = safetensors_bytes({"latent": ("BF16", SHAPE)})


def test_a_true_latent_lands_with_every_dtype_spelling(cat: VidlakeCatalog) -> None:
    rows = [_latent(cat, GOOD, k, dtypes=[d]) for k, d in enumerate(("BF16", "torch.bfloat16"))]
    assert cat.add_latents(rows).inserted == 2


def test_a_whole_object_latent_must_carry_the_objects_hash(cat: VidlakeCatalog) -> None:
    wrong = hashlib.sha256(b"another member").hexdigest()
    _rejects(
        cat,
        "add_latents",
        [_latent(cat, GOOD), _latent(cat, GOOD, 1, member_sha256=wrong)],
        "member_sha256",
    )
    right = _latent(cat, GOOD, 1)
    right["member_sha256"] = right["object_sha256"]
    assert cat.add_latents([right]).inserted == 1


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"latent_frames": 6}, "latent_frames"),
        ({"shapes": [[16, 6, 8, 14]]}, "shapes"),
        ({"dtypes": ["float16"]}, "dtypes"),
        ({"dtypes": ["complex-ish"]}, "dtypes"),
        ({"tensor_keys": ["latent", "extra"], "shapes": None, "dtypes": None}, "tensor_keys"),
        ({"format": "npy"}, "format"),
    ],
)
def test_a_latent_whose_header_disagrees_never_lands(
    cat: VidlakeCatalog, over: dict[str, Any], field: str
) -> None:
    _rejects(cat, "add_latents", [_latent(cat, GOOD), _latent(cat, GOOD, 1, **over)], field)


@pytest.mark.parametrize(
    "data",
    [
        b"not a safetensors file at all, just bytes",
        struct.pack("<Q", 10**9) + b"{}",  # header longer than the member
        safetensors_bytes({"latent": ("BF16", SHAPE)})[:-2],  # truncated data
        safetensors_bytes({"latent": ("BF16", SHAPE)}, header={"latent": {"dtype": "Q7"}}),
    ],
)
def test_a_malformed_safetensors_header_is_rejected(cat: VidlakeCatalog, data: bytes) -> None:
    _rejects(cat, "add_latents", [_latent(cat, data)], "format")


def test_a_packed_members_header_is_read_at_its_offset(cat: VidlakeCatalog) -> None:
    other = safetensors_bytes({"latent": ("BF16", [16, 9, 8, 14])})
    pad = b"\0" * 24
    obj = cat.objects.put_bytes(pad + GOOD + other).info.sha256
    member = hashlib.sha256(GOOD).hexdigest()
    at = {"object_sha256": obj, "offset": len(pad), "length": len(GOOD), "member_sha256": member}
    row = _latent(cat, GOOD, **at)
    # The member at offset 24 has 5 frames; a row claiming the next member's 9 fails.
    _rejects(cat, "add_latents", [{**row, "latent_frames": 9}], "latent_frames")
    # An offset that is not where a member starts has no header there.
    _rejects(cat, "add_latents", [{**row, "offset": len(pad) - 8}], "format")
    assert cat.add_latents([row]).inserted == 1


def test_npy_headers_are_checked_and_pt_only_by_size(cat: VidlakeCatalog) -> None:
    data = npy_bytes(SHAPE)
    row = _latent(cat, data, format="npy", dtypes=["<f2"], tensor_keys=["z"])
    _rejects(cat, "add_latents", [{**row, "latent_frames": 4}], "latent_frames")
    two_keys = {**row, "tensor_keys": ["a", "b"], "shapes": None, "dtypes": None}
    _rejects(cat, "add_latents", [two_keys], "tensor_keys")
    big_endian = _latent(cat, npy_bytes(SHAPE, ">f2"), 1, format="npy", dtypes=None)
    _rejects(cat, "add_latents", [big_endian], "format")
    # A torch pickle has no header to read without unpickling: what the row says stands.
    pt = _latent(cat, b"\x80\x02 pickled bytes", 2, format="pt")
    assert cat.add_latents([row, pt]).inserted == 2


@pytest.mark.parametrize(
    ("add", "over", "field"),
    [
        ("add_latents", {"rung": "wrongsha"}, "rung"),
        ("add_latents", {"rung": "0p"}, "rung"),
        ("add_latents", {"tokenizer_version": "v" * 201}, "tokenizer_version"),
        ("add_scores", {"filter_name": "Aesthetic Score"}, "filter_name"),
        ("add_scores", {"filter_version": "  "}, "filter_version"),
        ("add_captions", {"kind": "Dense!"}, "kind"),
        ("add_captions", {"caption_version": "c" * 201}, "caption_version"),
    ],
)
def test_names_no_recipe_can_select_are_rejected(
    cat: VidlakeCatalog, add: str, over: dict[str, Any], field: str
) -> None:
    c = cid(cat.test_asset, 0)  # type: ignore[attr-defined]
    good = {
        "add_latents": _latent(cat, GOOD),
        "add_scores": {"clip_id": c, "filter_name": "aesthetic", "filter_version": "2", "score": 1},
        "add_captions": {"clip_id": c, "caption_version": "1", "kind": "dense", "text": "a cat"},
    }[add]
    _rejects(cat, add, [good, {**good, **over}], field)


def test_scores_and_captions_need_an_existing_clip(cat: VidlakeCatalog) -> None:
    c = cid(cat.test_asset, 0)  # type: ignore[attr-defined]
    ghost = cid(cat.test_asset, 7)  # type: ignore[attr-defined]
    score = {"clip_id": c, "filter_name": "aesthetic", "filter_version": "2", "score": 1.0}
    caption = {"clip_id": c, "caption_version": "1", "kind": "dense", "text": "a cat"}
    _rejects(cat, "add_scores", [score, {**score, "clip_id": ghost}], "clip_id")
    _rejects(cat, "add_captions", [caption, {**caption, "clip_id": ghost}], "clip_id")
    assert cat.add_scores([score]).inserted == 1
    assert cat.add_captions([caption]).inserted == 1


def test_the_clips_result_counts_its_eval_clips(tmp_path: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=1.0)) as cat:
        cat.add_assets([asset(i) for i in range(3)])
        result = cat.add_clips([clip(asset(i)["asset_id"], k) for i in range(3) for k in range(4)])
        assert (result.inserted, result.eval) == (12, 12)


# -- the header parser --------------------------------------------------------------------
def _reader(data: bytes) -> Any:
    return lambda start, n: data[start : start + n]


def test_parse_header_reads_long_headers_in_a_second_range() -> None:
    meta = {"__metadata__": {"note": "x" * 10_000}}
    data = safetensors_bytes({"a": ("F32", [2, 3]), "b": ("U8", [4])}, header=meta)
    calls: list[tuple[int, int]] = []

    def read(start: int, n: int) -> bytes:
        calls.append((start, n))
        return data[start : start + n]

    got = parse_header("safetensors", read, len(data))
    assert isinstance(got, dict) and {k: (t.dtype, t.shape) for k, t in got.items()} == {
        "a": ("float32", (2, 3)),
        "b": ("uint8", (4,)),
    }
    assert len(calls) == 2 and calls[0] == (0, 4096)
    assert parse_header("pt", read, len(data)) is None


@pytest.mark.parametrize(
    "data",
    [b"", b"\x93NUMPY\x09\x00", npy_bytes([4, 4])[:-1], b"\x93NUMPY\x01\x00\x08\x00{'a': 1}"],
)
def test_parse_header_rejects_broken_npy(data: bytes) -> None:
    with pytest.raises(HeaderError):
        parse_header("npy", _reader(data), len(data))


def test_canonical_dtype_names() -> None:
    assert [canonical_dtype(n) for n in ("BF16", "bf16", "torch.float16", "<f4", "u1")] == [
        "bfloat16",
        "bfloat16",
        "float16",
        "float32",
        "uint8",
    ]
    assert canonical_dtype("float") is None and canonical_dtype(3) is None
