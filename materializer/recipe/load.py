"""Loading a recipe from YAML, JSON, a mapping or a file into a :class:`Recipe`.

The parsers are strict: duplicate keys, YAML aliases and non-scalar keys are refused,
JSON's NaN and Infinity are not numbers, and a document is at most 1 MiB. Every
problem becomes one :class:`~catalog.errors.InvalidRecipe` whose ``path`` names the
first bad field and whose ``errors`` lists them all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from catalog.errors import InvalidRecipe
from materializer.recipe.model import Recipe

__all__ = ["load_recipe"]

_MAX_RECIPE_BYTES = 1 << 20


def load_recipe(source: Recipe | Mapping[str, Any] | str | Path) -> Recipe:
    """Load and validate a recipe.

    Args:
        source: A :class:`Recipe`; a mapping; a :class:`~pathlib.Path` to a YAML or
            JSON file; or a string holding YAML/JSON text, or naming an existing
            ``.yaml``/``.yml``/``.json`` file.

    Returns:
        The frozen, normalised recipe.

    Raises:
        InvalidRecipe: ``path`` names the first bad field ("" for the whole document);
            ``errors`` lists every problem pydantic found as ``{"path", "message"}``.
    """
    if isinstance(source, Recipe):
        return source
    data: Any = source
    looks_like_path = (
        isinstance(source, str)
        and "\n" not in source
        and source.lower().endswith((".yaml", ".yml", ".json"))
    )
    if isinstance(source, Path) or looks_like_path:
        path = Path(source)  # type: ignore[arg-type]  # a str when looks_like_path
        if not path.is_file():
            raise _invalid(f"no such recipe file: {str(source)!r}")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _invalid(f"cannot read recipe {str(source)!r}: {exc}") from None
        data = _parse_text(text)
    elif isinstance(source, str):
        data = _parse_text(source)
    if not isinstance(data, Mapping):
        raise _invalid(f"a recipe is a mapping of fields, got {type(data).__name__}")
    try:
        return Recipe.model_validate(dict(data))
    except ValidationError as exc:
        raise _translate(exc) from None
    except RecursionError:
        raise _invalid("recipe is nested too deeply") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and aliases (no silent overrides, no bombs)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "aliases are not allowed", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                raise yaml.constructor.ConstructorError(
                    None, None, "keys must be scalars", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads 2e9 as a string; accept exponent floats without a dot, as JSON does.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _parse_text(text: str) -> Any:
    if len(text.encode("utf-8", "surrogatepass")) > _MAX_RECIPE_BYTES:
        raise _invalid(f"recipe larger than {_MAX_RECIPE_BYTES} bytes")
    try:
        if text.lstrip().startswith("{"):
            # JSON first, so JSON numbers such as 1e-5 stay numbers; a YAML flow
            # mapping (also starting with "{") falls through to the YAML parser.
            try:
                return json.loads(
                    text, object_pairs_hook=_unique_pairs, parse_constant=_no_constant
                )
            except json.JSONDecodeError:
                pass
        return yaml.load(text, Loader=_StrictLoader)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        first = str(exc).strip().splitlines()
        raise _invalid(f"recipe does not parse: {' '.join(first[:3])}") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _translate(exc: ValidationError) -> InvalidRecipe:
    errors = []
    for err in exc.errors(include_url=False):
        path = _format_loc(err["loc"])
        sub = (err.get("ctx") or {}).get("subpath", "")
        if sub:
            path = f"{path}.{sub}" if path and not sub.startswith("[") else f"{path}{sub}"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        elif err["type"] == "missing":
            message = "required field is missing"
        errors.append({"path": path, "message": message})
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    text = f"{first['path']}: {first['message']}" if first["path"] else first["message"]
    return InvalidRecipe(text + more, path=first["path"], errors=errors)


def _invalid(message: str) -> InvalidRecipe:
    """An error about the whole document (it does not parse, or is not a mapping)."""
    return InvalidRecipe(message, path="", errors=[{"path": "", "message": message}])


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]" or part.startswith(("function-", "literal[", "nullable[")):
            continue  # pydantic's validator tags, not fields
        else:
            out += f".{part}" if out else str(part)
    return out
