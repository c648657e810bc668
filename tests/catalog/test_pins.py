"""Pins: Iceberg snapshot ids as the Mapping, embedding versions beside them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import Pin as ReExported
from catalog.errors import InvalidInput
from catalog.pins import Pin, embedding_key, split_pin_keys
from catalog.tables import TABLE_NAMES

ids = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))


def test_the_mapping_is_the_iceberg_tables_and_embeddings_ride_beside_it() -> None:
    assert ReExported is Pin
    pin = Pin({"clips": 5}, {"clipemb-dec": 7})
    assert list(pin) == list(TABLE_NAMES) and pin["clips"] == 5 and pin["assets"] is None
    assert dict(pin.embeddings) == {"clipemb-dec": 7}
    flat = pin.to_dict()
    assert flat["embeddings/clipemb-dec"] == 7 and set(flat) == {
        *TABLE_NAMES,
        "embeddings/clipemb-dec",
    }
    assert Pin({"clips": 5}).to_dict() == dict(Pin({"clips": 5}))  # no embeddings: no keys
    with pytest.raises(AttributeError):
        pin.x = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        pin.embeddings["other"] = 1  # type: ignore[index]


def test_equality_and_hash_cover_embedding_versions() -> None:
    a = Pin({"clips": 5}, {"m": 7})
    assert a == Pin({"clips": 5}, {"m": 7}) and hash(a) == hash(Pin({"clips": 5}, {"m": 7}))
    assert a != Pin({"clips": 5}, {"m": 8}) and a != Pin({"clips": 5})
    assert a.with_embeddings({"n": 1}).embeddings == {"m": 7, "n": 1}
    assert len({a, Pin({"clips": 5}, {"m": 8}), Pin({"clips": 5}, {"m": 7})}) == 2


@given(
    st.fixed_dictionaries({t: ids for t in TABLE_NAMES}),
    st.dictionaries(st.text(min_size=1, max_size=20), st.one_of(st.none(), st.integers(1, 2**62))),
)
def test_the_dict_form_round_trips_through_json(
    tables: dict[str, int | None], embeddings: dict[str, int | None]
) -> None:
    pin = Pin(tables, embeddings)
    back = Pin.from_dict(json.loads(json.dumps(pin.to_dict())))
    assert back == pin and back.to_dict() == pin.to_dict()
    assert split_pin_keys(pin.to_dict()) == (tables, embeddings)


def test_bad_pins_are_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown tables"):
        Pin({"nonsense": 1})
    with pytest.raises(InvalidInput, match="LanceDB table version"):
        Pin({}, {"m": "7"})  # type: ignore[dict-item]
    with pytest.raises(InvalidInput, match="non-empty"):
        Pin({}, {"": 1})
    with pytest.raises(InvalidInput):
        Pin.from_dict({embedding_key("m"): True})
