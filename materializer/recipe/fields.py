"""The recipe's field types and the validators they share.

Names and labels take their shapes from :mod:`catalog.names`, so ingest rejects a row
whose name no recipe could spell. A validator that objects to a nested field raises
:func:`fail` with a ``subpath``; :mod:`materializer.recipe.load` appends it to
pydantic's location, so an error's ``path`` names the field
(``phases[1].weights.web``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer
from pydantic_core import PydanticCustomError

from catalog.names import LABEL, NAME, VERSION_MAX_LENGTH

__all__ = [
    "Aspect",
    "Distance",
    "Finite",
    "FrozenMap",
    "Label",
    "Model",
    "Name",
    "PosInt",
    "Predicate",
    "Version",
    "check_unique",
    "fail",
    "no_negative_zero",
    "ratio",
    "unknown",
    "whole_number",
]

K = TypeVar("K")
V = TypeVar("V")


def fail(subpath: str, message: str) -> PydanticCustomError:
    """A validation error about ``subpath`` below the field being validated."""
    # ``subpath`` is appended to pydantic's location, so a nested validator can name
    # the field it objects to without knowing where its model sits in the recipe.
    return PydanticCustomError("recipe", message, {"subpath": subpath})


def _freeze(value: Mapping[K, V]) -> Mapping[K, V]:
    return MappingProxyType(dict(value))


def _version(value: Any) -> Any:
    if isinstance(value, bool):
        return value  # rejected by the str type below
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        raise fail("", "quote versions: YAML reads 1.10 as the number 1.1")
    return value


def no_negative_zero(value: float) -> float:
    """``value`` with ``-0.0`` as ``0.0``."""
    return value + 0.0  # -0.0 and 0.0 must not hash differently


def _aspect(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        raise fail("", "quote aspect ratios: YAML reads an unquoted 16:9 as the number 969")
    if not isinstance(value, str) or not (m := re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", value)):
        raise fail("", f"aspect ratio must be a 'W:H' string such as '16:9', got {value!r}")
    w, h = int(m.group(1)), int(m.group(2))
    if w == 0 or h == 0:
        raise fail("", f"aspect ratio {value!r} has a zero side")
    g = math.gcd(w, h)
    return f"{w // g}:{h // g}"


def whole_number(value: Any) -> Any:
    """A whole float as an int (YAML writes large budgets as 2.0e+9)."""
    # YAML writes large budgets as 2.0e+9; accept whole floats, keep ints exact.
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# The shapes of names are the catalog's (catalog.names): ingest rejects a row whose
# name no recipe could spell.
Name = Annotated[str, Field(strict=True, pattern=NAME)]
Label = Annotated[str, Field(strict=True, pattern=LABEL)]
Version = Annotated[
    str,
    BeforeValidator(_version),
    Field(strict=True, min_length=1, max_length=VERSION_MAX_LENGTH),
]
Predicate = Annotated[str, Field(strict=True, min_length=1)]
PosInt = Annotated[int, Field(strict=True, gt=0, lt=2**63)]
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False), AfterValidator(no_negative_zero)]
Distance = Annotated[float, Field(strict=True, gt=0, lt=1), AfterValidator(no_negative_zero)]
Aspect = Annotated[str, BeforeValidator(_aspect)]
FrozenMap = Annotated[Mapping[K, V], AfterValidator(_freeze), PlainSerializer(dict)]


class Model(BaseModel):
    """Frozen, no unknown keys, no NaN or infinity: a recipe is a recorded fact."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def check_unique(values: Any, field: str, *, by_name: bool = False) -> None:
    """Fail on the first repeated value of ``field`` (at ``field[i].name`` when ``by_name``)."""
    seen: dict[Any, int] = {}
    for i, v in enumerate(values):
        if v in seen:
            where = f"{field}[{i}].name" if by_name else f"{field}[{i}]"
            raise fail(where, f"duplicate {v!r} (first at index {seen[v]})")
        seen[v] = i


def unknown(what: str, name: str, known: Any) -> str:
    """The message for a reference to an undeclared ``what``."""
    names = ", ".join(repr(k) for k in known) or "none"
    return f"unknown {what} {name!r} (declared: {names})"


def ratio(aspect: str) -> float:
    """``W / H`` of a canonical ``'W:H'`` aspect ratio."""
    w, h = aspect.split(":")
    return int(w) / int(h)
