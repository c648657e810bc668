"""The inventory of one snapshot: every local file training on it needs, listed explicitly.

An inventory is a JSONL file. Its first line is a header (``{"vidlake_inventory": 1,
...}``) holding what a restore needs besides bytes: the catalog namespace's properties
(the frozen eval settings), each Iceberg table's current metadata location, and the
roots the tree entries are relative to. Every further line is one
:class:`InventoryEntry`. Nothing is found by scanning unrelated directories: the
entries are the snapshot's artifacts and ``snapshot.json``, the registry entries up
to the version, every latent and text-embedding object its index references, and the
catalog's own files (each Iceberg table's directory and the LanceDB directory).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalog.atomic import write_bytes
from catalog.errors import InvalidInput, NotFound
from catalog.hashing import is_sha256
from catalog.objects.local import LocalObjectStore
from manifests.format import registry_key
from manifests.ipc import read_table

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from manifests.registry import Registry

__all__ = [
    "KINDS",
    "Inventory",
    "InventoryEntry",
    "build_inventory",
    "read_inventory",
    "referenced_objects",
    "stat_identity",
]

#: What an entry is; ``warehouse`` and ``lance`` are relative to the header's roots.
KINDS = (
    "artifact",
    "snapshot",
    "registry",
    "latent",
    "text_embedding",
    "warehouse",
    "lance",
    "watched",
)


def stat_identity(path: str | Path) -> tuple[int, int, int]:
    """(size, mtime_ns, inode) of ``path``: what tells us a file is still the same file."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


@dataclass(frozen=True)
class InventoryEntry:
    """One file a snapshot needs.

    Attributes:
        kind: One of :data:`KINDS`.
        path: The resolved local path.
        size, mtime_ns, inode: The file's identity when it was listed.
        sha256: The expected SHA-256 where the file is content-addressed, else None.
        name: The key (registry) or path relative to its root (warehouse, lance).
    """

    kind: str
    path: str
    size: int
    mtime_ns: int
    inode: int
    sha256: str | None = None
    name: str | None = None

    @classmethod
    def of(
        cls, kind: str, path: Path, sha256: str | None = None, name: str | None = None
    ) -> InventoryEntry:
        try:
            size, mtime_ns, inode = stat_identity(path)
        except FileNotFoundError:
            raise NotFound(f"{kind} file {path} is missing", path=str(path), kind=kind) from None
        return cls(kind, str(path.resolve()), size, mtime_ns, inode, sha256, name)

    @property
    def identity(self) -> tuple[int, int, int]:
        return self.size, self.mtime_ns, self.inode


@dataclass(frozen=True)
class Inventory:
    """An inventory: its header and its entries."""

    header: dict[str, Any]
    entries: tuple[InventoryEntry, ...]

    def write(self, out: str | Path) -> Path:
        """Write the JSONL file atomically (temp file, fsync, rename)."""
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(self.header, sort_keys=True)]
        lines += [json.dumps(asdict(entry), sort_keys=True) for entry in self.entries]
        write_bytes(out, "".join(line + "\n" for line in lines).encode())
        return out

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out


