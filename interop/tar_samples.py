"""The samples of one indexed TAR shard: ids, members, hashes, split and tensors.

A shard's samples are the ids its manifest entry lists or, for a publisher's manifest
that lists none, the TAR's own ``<sample_id>.<latent suffix>`` members in archive
order. Each sample's member SHA-256 comes from the manifest's ``members`` map, else
from its sidecar — top level (``sha256``, ``pt_sha256``) or a nested ``members`` map
keyed by member name or by suffix. Its split is the shard's, else the manifest's rule
applied to the sidecar (:mod:`interop.tar_split`). For a ``.pt`` member the tensors it
holds (every key, with shape and dtype) are read from its header
(:mod:`interop.pt_header`); :func:`tensor_facts` turns them into the latents row's
``tensor_keys``, ``shapes``, ``dtypes``, ``latent_frames`` and ``tokens``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from catalog.errors import IntegrityError
from catalog.hashing import is_sha256
from interop.pt_header import PtTensor, pt_specs
from interop.tar_index import TarIndex, TarMember
from interop.tar_manifest import EVAL_SPLITS, ShardEntry, SourceManifest, bad_manifest

__all__ = ["LATENT_SUFFIXES", "Sample", "TensorFacts", "samples_of", "tensor_facts"]

#: Latent member suffixes, in the order they are looked for, and their formats.
LATENT_SUFFIXES = {".pt": "pt", ".safetensors": "safetensors", ".npy": "npy"}

ReadRange = Callable[[int, int], bytes]


@dataclass(frozen=True)
class Sample:
    """One sample of a shard, as the import adopts it."""

    sample_id: str
    shard: ShardEntry
    name: str
    fmt: str
    offset: int
    length: int
    member_sha256: str
    sidecar: dict[str, Any]
    split: str  #: ``train`` or one of EVAL_SPLITS, from the shard or the manifest's rule
    tensors: dict[str, PtTensor] | None = None  #: from the member's header (``.pt``)

    @property
    def is_eval(self) -> bool:
        return self.split in EVAL_SPLITS


@dataclass(frozen=True)
class TensorFacts:
    """What the latents row records about a member's tensors."""

    keys: list[str]
    latent_shape: list[int]  #: of ``latent`` (else the first tensor); [] when unknown
    shapes: list[list[int]] | None
    dtypes: list[str] | None
    latent_frames: int | None
    tokens: int


def _ids_from_headers(shard: ShardEntry, index: TarIndex) -> list[str]:
    ids: list[str] = []
    for m in index.members:
        for suffix in LATENT_SUFFIXES:
            if m.name.endswith(suffix):
                ids.append(m.name[: -len(suffix)])
                break
    seen: set[str] = set()
    twice = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    if twice:
        raise bad_manifest(f"{shard.path}: sample ids stored twice: {twice[:5]}")
    return ids


def _sidecar(shard: ShardEntry, index: TarIndex, sid: str) -> dict[str, Any]:
    raw = index.inline.get(sid + ".json")
    if raw is None:
        return {}
    try:
        loaded = json.loads(raw)
    except ValueError as exc:
        raise bad_manifest(f"{shard.path}: {sid}.json is not JSON", sample_id=sid) from exc
    if not isinstance(loaded, dict):
        raise bad_manifest(f"{shard.path}: {sid}.json is not an object", sample_id=sid)
    return loaded


def _declared(shard: ShardEntry, sidecar: dict[str, Any], name: str, fmt: str) -> dict[str, Any]:
    """The member's declared ``sha256``/``size``: manifest, then the sidecar's forms."""
    nested = sidecar.get("members")
    nested = nested if isinstance(nested, dict) else {}
    for entry in (
        shard.members.get(name),
        nested.get(name),
        nested.get(fmt),
        nested.get("." + fmt),
    ):
        if isinstance(entry, dict) and entry.get("sha256") is not None:
            return dict(entry)
    sha = sidecar.get("sha256") or sidecar.get(f"{fmt}_sha256")
    return {} if sha is None else {"sha256": sha}


def _member(shard: ShardEntry, by_name: dict[str, TarMember], sid: str) -> tuple[str, str]:
    for suffix, fmt in LATENT_SUFFIXES.items():
        if sid + suffix in by_name:
            return sid + suffix, fmt
    raise bad_manifest(f"{shard.path}: sample {sid!r} has no latent member", sample_id=sid)


