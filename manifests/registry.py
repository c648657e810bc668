"""The snapshot registry: immutable, numbered snapshot versions in an object store.

A version is four or more content-addressed objects (the artifacts of
:mod:`manifests.format` plus ``snapshot.json``) and one create-only named key,
``manifests/v{N:06d}.json``, that claims the number ``N`` and names its parent.

Publication protocol (:meth:`Registry.publish`)::

    1. check   parent == latest version now (else Conflict, nothing written)
    2. upload  every artifact, then snapshot.json   (content-addressed, idempotent)
    3. claim   put_key(manifests/v{parent+1}.json)  (create-only; lost race -> Conflict)

The key is written last, so no key ever points at a missing or half-written
object, and a crash before step 3 leaves only unreferenced, harmless objects that a
rerun re-uses. Versions are contiguous: version ``N`` is created only by a
publisher that saw ``N - 1`` as the latest, and keys are never deleted, so a claim
of ``parent + 1`` succeeds exactly when ``parent`` is still the latest version.

Pins are an append-only log of create-only events
(``pins/v{N:06d}/e{seq:06d}.json``); the event with the highest sequence number
decides whether a version is pinned (:mod:`manifests.pins`). Diffs between versions
are computed in :mod:`manifests.diff`; verified local copies of artifacts come from
:mod:`manifests.artifacts`.

Why this module is a little over 500 lines: :class:`Registry` is the one writer of
the registry's keys, and its methods share the store, the key layout and the read
cache; what stands alone (diffs, pins, artifact copies) lives in its own module.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import io
import json
import logging
import re
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, ValidationError

from catalog.errors import ChecksumMismatch, Conflict, IntegrityError, InvalidInput, NotFound
from catalog.hashing import is_sha256, sha256_bytes
from catalog.objects import ObjectStore
from manifests.artifacts import fetch_verified, is_verified
from manifests.format import (
    ARTIFACT_NAMES,
    SNAPSHOT_REQUIRED_KEYS,
    erasure_prefix,
    erasure_seq,
    registry_key,
)
from manifests.ipc import read_columns

if TYPE_CHECKING:
    from manifests.diff import SnapshotDiff

__all__ = [
    "ArtifactRef",
    "ErasureMark",
    "Pin",
    "PinEvent",
    "Registry",
    "RegistryEntry",
    "SnapshotRecord",
    "canonical_json",
]

log = logging.getLogger("vidlake.manifests")

SNAPSHOT_JSON = "snapshot.json"
_REGISTRY_PREFIX = "manifests/"
_VERSION_KEY = re.compile(r"^manifests/v(\d{6,})\.json$")
_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Keys publish() computes; a caller's values for them are replaced.
_SET_BY_PUBLISH = frozenset({"version", "parent", "artifacts", "patch_of"})


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` the one way vidlake hashes JSON: sorted keys, UTF-8,
    two-space indent, no NaN/Infinity, ``\\n``-terminated.

    Raises:
        InvalidInput: ``value`` holds something JSON cannot represent exactly.
    """
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"not canonical-JSON serialisable: {exc}") from exc
    return (text + "\n").encode("utf-8")


class _Fact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ArtifactRef(_Fact):
    """Where an artifact's bytes are: an object in the store, by SHA-256 and size."""

    sha256: str
    size: int


class RegistryEntry(_Fact):
    """The body of ``manifests/v{N:06d}.json``: the claim of version ``N``."""

    version: int
    parent: int | None
    snapshot_sha256: str
    snapshot_size: int
    recipe_sha256: str
    patch_of: int | None
    created_at: str


class ErasureMark(_Fact):
    """The body of ``manifests/v{N:06d}.erasure-{k:04d}.json`` (see manifests.erasure)."""

    version: int
    seq: int
    erasure_id: str
    asset_id: str
    #: Every artifact of the version after this erasure (snapshot.json excluded).
    artifacts: dict[str, ArtifactRef]
    #: Artifact name -> the object it replaced (deleted once no version names it).
    replaced: dict[str, str]
    #: Manifest rows erased by this and every earlier mark, sorted.
    erased_rows: list[int]
    rows_erased: int
    rows_repointed: int
    #: Catalog pins (table -> Iceberg snapshot id) the erasure expired.
    expired_pins: dict[str, int]
    created_at: str


