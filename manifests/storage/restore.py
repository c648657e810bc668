"""Restore: a fresh embedded catalog from the bucket alone.

Given the local pointer written by :func:`manifests.storage.seal.seal`, :func:`restore`

1. reads the restore spec from the bucket and checks its size and SHA-256 (a
   tampered spec is :class:`ChecksumMismatch`);
2. downloads every catalog file (each Iceberg table's directory, the LanceDB
   directory) by its content address, each verified by SHA-256 — the table metadata
   files are also checked against the SHA-256 the spec names for them;
3. checks the registry keys in the bucket against the spec (recreating a missing one
   from its content-addressed copy) and that every ``snapshot.json`` is stored;
4. creates ``DIR/catalog.db`` with the namespace's frozen properties and registers each
   table from a copy of its metadata JSON that adds the :mod:`catalog.fileio` properties (the
   Avro files and data files are the originals, byte for byte);
5. writes ``DIR/vidlake.json``, a settings file whose object store is the bucket, with
   the endpoint, path style and region the spec's pointer records (no environment needed).

No latent is fetched: the loader's cache pulls them from the bucket on use.
:func:`check_restore` then reads one step of the sealed snapshot through the loader and
records a proof next to the spec, which ``cleanup-check`` requires.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from catalog.errors import ChecksumMismatch, InvalidInput, NotFound
from catalog.fileio import IO_IMPL, REMAP_FROM, REMAP_TO
from catalog.hashing import sha256_bytes, sha256_file
from catalog.objects.s3 import S3ObjectStore
from manifests.registry import canonical_json
from manifests.storage.seal import write_json_atomic

__all__ = [
    "PROOF_PREFIX",
    "check_restore",
    "has_proof",
    "load_spec",
    "open_spec_store",
    "restore",
]

PROOF_PREFIX = "restore-proofs/"
Progress = Callable[[int, int], None]


def open_spec_store(pointer: dict[str, Any], endpoint_url: str | None = None) -> S3ObjectStore:
    """The bucket store a local ``restore_spec.json`` points at."""
    return S3ObjectStore(
        pointer["bucket"],
        pointer.get("prefix", ""),
        endpoint_url=endpoint_url or pointer.get("endpoint_url"),
        path_style=pointer.get("path_style"),
        region_name=pointer.get("region_name"),
    )


def load_spec(
    spec_file: str | Path, endpoint_url: str | None = None
) -> tuple[dict[str, Any], dict[str, Any], S3ObjectStore]:
    """Read the local pointer and the verified spec it names: (pointer, spec, store)."""
    try:
        pointer = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(f"restore spec {spec_file} not found", path=str(spec_file)) from None
    except ValueError as exc:
        raise InvalidInput(f"{spec_file} is not JSON: {exc}", path=str(spec_file)) from exc
    for k in ("bucket", "key", "sha256", "size"):
        if k not in pointer:
            raise InvalidInput(f"{spec_file} lacks {k!r}", path=str(spec_file), field=k)
    store = open_spec_store(pointer, endpoint_url)
    body = store.get_key(pointer["key"])
    if len(body) != pointer["size"] or sha256_bytes(body) != pointer["sha256"]:
        raise ChecksumMismatch(
            f"restore spec {pointer['key']} does not match {spec_file} (size or SHA-256)",
            key=pointer["key"],
            sha256=pointer["sha256"],
            actual=sha256_bytes(body),
        )
    spec = json.loads(body)
    if spec.get("vidlake_restore_spec") != 1:
        raise InvalidInput(f"{pointer['key']} is not a vidlake restore spec", key=pointer["key"])
    return pointer, spec, store


def restore(
    spec_file: str | Path,
    out_dir: str | Path,
    *,
    endpoint_url: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Build a fresh embedded catalog in ``out_dir`` (see the module docstring).

    Raises:
        InvalidInput: ``out_dir`` is not empty, or the spec is malformed.
        ChecksumMismatch: the spec, a catalog file or a registry entry was tampered with.
        NotFound: something the spec names is missing from the bucket.
    """
    out = Path(out_dir).absolute()
    if out.exists() and any(out.iterdir()):
        raise InvalidInput(f"restore target {out} is not empty", path=str(out))
    pointer, spec, store = load_spec(spec_file, endpoint_url)
    files = [("warehouse", f) for f in spec["files"]["warehouse"]]
    files += [("lance", f) for f in spec["files"]["lance"]]
    total = sum(f["size"] for _, f in files)
    done = 0
    for kind, f in files:
        dest = out / kind / _safe_rel(f["name"])
        info = store.download(f["sha256"], dest)  # verified by SHA-256
        if info.size != f["size"]:
            raise ChecksumMismatch(f"{dest} has {info.size} bytes, not {f['size']}", path=str(dest))
        done += info.size
        if progress is not None:
            progress(done, total)
    _restore_registry(store, spec)
    config = _register_tables(out, spec, store)
    settings = {
        "home": str(out),
        "objects": store.url,
        "namespace": spec["namespace"],
        "s3_endpoint_url": store.endpoint_url,
        "s3_path_style": bool(store.path_style),
        "s3_region": store.region_name,
    }
    write_json_atomic(out / "vidlake.json", settings)
    return {
        "out": str(out),
        "config": str(out / "vidlake.json"),
        "catalog_uri": config.uri,
        "objects": store.url,
        "tables": sorted(spec["tables"]),
        "files": len(files),
        "bytes": total,
        "snapshot": spec["snapshot"],
        "spec_sha256": pointer["sha256"],
    }