def samples_of(
    shard: ShardEntry, index: TarIndex, manifest: SourceManifest, read: ReadRange
) -> list[Sample]:
    """The samples of one indexed shard (see the module docstring).

    Args:
        read: ``read(offset, n)`` of the shard, for the ``.pt`` headers.

    Raises:
        InvalidInput: a sample lacks its latent member or a SHA-256, a size disagrees,
            or the split rule cannot be applied to its sidecar.
    """
    by_name = {m.name: m for m in index.members}
    ids = (
        list(shard.sample_ids) if shard.sample_ids is not None else _ids_from_headers(shard, index)
    )
    if shard.num_samples is not None and shard.num_samples != len(ids):
        raise bad_manifest(
            f"{shard.path}: the manifest says {shard.num_samples} samples, the shard holds "
            f"{len(ids)}",
            shard=shard.path,
        )
    out = []
    for sid in ids:
        name, fmt = _member(shard, by_name, sid)
        member = by_name[name]
        sidecar = _sidecar(shard, index, sid)
        if "sample_id" in sidecar and str(sidecar["sample_id"]) != sid:
            raise bad_manifest(
                f"{shard.path}: {sid}.json says it is sample {sidecar['sample_id']!r}",
                sample_id=sid,
            )
        declared = _declared(shard, sidecar, name, fmt)
        sha = declared.get("sha256")
        if not is_sha256(sha):
            raise bad_manifest(
                f"{shard.path}: no SHA-256 for {name} in the manifest or sidecar", sample_id=sid
            )
        if "size" in declared and declared["size"] != member.size:
            raise bad_manifest(
                f"{shard.path}: {name} holds {member.size} bytes, the manifest or sidecar "
                f"says {declared['size']}",
                sample_id=sid,
            )
        split = shard.split
        if split is None:
            assert manifest.split_rule is not None  # parse_manifest guarantees it
            split = manifest.split_rule.split_of(sidecar, sid)
        tensors = _pt_tensors(read, member, f"{shard.path}:{name}") if fmt == "pt" else None
        out.append(
            Sample(sid, shard, name, fmt, member.offset, member.size, str(sha), sidecar, split,
                   tensors)
        )  # fmt: skip
    return out


def _pt_tensors(read: ReadRange, member: TarMember, what: str) -> dict[str, PtTensor] | None:
    """The member's tensors, or None when its header is not a readable tensor dict (the
    sidecar's declarations then stand; the loader still verifies before ``torch.load``)."""
    try:
        return pt_specs(lambda off, n: read(member.offset + off, n), member.size, what)
    except IntegrityError:
        return None


def _frames_axis(shape: list[int]) -> int | None:
    """The latent-frame axis: ``(C, T, H, W)`` -> 1, ``(1, C, T, H, W)`` -> 2."""
    if len(shape) == 4:
        return 1
    if len(shape) == 5 and shape[0] == 1:
        return 2
    return None


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def tensor_facts(s: Sample) -> TensorFacts:
    """The latents row's tensor columns for ``s``: the header's tensors when read, else
    the sidecar's ``tensor_keys``/``shape``/``dtype``.

    Raises:
        InvalidInput: neither the header nor the sidecar gives the latent's frame count
            (``latent_frames``), which the cut's buckets need.
    """
    sc = s.sidecar
    if s.tensors:
        keys = list(s.tensors)
        shapes: list[list[int]] | None = [list(t.shape) for t in s.tensors.values()]
        dtypes: list[str] | None = [t.dtype for t in s.tensors.values()]
        main = list(s.tensors["latent" if "latent" in s.tensors else keys[0]].shape)
    else:
        keys = [str(k) for k in (sc.get("tensor_keys") or ["latent"])]
        shape = sc.get("shape")
        main = [int(x) for x in shape] if isinstance(shape, list) and shape else []
        shapes = [main] if main and len(keys) == 1 else None
        dtypes = [str(sc["dtype"])] if sc.get("dtype") and len(keys) == 1 else None
    axis = _frames_axis(main)
    frames = _int(sc.get("latent_frames")) or (main[axis] if axis is not None else None)
    if not frames:
        raise bad_manifest(
            f"sample {s.sample_id}: no latent_frames in its sidecar and no (C, T, H, W) or "
            f"(1, C, T, H, W) latent shape to derive it from (shape {main or None})",
            sample_id=s.sample_id,
            missing="latent_frames",
        )
    tokens = _int(sc.get("tokens"))
    if tokens is None:
        tokens = math.prod(main[axis:]) if axis is not None else 0
    return TensorFacts(keys, main, shapes, dtypes, frames, tokens)