class SnapshotRecord(_Fact):
    """A published version: its registry entry, its verified ``snapshot.json`` and its
    erasure marks (oldest first; the latest one names the current artifacts)."""

    entry: RegistryEntry
    snapshot: dict[str, Any]
    erasures: tuple[ErasureMark, ...] = ()

    @property
    def contains_erased_data(self) -> bool:
        """Rows of this version were erased by a hard takedown (the loader skips them)."""
        return bool(self.erasures and self.erasures[-1].erased_rows)

    @property
    def version(self) -> int:
        return self.entry.version

    @property
    def parent(self) -> int | None:
        return self.entry.parent

    @property
    def patch_of(self) -> int | None:
        return self.entry.patch_of

    @property
    def artifacts(self) -> dict[str, ArtifactRef]:
        """Every artifact by name, ``snapshot.json`` included (after the latest erasure)."""
        if self.erasures:
            refs = dict(self.erasures[-1].artifacts)
        else:
            refs = {name: ArtifactRef(**ref) for name, ref in self.snapshot["artifacts"].items()}
        refs[SNAPSHOT_JSON] = ArtifactRef(
            sha256=self.entry.snapshot_sha256, size=self.entry.snapshot_size
        )
        return refs


class PinEvent(_Fact):
    """One entry of a version's pin log (``pins/v{N:06d}/e{seq:06d}.json``)."""

    version: int
    seq: int
    action: Literal["pin", "unpin"]
    reason: str | None
    by: str | None
    at: str


class Pin(_Fact):
    """A version that is pinned now, and the event that pinned it."""

    version: int
    reason: str | None
    by: str | None
    at: str