def _safe_rel(name: str) -> Path:
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise InvalidInput(f"unsafe path {name!r} in the restore spec", name=name)
    return rel


def _restore_registry(store: S3ObjectStore, spec: dict[str, Any]) -> None:
    from manifests.registry import RegistryEntry

    for reg in spec["registry"]:
        try:
            body = store.get_key(reg["key"])
        except NotFound:
            body = store.get(reg["sha256"])
            store.put_key(reg["key"], body)
        if sha256_bytes(body) != reg["sha256"] or len(body) != reg["size"]:
            raise ChecksumMismatch(
                f"registry entry {reg['key']} in the bucket differs from the sealed one",
                key=reg["key"],
                sha256=reg["sha256"],
            )
        entry = RegistryEntry.model_validate_json(body)
        if store.head(entry.snapshot_sha256) is None:
            raise NotFound(
                f"snapshot.json of version {entry.version} is not in the bucket",
                sha256=entry.snapshot_sha256,
            )


def _register_tables(out: Path, spec: dict[str, Any], store: S3ObjectStore) -> Any:
    from catalog.backends import connect
    from catalog.catalog import VidlakeCatalog
    from catalog.config import CatalogConfig

    props = spec["namespace_properties"]
    config = CatalogConfig.embedded(
        out,
        namespace=spec["namespace"],
        objects=store.url,
        s3_endpoint_url=store.endpoint_url,
        s3_path_style=store.path_style,
        s3_region=store.region_name,
    )
    old_root = spec["source_warehouse"].rstrip("/")
    new_root = (out / "warehouse").as_uri()
    iceberg = connect(config)
    iceberg.create_namespace(spec["namespace"], props)
    for table, t in sorted(spec["tables"].items()):
        rel = _safe_rel(t["name"])
        path = out / "warehouse" / rel
        if sha256_file(path) != (t["sha256"], t["size"]):
            raise ChecksumMismatch(f"metadata of table {table} differs from the spec", table=table)
        meta = json.loads(path.read_bytes())
        meta["properties"] = {
            **meta.get("properties", {}),
            "py-io-impl": IO_IMPL,
            REMAP_FROM: old_root,
            REMAP_TO: new_root,
        }
        meta["location"] = new_root + meta["location"][len(old_root) :]
        version = int(rel.name.split("-", 1)[0]) + 1 if rel.name[:5].isdigit() else 0
        new_meta = path.with_name(f"{version:05d}-{uuid.uuid4()}.metadata.json")
        new_meta.write_bytes(json.dumps(meta).encode())
        iceberg.register_table((spec["namespace"], table), new_meta.as_uri())
    closer = getattr(iceberg, "close", None)
    if callable(closer):
        closer()
    VidlakeCatalog.open(config).close()  # checks every table's schema
    return config


def check_restore(
    spec_file: str | Path,
    work_dir: str | Path,
    *,
    endpoint_url: str | None = None,
    step: int = 0,
) -> dict[str, Any]:
    """A representative read from the bucket alone, then a proof that cleanup-check needs.

    Downloads ``plan.arrow`` and ``index.arrow`` of the sealed snapshot through the
    registry in the bucket (verified against ``snapshot.json``), and reads every latent
    member of step ``step`` by range, each checked against its member SHA-256. On
    success a proof is written to ``restore-proofs/<spec sha256>/<time>.json``.
    """
    import pyarrow as pa

    from manifests.ipc import read_table
    from manifests.registry import Registry

    pointer, spec, store = load_spec(spec_file, endpoint_url)
    version = int(spec["snapshot"])
    registry = Registry(store)
    work = Path(work_dir)
    plan_path = registry.artifact_path(version, "plan.arrow", work)
    index_path = registry.artifact_path(version, "index.arrow", work)
    plan = read_table(plan_path, what="plan.arrow")
    if not 0 <= step < plan.num_rows:
        raise InvalidInput(f"step {step} is not in the plan (0..{plan.num_rows - 1})", step=step)
    rows = plan.column("rows")[step].as_py()
    index = read_table(index_path, what="index.arrow").take(pa.array(rows))
    read = 0
    for obj, off, length, member in zip(
        index.column("object_sha256").to_pylist(),
        index.column("offset").to_pylist(),
        index.column("length").to_pylist(),
        index.column("member_sha256").to_pylist(),
        strict=True,
    ):
        data = store.get_range(obj, off, length)
        if sha256_bytes(data) != member:
            raise ChecksumMismatch(
                f"latent member {member} of object {obj} read back corrupt", sha256=member
            )
        read += len(data)
    proof = {
        "spec_key": pointer["key"],
        "spec_sha256": pointer["sha256"],
        "snapshot": version,
        "step": step,
        "samples": len(rows),
        "bytes": read,
        "at": datetime.now(UTC).isoformat(),
    }
    key = f"{PROOF_PREFIX}{pointer['sha256']}/{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}.json"
    store.put_key(key, canonical_json(proof))
    return {**proof, "proof_key": key}


def has_proof(store: S3ObjectStore, spec_sha256: str) -> bool:
    """True when a representative read of the spec's restore has succeeded."""
    return bool(store.list_keys(f"{PROOF_PREFIX}{spec_sha256}/"))
