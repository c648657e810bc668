"""The loader's read path: pread of a safetensors header (memoised), preadv of frames."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from catalog.errors import IntegrityError, InvalidInput
from loader.decode import keep_frames, pread_frames_into, safetensors_specs_fd


def _bytes(t: torch.Tensor) -> memoryview:
    return t.reshape(-1).view(torch.uint8).numpy().data


@pytest.mark.parametrize("shape", [(3, 6, 2, 5), (1, 3, 6, 2, 5), (7, 11)])
def test_pread_frames_into_equals_slicing(tmp_path: Path, shape: tuple[int, ...]) -> None:
    latent = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    path = tmp_path / "x.safetensors"
    save_file({"latent": latent, "other": torch.ones(2)}, str(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        spec = safetensors_specs_fd(fd, path.stat().st_size, ["latent"], "x")["latent"]
        for frames in (4, None):
            want = keep_frames(spec.shape, frames)
            out = torch.empty(want, dtype=torch.float32)
            pread_frames_into(fd, spec, want, _bytes(out))
            expected = latent
            if want != spec.shape:
                expected = latent[:, :4] if len(shape) == 4 else latent[:, :, :4]
            assert torch.equal(out, expected)
        with pytest.raises(InvalidInput):
            pread_frames_into(fd, spec, spec.shape, _bytes(torch.empty(3)))
    finally:
        os.close(fd)


def test_a_memoised_header_is_still_checked_against_each_file(tmp_path: Path) -> None:
    whole, cut = tmp_path / "whole.safetensors", tmp_path / "cut.safetensors"
    save_file({"latent": torch.ones(4, 9, 2, 2)}, str(whole))
    data = whole.read_bytes()
    cut.write_bytes(data[:-8])  # the same header, the data cut short
    for path in (whole, cut):
        fd = os.open(path, os.O_RDONLY)
        try:
            if path == whole:
                assert safetensors_specs_fd(fd, len(data), [], "w")["latent"].end == len(data)
            else:
                with pytest.raises(IntegrityError, match="inconsistent byte range"):
                    safetensors_specs_fd(fd, len(data) - 8, [], "c")
        finally:
            os.close(fd)
