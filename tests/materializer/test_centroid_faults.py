"""Damaged centroid versions in the object store: the record or the matrix broken,
missing or replaced (bytes, shape, values). Each read refuses with an IntegrityError
naming the key; it never refits silently and never assigns clusters from them."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from catalog.embeddings import EmbeddingIndex
from catalog.errors import IntegrityError
from catalog.hashing import sha256_bytes
from catalog.objects.local import LocalObjectStore
from materializer.centroids import CentroidConfig, CentroidStore

MODEL = "siglip-demo-v1"


@pytest.fixture
def fitted(tmp_path: Path) -> tuple[CentroidStore, CentroidConfig, Path, dict[str, Any]]:
    rng = np.random.default_rng(3)
    idx = EmbeddingIndex(tmp_path / "lance", "m")
    idx.add([f"c{i:03d}" for i in range(60)], ["a"] * 60, ["train"] * 60,
            rng.standard_normal((60, 8)))  # fmt: skip
    objects = tmp_path / "objects"
    store = CentroidStore(LocalObjectStore(objects))
    config = CentroidConfig(MODEL, num_clusters=3)
    found = store.ensure(config, idx)
    return store, config, objects, dict(found.record)


def _rewrite(path: Path, data: bytes) -> None:
    path.chmod(0o644)
    path.write_bytes(data)


def _npy(matrix: Any) -> bytes:
    buf = io.BytesIO()
    np.save(buf, matrix)
    return buf.getvalue()


def _flip(objects: Path, record: dict[str, Any]) -> str:
    path = objects / record["centroids_key"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    _rewrite(path, bytes(data))
    return str(record["centroids_key"])


def _drop_matrix(objects: Path, record: dict[str, Any]) -> str:
    (objects / record["centroids_key"]).unlink()
    return str(record["centroids_key"])


def _record_garbage(objects: Path, record: dict[str, Any]) -> str:
    key = str(record["centroids_key"]).rsplit("/", 1)[0] + "/v000001.json"
    _rewrite(objects / key, b"{not json")
    return key


def _record_fields(objects: Path, record: dict[str, Any]) -> str:
    key = str(record["centroids_key"]).rsplit("/", 1)[0] + "/v000001.json"
    _rewrite(objects / key, json.dumps({"format": 1, "version": 1}).encode())
    return key


def _consistent(matrix: Any) -> Callable[[Path, dict[str, Any]], str]:
    """Replace the matrix AND its record's hash: only the content checks catch it."""

    def tamper(objects: Path, record: dict[str, Any]) -> str:
        data = _npy(matrix)
        _rewrite(objects / record["centroids_key"], data)
        key = str(record["centroids_key"]).rsplit("/", 1)[0] + "/v000001.json"
        _rewrite(
            objects / key, json.dumps({**record, "centroids_sha256": sha256_bytes(data)}).encode()
        )
        return str(record["centroids_key"])

    return tamper


FAULTS: dict[str, Callable[[Path, dict[str, Any]], str]] = {
    "flipped-byte": _flip,
    "matrix-missing": _drop_matrix,
    "record-not-json": _record_garbage,
    "record-fields": _record_fields,
    "not-npy": lambda o, r: _consistent(None)(o, r),
    "nan-values": _consistent(np.full((3, 8), np.nan, dtype=np.float32)),
    "wrong-shape": _consistent(np.ones((5, 8), dtype=np.float32)),
    "one-dim": _consistent(np.ones(24, dtype=np.float32)),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_damaged_centroids_are_refused_naming_the_key(
    fitted: tuple[CentroidStore, CentroidConfig, Path, dict[str, Any]], fault: str
) -> None:
    store, config, objects, record = fitted
    key = FAULTS[fault](objects, record)
    with pytest.raises(IntegrityError, match="centroids") as err:
        store.get(config, 1)
    assert key in err.value.message
    with pytest.raises(IntegrityError):
        store.latest(config)  # what a cut reads: refused too, never refitted
    assert store.versions(config) == [1]
