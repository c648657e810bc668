"""The synthetic corpus's VAE latents: their shapes, their safetensors bytes, and the
writer that stores them one object per latent or packed (part of
:mod:`service.demo.corpus`, whose docstring gives the shape rule)."""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from catalog.errors import InvalidInput
from catalog.hashing import sha256_bytes

if TYPE_CHECKING:
    from catalog.objects import PutResult
    from service.demo.world import World


__all__ = ["LATENT_CHANNELS", "LatentWriter", "latent_shape", "latent_tokens", "rung_height"]

LATENT_CHANNELS = 16
_REPORT_EVERY = 256  # latents between progress reports
_ALIGN = 8


def rung_height(rung: str) -> int:
    m = re.fullmatch(r"([1-9][0-9]*)p", rung) if isinstance(rung, str) else None
    if m is None or int(m.group(1)) % 8:
        raise InvalidInput(f"a rung is '<H>p' with H a multiple of 8, got {rung!r}", field="rungs")
    return int(m.group(1))


def latent_shape(rung: str, width: int, height: int, num_frames: int) -> tuple[int, int, int, int]:
    """The VAE latent shape ``(16, T, h, w)`` of a clip at ``rung`` (module docstring).

    Args:
        rung: ``"<H>p"`` with ``H`` a multiple of 8.
        width: Clip width in pixels (only the aspect ratio matters).
        height: Clip height in pixels.
        num_frames: Pixel frames of the clip.
    """
    h_px = rung_height(rung)
    t = 1 + (num_frames - 1) // 4
    return (LATENT_CHANNELS, t, h_px // 8, max(1, round(h_px * width / height / 8)))


def latent_tokens(shape: Sequence[int]) -> int:
    """Transformer tokens of a latent ``(C, T, h, w)``: ``T * ceil(h/2) * ceil(w/2)``."""
    _, t, h, w = shape
    return int(t * math.ceil(h / 2) * math.ceil(w / 2))


# -- latents ----------------------------------------------------------------------------
def safetensors_bytes(
    key: str, dtype: str, shape: Sequence[int], data: bytes, meta: Mapping[str, str]
) -> bytes:
    """One tensor in the safetensors layout: u64 header length, JSON header, data."""
    entry = {"dtype": dtype, "shape": list(shape), "data_offsets": [0, len(data)]}
    header = json.dumps(
        {"__metadata__": dict(meta), key: entry}, separators=(",", ":"), sort_keys=True
    ).encode()
    header += b" " * (-len(header) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(header)) + header + data


def _bf16_noise(rng: np.random.Generator, n: int) -> bytes:
    # bfloat16 is the upper half of a float32 (truncation is fine for noise).
    return (rng.standard_normal(n, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


class LatentWriter:
    """Makes the latents of a batch's clips at one rung, stores them, returns their rows."""

    def __init__(
        self,
        put: Callable[[bytes], Future[PutResult]],
        packed: bool,
        pack_bytes: int,
        tokenizer: str,
        job: str,
        report: Callable[[int], None],
    ) -> None:
        self.put, self.packed, self.pack_bytes = put, packed, pack_bytes
        self.tokenizer, self.job, self.report = tokenizer, job, report
        self.objects = self.bytes = 0

    def write(
        self, rng: np.random.Generator, w: World, rung: str, rows: NDArray[np.int64]
    ) -> pa.Table:
        width, height = w.dims(rows)
        shapes, lengths, members = [], [], []
        stored: list[tuple[Future[PutResult], int]] = []  # (put, members in the object)
        pack: list[bytes] = []
        pack_size = 0
        for k, r in enumerate(rows.tolist()):
            shape = latent_shape(rung, int(width[k]), int(height[k]), int(w.num_frames[r]))
            meta = {"clip_id": w.clip_ids[r], "rung": rung, "tokenizer_version": self.tokenizer}
            noise = _bf16_noise(rng, math.prod(shape))
            data = safetensors_bytes("latent", "BF16", shape, noise, meta)
            shapes.append(shape)
            lengths.append(len(data))
            members.append(sha256_bytes(data) if self.packed else "")
            if not self.packed:
                stored.append((self.put(data), 1))
            else:
                pack.append(data + b"\0" * (-len(data) % _ALIGN))
                pack_size += len(pack[-1])
                asset_done = k + 1 == len(rows) or w.clip_asset[rows[k + 1]] != w.clip_asset[r]
                if asset_done and (pack_size >= self.pack_bytes or k + 1 == len(rows)):
                    stored.append((self.put(b"".join(pack)), len(pack)))
                    pack, pack_size = [], 0
            if (k + 1) % _REPORT_EVERY == 0:
                self.report(_REPORT_EVERY)
        self.report(len(rows) % _REPORT_EVERY)
        objects: list[str] = []
        sizes: list[int] = []
        offsets: list[int] = []
        for put, count in stored:
            info = put.result().info
            start = len(offsets)
            at = 0
            for length in lengths[start : start + count]:
                objects.append(info.sha256)
                sizes.append(info.size)
                offsets.append(at)
                at += length + (-length % _ALIGN)
        self.objects += len(stored)
        self.bytes += sum(lengths)
        n = len(rows)
        return pa.table(
            {
                "clip_id": [w.clip_ids[r] for r in rows],
                "rung": [rung] * n,
                "tokenizer_version": [self.tokenizer] * n,
                "format": ["safetensors"] * n,
                "object_sha256": objects,
                "object_size": pa.array(sizes, pa.int64()),
                "offset": pa.array(offsets, pa.int64()),
                "length": pa.array(lengths, pa.int64()),
                "member_sha256": members if self.packed else objects,
                "tensor_keys": [["latent"]] * n,
                "shapes": pa.array([[list(s)] for s in shapes], pa.list_(pa.list_(pa.int64()))),
                "dtypes": [["bfloat16"]] * n,
                "latent_frames": pa.array([s[1] for s in shapes], pa.int32()),
                "tokens": pa.array([latent_tokens(s) for s in shapes], pa.int64()),
                "job_id": [self.job] * n,
            }
        )
