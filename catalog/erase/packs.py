"""Rewriting a packed latent object without the erased members.

A pack concatenates members (8-byte aligned, see :mod:`service.demo.latents`) and rows
address them by ``offset``/``length``/``member_sha256``. :func:`rewrite_pack` copies
every *surviving* member (one referenced by a row outside the erased clips), each
checked against its SHA-256, into a new object in offset order, 8-byte aligned; bytes
no survivor references (the erased members, padding) are left behind. The result is
content-addressed and a pure function of the old pack and the survivors, so a rerun
after a crash stores the same object again (a no-op) and gets the same moves.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from catalog.catalog import VidlakeCatalog
from catalog.erase.records import isin
from catalog.errors import ChecksumMismatch
from catalog.hashing import sha256_bytes

__all__ = ["rewrite_packs"]

_ALIGN = 8


def rewrite_packs(catalog: VidlakeCatalog, packs: list[str], clip_ids: list[str]) -> dict[str, Any]:
    """New objects for ``packs`` without the members of ``clip_ids``.

    Returns:
        ``{old_sha: {"sha256", "size", "moves": [[old_offset, length, new_offset], …]}}``.
    """
    if not packs:
        return {}
    rows = catalog.scan(
        "latents",
        columns=["clip_id", "object_sha256", "offset", "length", "member_sha256"],
        row_filter=isin("object_sha256", packs),
        include_eval=True,
    )
    erased = pc.is_in(rows["clip_id"], pa.array(clip_ids, pa.string()))
    survivors = rows.filter(pc.invert(erased))
    return {sha: _rewrite(catalog, sha, survivors) for sha in packs}


def _rewrite(catalog: VidlakeCatalog, sha: str, survivors: pa.Table) -> dict[str, Any]:
    mine = survivors.filter(pc.equal(survivors["object_sha256"], sha))
    members = sorted(
        {
            (int(o), int(n), str(m))
            for o, n, m in zip(
                mine["offset"].to_pylist(),
                mine["length"].to_pylist(),
                mine["member_sha256"].to_pylist(),
                strict=True,
            )
        }
    )
    store = catalog.objects
    out = bytearray()
    moves: list[list[int]] = []
    for offset, length, member in members:
        data = store.get_range(sha, offset, length)
        if sha256_bytes(data) != member:
            raise ChecksumMismatch(
                f"member at {offset} of pack {sha} does not hash to {member}",
                sha256=member,
                object_sha256=sha,
            )
        out += b"\0" * (-len(out) % _ALIGN)
        moves.append([offset, length, len(out)])
        out += data
    put = store.put_bytes(bytes(out))
    return {"sha256": put.info.sha256, "size": put.info.size, "moves": moves}
