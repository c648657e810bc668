"""Pins: a frozen catalog state, every input a cut reads.

A :class:`Pin` maps each Iceberg table name to the snapshot id it is read at (None:
the table was empty), and carries, as a separate attribute, the LanceDB table version
of each embedding model it covers (:attr:`Pin.embeddings`; None: the model had no
table). The Mapping interface is the Iceberg part only, so code that walks a pin's
tables (the SQL views, lineage, interop) keeps working unchanged.

The dict form (:meth:`Pin.to_dict`, recorded as ``catalog_snapshot_ids`` in
``snapshot.json`` and accepted as a recipe's explicit ``catalog_pin``) is flat: the
Iceberg tables under their names, and each embedding model under
``"embeddings/<model version>"``, and the semantic-dedup centroid version of each
model under ``"centroids/<model version>"`` (:attr:`Pin.centroids`, the version of the
recipe's dedup config; see :mod:`materializer.centroids`). Every value is an int or
None, so the form fits every schema that already holds ``{table: snapshot_id}``;
embedding and centroid keys are present only when the pin covers them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from catalog.errors import InvalidInput
from catalog.tables import TABLE_NAMES

__all__ = [
    "CENTROIDS_PREFIX",
    "EMBEDDINGS_PREFIX",
    "Pin",
    "centroid_versions",
    "centroids_key",
    "embedding_key",
    "split_pin_keys",
]

#: Prefix of an embedding model's key in a pin's dict form.
EMBEDDINGS_PREFIX = "embeddings/"
#: Prefix of a model's semantic-dedup centroid version in a pin's dict form.
CENTROIDS_PREFIX = "centroids/"


def embedding_key(model_version: str) -> str:
    """The dict-form key of ``model_version`` (``"embeddings/<model version>"``)."""
    return EMBEDDINGS_PREFIX + model_version


def centroids_key(model_version: str) -> str:
    """The dict-form key of ``model_version``'s centroids (``"centroids/<model version>"``)."""
    return CENTROIDS_PREFIX + model_version


def split_pin_keys(
    data: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a pin's dict form into (Iceberg tables, embedding model -> version);
    centroid keys are in neither (:func:`centroid_versions`)."""
    tables: dict[str, Any] = {}
    embeddings: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(key, str) and key.startswith(EMBEDDINGS_PREFIX):
            embeddings[key[len(EMBEDDINGS_PREFIX) :]] = value
        elif not (isinstance(key, str) and key.startswith(CENTROIDS_PREFIX)):
            tables[key] = value
    return tables, embeddings


def centroid_versions(data: Mapping[str, Any]) -> dict[str, Any]:
    """Model -> centroid version of a pin's dict form."""
    return {
        k[len(CENTROIDS_PREFIX) :]: v
        for k, v in data.items()
        if isinstance(k, str) and k.startswith(CENTROIDS_PREFIX)
    }


def _check_version(value: Any, name: str, what: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidInput(f"{what} of {name!r} must be an int or None, got {value!r}", field=name)


class Pin(Mapping[str, int | None]):
    """A frozen catalog state: table name → Iceberg snapshot id (None: empty table),
    plus :attr:`embeddings`, embedding model → LanceDB table version."""

    __slots__ = ("_centroids", "_embeddings", "_ids")
    _ids: dict[str, int | None]
    _embeddings: Mapping[str, int | None]
    _centroids: Mapping[str, int | None]

    def __init__(
        self,
        snapshot_ids: Mapping[str, int | None],
        embeddings: Mapping[str, int | None] | None = None,
        centroids: Mapping[str, int | None] | None = None,
    ) -> None:
        unknown = set(snapshot_ids) - set(TABLE_NAMES)
        if unknown:
            raise InvalidInput(f"unknown tables in pin: {sorted(unknown)}", field="pin")
        for name, sid in snapshot_ids.items():
            _check_version(sid, name, "snapshot id")
        versions = dict(embeddings or {})
        for model, version in versions.items():
            if not isinstance(model, str) or not model:
                raise InvalidInput(
                    f"embedding model names a non-empty string, got {model!r}", field="pin"
                )
            _check_version(version, embedding_key(model), "LanceDB table version")
        fitted = dict(centroids or {})
        for model, version in fitted.items():
            if not isinstance(model, str) or not model:
                raise InvalidInput(
                    f"a centroid key names a non-empty model, got {model!r}", field="pin"
                )
            _check_version(version, centroids_key(model), "centroid version")
        object.__setattr__(self, "_ids", {n: snapshot_ids.get(n) for n in TABLE_NAMES})
        object.__setattr__(
            self, "_embeddings", MappingProxyType({m: versions[m] for m in sorted(versions)})
        )
        object.__setattr__(
            self, "_centroids", MappingProxyType({m: fitted[m] for m in sorted(fitted)})
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Pin is immutable")

    def __getitem__(self, table: str) -> int | None:
        return self._ids[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __hash__(self) -> int:
        return hash(
            (
                tuple(self._ids.items()),
                tuple(self._embeddings.items()),
                tuple(self._centroids.items()),
            )
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Pin)
            and self._ids == other._ids
            and dict(self._embeddings) == dict(other._embeddings)
            and dict(self._centroids) == dict(other._centroids)
        )

    def __repr__(self) -> str:
        extra = ""
        if self._embeddings:
            extra += f", embeddings={dict(self._embeddings)!r}"
        if self._centroids:
            extra += f", centroids={dict(self._centroids)!r}"
        return f"Pin({self._ids!r}{extra})"

    @property
    def embeddings(self) -> Mapping[str, int | None]:
        """Embedding model → the LanceDB table version this pin reads (read-only)."""
        return self._embeddings

    @property
    def centroids(self) -> Mapping[str, int | None]:
        """Embedding model → the semantic-dedup centroid version this pin reads."""
        return self._centroids

    def with_embeddings(self, versions: Mapping[str, int | None]) -> Pin:
        """This pin plus (or with replaced) embedding versions."""
        return Pin(self._ids, {**self._embeddings, **versions}, self._centroids)

    def with_centroids(self, versions: Mapping[str, int | None]) -> Pin:
        """This pin plus (or with replaced) centroid versions."""
        return Pin(self._ids, self._embeddings, {**self._centroids, **versions})

    def to_dict(self) -> dict[str, int | None]:
        """JSON-ready flat form: ``{table: snapshot_id, "embeddings/<model>": version,
        "centroids/<model>": version}``."""
        out: dict[str, int | None] = dict(self._ids)
        out.update({embedding_key(m): v for m, v in self._embeddings.items()})
        out.update({centroids_key(m): v for m, v in self._centroids.items()})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pin:
        """Inverse of :meth:`to_dict` (tables missing from ``data`` are empty)."""
        tables, embeddings = split_pin_keys(data)
        return cls(tables, embeddings, centroid_versions(data))
