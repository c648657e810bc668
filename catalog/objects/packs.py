"""Packing small members into one content-addressed object: :func:`put_pack`.

Kilobyte samples stored one object each cost the loader a file (a lease, an ``open``)
per sample. Packed, many members share one object and each row of the index names its
member by ``object_sha256``, ``offset``, ``length`` and ``member_sha256`` (DESIGN.md);
the node cache then holds the whole pack and reads members at their offsets
(docs/cache.md, "Pack entries"). ::

    pack = put_pack(store, [latent_bytes_0, latent_bytes_1, ...])
    pack.sha256, pack.size            # the object
    pack.members[1].offset, .length, .sha256   # each member's range and own hash

Members are written back to back, in the order given, into a private temp file that
is hashed on the way (each member's SHA-256 and the object's), then stored with
:meth:`ObjectStore.put_file` under the object's SHA-256: the store's own atomic,
content-addressed put. Nothing is visible before that put, and a failure leaves no
object. Memory stays at one member at a time.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from catalog.errors import InvalidInput
from catalog.objects.base import ObjectStore

__all__ = ["Pack", "PackedMember", "put_pack"]


@dataclass(frozen=True)
class PackedMember:
    """One member's byte range in its pack and the SHA-256 of those bytes."""

    offset: int
    length: int
    sha256: str


@dataclass(frozen=True)
class Pack:
    """A stored pack: the object's SHA-256 and size, and its members in order."""

    sha256: str
    size: int
    members: tuple[PackedMember, ...]


def put_pack(
    store: ObjectStore,
    members: Iterable[bytes | bytearray | memoryview],
    *,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> Pack:
    """Store ``members`` back to back as one object; return each member's range.

    Args:
        store: the content-addressed store.
        members: the members' bytes, in pack order (an iterator is consumed once).
        tmp_dir: where the pack is assembled before the put (default: the system's).

    Raises:
        InvalidInput: no member, or an empty one (a range of no bytes names nothing).
    """
    whole = hashlib.sha256()
    out: list[PackedMember] = []
    fd, name = tempfile.mkstemp(prefix="vidlake-pack-", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            for data in members:
                if len(data) == 0:
                    raise InvalidInput(f"pack member {len(out)} is empty", member=len(out))
                whole.update(data)
                out.append(PackedMember(f.tell(), len(data), hashlib.sha256(data).hexdigest()))
                f.write(data)
            size = f.tell()
        if not out:
            raise InvalidInput("a pack needs at least one member")
        digest = whole.hexdigest()
        store.put_file(Path(name), sha256=digest)
    finally:
        os.unlink(name)
    return Pack(digest, size, tuple(out))
