"""A bucket keeps the leading latent frames of every clip: one shape per step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from catalog.errors import InvalidInput
from loader.decode import keep_frames, read_frames_into, safetensors_specs


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