class Registry:
    """Numbered, immutable snapshot versions kept in an :class:`ObjectStore`.

    Every read is verified: an entry's ``snapshot.json`` must hash to the SHA-256 the
    entry names, and artifacts are checked against ``snapshot.json`` on download.
    The registry holds no state of its own; several processes (or hosts) may use the
    same store at once.
    """

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    # -- publication --------------------------------------------------------------
    def publish(
        self,
        artifacts: Mapping[str, Path | str | ArtifactRef],
        snapshot: Mapping[str, Any],
        *,
        parent: int | None,
        patch_of: int | None = None,
    ) -> SnapshotRecord:
        """Upload a snapshot's artifacts and claim version ``parent + 1`` (or 1).

        ``snapshot`` is copied, not changed: the published ``snapshot.json`` is that
        copy plus ``version``, ``parent``, ``patch_of`` and ``artifacts`` (SHA-256 and
        size of each). An artifact given as an :class:`ArtifactRef` re-uses an object
        already in the store (a patch keeps its base's index and manifest).

        Args:
            artifacts: every name of :data:`manifests.format.ARTIFACT_NAMES`, plus any
                extra artifacts, each a local file or an existing object.
            snapshot: the metadata; every key of ``SNAPSHOT_REQUIRED_KEYS`` except
                those set here.
            parent: the version the caller believes is the latest (None: none yet).
            patch_of: the version this one patches, if it is a patch.

        Raises:
            Conflict: ``parent`` is not the latest version, or another publisher
                claimed the version first (``exc.version``, ``exc.latest``).
            InvalidInput: a missing artifact or metadata key, a bad name or path.
            NotFound: ``patch_of`` or a referenced object does not exist.
        """
        meta = self._check_snapshot(snapshot)
        self._check_artifacts(artifacts)
        if patch_of is not None:
            self.entry(patch_of)  # NotFound if it does not exist
        version = self._check_parent(parent)
        refs = self.upload_artifacts(artifacts)
        meta.update(
            version=version,
            parent=parent,
            patch_of=patch_of,
            artifacts={name: refs[name].model_dump() for name in sorted(refs)},
        )
        body = canonical_json(meta)
        put = self.store.put_bytes(body)
        entry = RegistryEntry(
            version=version,
            parent=parent,
            snapshot_sha256=put.info.sha256,
            snapshot_size=put.info.size,
            recipe_sha256=meta["recipe_sha256"],
            patch_of=patch_of,
            created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        )
        try:
            self.store.put_key(registry_key(version), canonical_json(entry.model_dump()))
        except Conflict as exc:
            latest = self.next_parent()
            raise Conflict(
                f"version {version} was claimed by another publisher first (latest is {latest})",
                version=version,
                latest=latest,
            ) from exc
        log.info("published snapshot version %d (parent %s)", version, parent)
        return SnapshotRecord(entry=entry, snapshot=meta)

    def upload_artifacts(
        self, artifacts: Mapping[str, Path | str | ArtifactRef]
    ) -> dict[str, ArtifactRef]:
        """Store each artifact content-addressed; return its reference by name.

        Idempotent: a file whose bytes are already stored is not stored twice, so a
        publisher retrying after a :class:`Conflict` can pass the returned refs back.
        """
        self._check_artifacts(artifacts)
        refs: dict[str, ArtifactRef] = {}
        for name, source in artifacts.items():
            if isinstance(source, ArtifactRef):
                refs[name] = source
            else:
                put = self.store.put_file(source)
                refs[name] = ArtifactRef(sha256=put.info.sha256, size=put.info.size)
        return refs

    def _check_artifacts(self, artifacts: Mapping[str, Path | str | ArtifactRef]) -> None:
        """Check every name, file and reference before the first upload, so that bad
        input stores nothing."""
        missing = sorted(set(ARTIFACT_NAMES) - set(artifacts))
        if missing:
            raise InvalidInput(f"snapshot artifacts missing: {missing}", field="artifacts")
        for name, source in artifacts.items():
            if not _ARTIFACT_NAME.match(name) or name == SNAPSHOT_JSON:
                raise InvalidInput(f"bad artifact name {name!r}", field="artifacts")
            if isinstance(source, ArtifactRef):
                self._check_stored(name, source)
            elif not Path(source).is_file():
                raise InvalidInput(f"artifact {name}: {source} is not a file", field="artifacts")

    def _check_stored(self, name: str, ref: ArtifactRef) -> None:
        info = self.store.head(ref.sha256)
        if info is None:
            raise NotFound(f"artifact {name}: object {ref.sha256} is not stored", sha256=ref.sha256)
        if info.size != ref.size:
            raise ChecksumMismatch(
                f"artifact {name}: stored size {info.size} != {ref.size}",
                sha256=ref.sha256,
                expected_size=ref.size,
                actual_size=info.size,
            )

    def _check_parent(self, parent: int | None) -> int:
        if parent is not None and (not isinstance(parent, int) or parent < 1):
            raise InvalidInput(
                f"parent must be a version >= 1 or None, got {parent!r}", field="parent"
            )
        latest = self.next_parent()
        version = 1 if parent is None else parent + 1
        if parent != latest:
            # A stale (or future) parent: refuse before uploading anything.
            raise Conflict(
                f"parent {parent} is not the latest version ({latest}); re-read and retry",
                version=version,
                latest=latest,
            )
        return version

    @staticmethod
    def _check_snapshot(snapshot: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(snapshot, Mapping):
            raise InvalidInput("snapshot must be a mapping", field="snapshot")
        missing = sorted(SNAPSHOT_REQUIRED_KEYS - _SET_BY_PUBLISH - set(snapshot))
        if missing:
            raise InvalidInput(f"snapshot.json keys missing: {missing}", field="snapshot")
        if not is_sha256(snapshot["recipe_sha256"]):
            raise InvalidInput(
                "snapshot recipe_sha256 must be a SHA-256 hex digest", field="recipe_sha256"
            )
        meta = {k: copy.deepcopy(v) for k, v in snapshot.items() if k not in _SET_BY_PUBLISH}
        canonical_json(meta)  # fail early on values JSON cannot hold
        return meta

    # -- reading ------------------------------------------------------------------
    def versions(self) -> builtins.list[int]:
        """Every published version number, ascending (one listing, no reads)."""
        found = []
        for key in self.store.list_keys(_REGISTRY_PREFIX):
            match = _VERSION_KEY.match(key)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def next_parent(self) -> int | None:
        """The latest version (the parent a new publication must name), or None."""
        versions = self.versions()
        return versions[-1] if versions else None

    def entry(self, version: int) -> RegistryEntry:
        """The registry entry of ``version`` (NotFound when it was never published)."""
        key = registry_key(version)
        try:
            raw = self.store.get_key(key)
        except NotFound as exc:
            raise NotFound(f"snapshot version {version} does not exist", version=version) from exc
        try:
            entry = RegistryEntry.model_validate_json(raw)
        except ValidationError as exc:
            raise IntegrityError(f"registry entry {key} is malformed: {exc}", key=key) from exc
        if entry.version != version:
            raise IntegrityError(f"registry entry {key} names version {entry.version}", key=key)
        return entry

    def get(self, version: int) -> SnapshotRecord:
        """A version's entry and its ``snapshot.json``, verified by SHA-256 and size.

        Raises:
            NotFound: no such version.
            ChecksumMismatch: the stored ``snapshot.json`` is not what the entry names.
            IntegrityError: the entry and ``snapshot.json`` disagree.
        """
        entry = self.entry(version)
        body = self.store.get(entry.snapshot_sha256)
        # The store verifies too; checking here keeps the guarantee local and cheap.
        if sha256_bytes(body) != entry.snapshot_sha256 or len(body) != entry.snapshot_size:
            raise ChecksumMismatch(
                f"snapshot.json of version {version} does not match its registry entry",
                sha256=entry.snapshot_sha256,
                version=version,
            )
        snapshot = json.loads(body)
        for field in ("version", "parent", "patch_of"):
            if snapshot.get(field) != getattr(entry, field):
                raise IntegrityError(
                    f"snapshot.json of version {version}: {field} disagrees with its entry",
                    version=version,
                    field=field,
                )
        return SnapshotRecord(
            entry=entry, snapshot=snapshot, erasures=tuple(self.erasures(version))
        )

    def erasure_count(self, version: int) -> int:
        """How many erasure marks ``version`` has (one listing, no reads)."""
        keys = self.store.list_keys(erasure_prefix(version))
        return sum(erasure_seq(k, version) is not None for k in keys)

    def erasures(self, version: int) -> builtins.list[ErasureMark]:
        """The erasure marks of ``version``, oldest first (see :mod:`manifests.erasure`)."""
        marks = []
        for key in self.store.list_keys(erasure_prefix(version)):
            seq = erasure_seq(key, version)
            if seq is None:
                continue
            try:
                mark = ErasureMark.model_validate_json(self.store.get_key(key))
            except ValidationError as exc:
                raise IntegrityError(f"erasure mark {key} is malformed: {exc}", key=key) from exc
            if mark.version != version or mark.seq != seq:
                raise IntegrityError(f"erasure mark {key} names another version or seq", key=key)
            marks.append(mark)
        return sorted(marks, key=lambda m: m.seq)

    def list(self) -> builtins.list[SnapshotRecord]:
        """Every version, ascending, each verified as :meth:`get` does."""
        return [self.get(v) for v in self.versions()]

    def latest(self) -> SnapshotRecord | None:
        """The newest version, or None when nothing has been published."""
        version = self.next_parent()
        return None if version is None else self.get(version)

    # -- artifacts ----------------------------------------------------------------
    def artifact_ref(self, version: int, name: str) -> ArtifactRef:
        """Where artifact ``name`` of ``version`` is stored (NotFound if it has none)."""
        refs = self.get(version).artifacts
        if name not in refs:
            raise NotFound(
                f"version {version} has no artifact {name!r}", version=version, name=name
            )
        return refs[name]

    def artifact_path(self, version: int, name: str, dest_dir: str | Path) -> Path:
        """Download an artifact to ``dest_dir/name``, verified; reuse a verified copy."""
        ref = self.artifact_ref(version, name)
        dest = Path(dest_dir) / name
        if is_verified(dest, ref.sha256, ref.size):
            return dest

        def fetch(tmp: Path) -> tuple[str, int]:
            info = self.store.download(ref.sha256, tmp)  # hashes while it writes
            return info.sha256, info.size

        what = f"artifact {name} of version {version}"
        return fetch_verified(dest, ref.sha256, ref.size, fetch, what=what)

    def read_artifact(self, version: int, name: str) -> bytes:
        """An artifact's bytes, verified (small artifacts; use artifact_path for plans)."""
        ref = self.artifact_ref(version, name)
        data = self.store.get(ref.sha256)
        if sha256_bytes(data) != ref.sha256 or len(data) != ref.size:
            raise ChecksumMismatch(
                f"artifact {name} of version {version} does not verify",
                sha256=ref.sha256,
                version=version,
            )
        return data

    def open_artifact(self, version: int, name: str) -> BinaryIO:
        """A binary stream over an artifact's verified bytes."""
        return io.BytesIO(self.read_artifact(version, name))

    @contextlib.contextmanager
    def local_artifact(self, version: int, name: str) -> Iterator[Path]:
        """A verified local copy of an artifact, removed on exit (for memory-mapping)."""
        with tempfile.TemporaryDirectory(prefix="vidlake-artifact-") as tmp:
            yield self.artifact_path(version, name, tmp)

    # -- diff ---------------------------------------------------------------------
    def diff(self, a: int, b: int, *, max_clips: int | None = None) -> SnapshotDiff:
        """Compare two versions (:func:`manifests.diff.diff_versions`)."""
        from manifests.diff import diff_versions

        return diff_versions(self, a, b, max_clips=max_clips)

    # -- pins ---------------------------------------------------------------------
    def pin(self, version: int, reason: str, by: str | None = None) -> Pin:
        """Pin ``version`` so a garbage collector keeps every object it references."""
        from manifests.pins import pin_version

        return pin_version(self, version, reason, by)

    def unpin(self, version: int, *, by: str | None = None, reason: str | None = None) -> bool:
        """Unpin ``version``; False (and nothing written) when it was not pinned."""
        from manifests.pins import unpin_version

        return unpin_version(self, version, by=by, reason=reason)

    def pins(self) -> builtins.list[Pin]:
        """The versions pinned now, ascending."""
        from manifests.pins import pinned_versions

        return pinned_versions(self.store)

    def pin_history(self, version: int) -> builtins.list[PinEvent]:
        """Every pin and unpin of ``version``, oldest first."""
        from manifests.pins import pin_history

        return pin_history(self.store, version)

    def protected_objects(self) -> set[str]:
        """SHA-256 of every object a pinned version references: its artifacts,
        ``snapshot.json``, and every latent and text-embedding object its index names.

        A garbage collector must also spare recent unreferenced objects: a publisher
        uploads its objects before it claims a version.
        """
        protected: set[str] = set()
        indexes_read: set[str] = set()
        for pin in self.pins():
            refs = self.get(pin.version).artifacts
            protected.update(ref.sha256 for ref in refs.values())
            if refs["index.arrow"].sha256 in indexes_read:
                continue  # a patch shares its base's index
            indexes_read.add(refs["index.arrow"].sha256)
            with self.local_artifact(pin.version, "index.arrow") as path:
                for column in read_columns(path, ["object_sha256", "text_embedding_sha256"]):
                    protected.update(pc.unique(column).to_pylist())
        return protected
