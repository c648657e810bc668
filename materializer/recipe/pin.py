"""A recipe's ``catalog_pin``: ``"latest"``, or a snapshot id for every table a cut
reads (and, optionally, a LanceDB version per embedding model read, and the
semantic-dedup centroid version, ``centroids/<model>``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import PlainSerializer, PlainValidator

from catalog.pins import CENTROIDS_PREFIX, EMBEDDINGS_PREFIX
from catalog.table_names import TABLE_NAMES
from materializer.recipe.fields import fail

__all__ = ["PIN_TABLES", "CatalogPin"]

#: Iceberg tables a cut reads; an explicit ``catalog_pin`` must name each of them.
_OPTIONAL_PIN_TABLES = ("jobs",)
PIN_TABLES = tuple(t for t in TABLE_NAMES if t not in _OPTIONAL_PIN_TABLES)


def _catalog_pin(value: Any) -> Any:
    expected = "catalog_pin is 'latest' or a mapping table -> snapshot id"
    if isinstance(value, str):
        if value != "latest":
            raise fail("", f"{expected}, got {value!r}")
        return value
    if not isinstance(value, Mapping):
        raise fail("", f"{expected}, got {type(value).__name__}")
    known = (*PIN_TABLES, *_OPTIONAL_PIN_TABLES)
    for table, snap in value.items():
        if isinstance(table, str) and table.startswith(EMBEDDINGS_PREFIX):
            _check_embedding_pin(table, snap)
            continue
        if isinstance(table, str) and table.startswith(CENTROIDS_PREFIX):
            _check_centroid_pin(table, snap)
            continue
        if table not in known:
            raise fail(f"{table}", f"unknown table {table!r} (pinnable: {', '.join(known)})")
        if snap is not None and (
            isinstance(snap, bool) or not isinstance(snap, int) or not -(2**63) <= snap < 2**63
        ):
            raise fail(
                f"{table}", f"a snapshot id is a 64-bit integer or null (empty table), got {snap!r}"
            )
    missing = [t for t in PIN_TABLES if t not in value]
    if missing:
        raise fail(
            missing[0],
            f"an explicit pin names every table a cut reads; missing {', '.join(missing)}",
        )
    return MappingProxyType({k: value[k] for k in sorted(value)})


def _check_embedding_pin(key: str, version: Any) -> None:
    if not key[len(EMBEDDINGS_PREFIX) :]:
        raise fail(key, f"{key!r} names no embedding model ('embeddings/<model version>')")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**63
    ):
        raise fail(key, f"a LanceDB table version is an integer >= 1, got {version!r}")


def _check_centroid_pin(key: str, version: Any) -> None:
    if not key[len(CENTROIDS_PREFIX) :]:
        raise fail(key, f"{key!r} names no embedding model ('centroids/<model version>')")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**63:
        raise fail(key, f"a centroid version is an integer >= 1, got {version!r}")


_PinJson = Literal["latest"] | dict[str, int | None]
CatalogPin = Annotated[
    Literal["latest"] | Mapping[str, int | None],
    # Plain: _catalog_pin checks everything, and the union would re-copy the mapping.
    PlainValidator(_catalog_pin, json_schema_input_type=_PinJson),
    PlainSerializer(lambda v: v if isinstance(v, str) else dict(v), return_type=_PinJson),
]