def read_inventory(path: str | Path) -> Inventory:
    """Read an inventory file; InvalidInput names the first bad line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise NotFound(f"inventory {path} not found", path=str(path)) from None
    if not lines:
        raise InvalidInput(f"inventory {path} is empty", path=str(path))
    try:
        header = json.loads(lines[0])
        if header.get("vidlake_inventory") != 1:
            raise ValueError("no vidlake_inventory header")
        entries = []
        for n, line in enumerate(lines[1:], start=2):
            entry = InventoryEntry(**json.loads(line))
            if entry.kind not in KINDS or (
                entry.sha256 is not None and not is_sha256(entry.sha256)
            ):
                raise ValueError(f"line {n}: bad kind or sha256")
            entries.append(entry)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"inventory {path} is malformed: {exc}", path=str(path)) from exc
    return Inventory(header, tuple(entries))


def build_inventory(
    catalog: VidlakeCatalog,
    registry: Registry,
    version: int,
    *,
    text_cache: str | Path | None = None,
) -> Inventory:
    """List every local file snapshot ``version`` needs (see the module docstring).

    Raises:
        InvalidInput: The object store, warehouse or LanceDB directory is not local.
        NotFound: The version, or a file it references, is missing locally.
    """
    store = registry.store
    if not isinstance(store, LocalObjectStore):
        raise InvalidInput(
            f"inventory lists local files; the object store {store.url} is not a local directory",
            field="objects",
        )
    record = registry.get(version)
    entries: list[InventoryEntry] = []
    missing: list[str] = []

    def obj(kind: str, sha: str) -> None:
        path = store.object_path(sha)
        if not path.is_file() and text_cache is not None and kind == "text_embedding":
            path = next((p for p in _cache_paths(Path(text_cache), sha) if p.is_file()), path)
        if not path.is_file():
            missing.append(f"{kind} {sha}")
            return
        entries.append(InventoryEntry.of(kind, path, sha))

    for v in range(1, version + 1):
        key = registry_key(v)
        path = store.root / key
        if path.is_file():
            entries.append(InventoryEntry.of("registry", path, name=key))
            obj("snapshot", registry.entry(v).snapshot_sha256)
    for ref in record.artifacts.values():
        obj("artifact", ref.sha256)
    latents, texts = referenced_objects(registry, version)
    for sha in latents:
        obj("latent", sha)
    for sha in texts:
        obj("text_embedding", sha)
    if missing:
        raise NotFound(
            f"{len(missing)} objects of version {version} are not stored locally: {missing[:5]}",
            missing=missing,
        )
    header = _catalog_header(catalog, entries)
    header.update(snapshot=version, objects=store.url, created_at=datetime.now(UTC).isoformat())
    unique: dict[str, InventoryEntry] = {}
    for e in entries:  # an object can be two things at once (a latent and an artifact)
        unique.setdefault(e.path, e)
    return Inventory(header, tuple(unique.values()))


def _cache_paths(root: Path, sha: str) -> Iterator[Path]:
    yield root / sha
    yield root / sha[:2] / sha
    yield root / "objects" / sha[:2] / sha


def referenced_objects(registry: Registry, version: int) -> tuple[list[str], list[str]]:
    """Latent and text-embedding object SHA-256s ``version``'s index references."""
    with registry.local_artifact(version, "index.arrow") as path:
        index = read_table(path, what="index.arrow")
        latents = sorted(set(index.column("object_sha256").to_pylist()))
        texts = sorted(
            {s for row in index.column("text_embedding_sha256").to_pylist() for s in row if s}
        )
    return latents, texts


def _catalog_header(catalog: VidlakeCatalog, entries: list[InventoryEntry]) -> dict[str, Any]:
    """The catalog's part of the header; appends the table and LanceDB files to ``entries``."""
    from catalog.tables import TABLE_NAMES

    config = catalog.config
    warehouse = _local_dir(config.warehouse, "warehouse")
    lance = _local_dir(config.lance, "lance")
    tables: dict[str, str] = {}
    for name in TABLE_NAMES:
        tables[name], location = catalog.locations(name)
        table_dir = _local_dir(location, f"table {name}")
        entries.extend(_tree("warehouse", table_dir, warehouse))
    if lance.is_dir():
        entries.extend(_tree("lance", lance, lance))
    props = catalog.namespace_properties()
    return {
        "vidlake_inventory": 1,
        "namespace": config.namespace,
        "namespace_properties": props,
        "warehouse": warehouse.as_uri(),
        "lance": str(lance),
        "tables": tables,
    }


def _tree(kind: str, top: Path, root: Path) -> Iterable[InventoryEntry]:
    for dirpath, _dirs, files in sorted(os.walk(top)):
        for fname in sorted(files):
            path = Path(dirpath) / fname
            if fname.startswith(".") or not path.is_file():
                continue  # temp files of an in-flight writer are not part of the state
            yield InventoryEntry.of(kind, path, name=path.relative_to(root).as_posix())


def _local_dir(location: str, what: str) -> Path:
    if "://" in location and not location.startswith("file://"):
        raise InvalidInput(f"the {what} at {location} is not a local directory", field=what)
    return Path(location.removeprefix("file://")).absolute()
