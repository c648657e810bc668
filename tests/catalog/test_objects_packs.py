"""The pack writer (``catalog.objects.packs.put_pack``): members back to back in one
content-addressed object, each with its range and its own SHA-256."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from catalog.errors import InvalidInput
from catalog.objects.local import LocalObjectStore
from catalog.objects.packs import put_pack


def test_members_are_stored_back_to_back_with_their_ranges_and_hashes(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    members = [b"a" * 10, bytearray(b"bc" * 7), memoryview(b"xyz")]
    pack = put_pack(store, iter(members), tmp_dir=tmp_path)
    whole = b"".join(bytes(m) for m in members)
    assert pack.sha256 == hashlib.sha256(whole).hexdigest()
    assert pack.size == len(whole) == store.head(pack.sha256).size  # type: ignore[union-attr]
    assert [(m.offset, m.length) for m in pack.members] == [(0, 10), (10, 14), (24, 3)]
    for m, data in zip(pack.members, members, strict=True):
        assert store.get_range(pack.sha256, m.offset, m.length) == bytes(data)
        assert m.sha256 == hashlib.sha256(data).hexdigest()
    assert list(tmp_path.glob("vidlake-pack-*")) == []  # the temp file is gone
    assert put_pack(store, members) == pack  # content-addressed: the same object


@pytest.mark.parametrize("members", [[], [b"ok", b""]])
def test_an_empty_pack_or_member_is_refused_and_nothing_is_stored(
    tmp_path: Path, members: list[bytes]
) -> None:
    store = LocalObjectStore(tmp_path / "store")
    with pytest.raises(InvalidInput):
        put_pack(store, members, tmp_dir=tmp_path)
    assert list(store.iter_objects()) == []
    assert list(tmp_path.glob("vidlake-pack-*")) == []
