"""A bucket keeps the leading latent frames of every clip: one shape per step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from catalog.errors import InvalidInput
from loader.decode import keep_frames, read_frames_into, safetensors_specs, trim_frames


def test_keep_frames_cuts_only_long_4d_tensors() -> None:
    assert keep_frames((16, 9, 4, 7), 4) == (16, 4, 4, 7)
    assert keep_frames((16, 4, 4, 7), 4) == (16, 4, 4, 7)
    assert keep_frames((16, 3, 4, 7), 4) == (16, 3, 4, 7)  # too short: a misfit, not padded
    assert keep_frames((77, 512), 4) == (77, 512)
    assert keep_frames((16, 9, 4, 7), None) == (16, 9, 4, 7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_read_frames_into_equals_slicing(tmp_path: Path, dtype: torch.dtype) -> None:
    latent = torch.arange(3 * 6 * 2 * 5, dtype=torch.float32).reshape(3, 6, 2, 5).to(dtype)
    path = tmp_path / "x.safetensors"
    save_file({"latent": latent, "other": torch.ones(2)}, str(path))
    with open(path, "rb") as f:
        spec = safetensors_specs(f, ["latent"], "x")["latent"]
        out = torch.empty(keep_frames(spec.shape, 4), dtype=dtype)
        read_frames_into(f, spec, out)
        assert torch.equal(out, latent[:, :4])
        whole = torch.empty(spec.shape, dtype=dtype)
        read_frames_into(f, spec, whole)
        assert torch.equal(whole, latent)
        with pytest.raises(InvalidInput):
            read_frames_into(f, spec, torch.empty((3, 7, 2, 5), dtype=dtype))


def test_a_batch_of_one_5d_latent_keeps_its_leading_frames_on_axis_2(tmp_path: Path) -> None:
    assert keep_frames((1, 16, 9, 4, 7), 4) == (1, 16, 4, 4, 7)
    assert keep_frames((2, 16, 9, 4, 7), 4) == (2, 16, 9, 4, 7)  # not a batch of one: as is
    assert keep_frames((1, 77, 512), 4) == (1, 77, 512)  # a text embedding: untouched
    latent = torch.arange(1 * 3 * 6 * 2 * 5, dtype=torch.float32).reshape(1, 3, 6, 2, 5)
    assert torch.equal(trim_frames(latent, 4), latent[:, :, :4])
    assert trim_frames(latent, 6) is latent
    path = tmp_path / "x.safetensors"
    save_file({"latent": latent}, str(path))
    with open(path, "rb") as f:
        spec = safetensors_specs(f, ["latent"], "x")["latent"]
        out = torch.empty(keep_frames(spec.shape, 4), dtype=torch.float32)
        read_frames_into(f, spec, out)
        assert torch.equal(out, latent[:, :, :4])
