"""Tensor headers of ``.pt`` members read by range: every key with shape and dtype, a
few KiB of a large member, and no code run from a pickle that names other globals."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest
import torch

from catalog.errors import IntegrityError
from interop.pt_header import PtTensor, pt_specs


def _saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_every_tensor_of_a_large_member_costs_two_small_reads() -> None:
    data = _saved(
        {
            "latent": torch.zeros(1, 16, 30, 32, 32),
            "text_emb": torch.zeros(1, 77, 64, dtype=torch.bfloat16),
            "interaction": torch.zeros(1, 30, dtype=torch.int64),
            "view": torch.zeros(4, 6)[:, 1:],  # a non-contiguous view: its own shape
        }
    )
    reads: list[tuple[int, int]] = []

    def read(off: int, n: int) -> bytes:
        reads.append((off, n))
        return data[off : off + n]

    specs = pt_specs(read, len(data), "m.pt")
    assert specs == {
        "latent": PtTensor("float32", (1, 16, 30, 32, 32)),
        "text_emb": PtTensor("bfloat16", (1, 77, 64)),
        "interaction": PtTensor("int64", (1, 30)),
        "view": PtTensor("float32", (4, 5)),
    }
    assert len(reads) <= 2 and sum(n for _, n in reads) <= 16 << 10 < len(data) // 100


def test_a_bare_tensor_is_the_latent() -> None:
    data = _saved(torch.zeros(16, 3, 4, 4, dtype=torch.float16))
    specs = pt_specs(lambda o, n: data[o : o + n], len(data), "m.pt")
    assert specs == {"latent": PtTensor("float16", (16, 3, 4, 4))}


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/vidlake-pt-header-pwned",))


def test_a_pickle_naming_other_globals_runs_nothing(tmp_path: object) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"latent": _Evil()}, protocol=2))
    data = buf.getvalue()
    with pytest.raises(IntegrityError, match="not part of a tensor dict"):
        pt_specs(lambda o, n: data[o : o + n], len(data), "evil.pt")
    assert not os.path.exists("/tmp/vidlake-pt-header-pwned")


@pytest.mark.parametrize("data", [b"not a zip at all", b"", _saved([1, 2, 3])])
def test_what_is_not_a_tensor_dict_is_an_integrity_error(data: bytes) -> None:
    with pytest.raises(IntegrityError):
        pt_specs(lambda o, n: data[o : o + n], len(data), "m.pt")
