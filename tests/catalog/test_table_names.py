"""The table names and the eval policy agree with the table definitions."""

from __future__ import annotations

import pytest

from catalog.errors import NotFound
from catalog.table_names import (
    EVAL_KEYS,
    INGEST_ORDER,
    SPLIT_COLUMN,
    TABLE_NAMES,
    eval_key,
)
from catalog.tables import TABLES


def test_every_table_is_named_once_in_each_declaration() -> None:
    assert tuple(TABLES) == TABLE_NAMES == tuple(EVAL_KEYS)
    assert sorted(INGEST_ORDER) == sorted(TABLE_NAMES)


@pytest.mark.parametrize("table", TABLE_NAMES)
def test_the_eval_key_of_each_table_is_in_its_schema(table: str) -> None:
    columns = TABLES[table].schema.column_names
    ek = eval_key(table)
    if ek is None:
        assert SPLIT_COLUMN not in columns
        return
    owner = TABLES[ek.owner].schema.column_names
    assert ek.key in columns and ek.key in owner and SPLIT_COLUMN in owner
    assert ek.carries_split(table) == (SPLIT_COLUMN in columns)


def test_an_unknown_table_is_not_found() -> None:
    with pytest.raises(NotFound, match="no table 'nope'"):
        eval_key("nope")
