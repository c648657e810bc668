"""The shapes of the names that tie catalog rows to recipes.

A recipe selects rows by name: a phase's ``rung``, a filter's ``name`` and
``version``, the caption ``version`` and ``kinds``, the ``tokenizer_version``. A row
whose name no recipe can spell is dead weight that no cut will ever select (a
``rung`` of ``wrongsha``), so the catalog rejects it at ingest with the same patterns
the recipe model validates with (:mod:`materializer.recipe` imports them from here;
the catalog never imports the materializer).

The regular expressions use ``^…$`` with end-of-text semantics, as both pydantic's
(Rust) and pyarrow's (RE2) engines read them; Python callers use :func:`matches`,
which applies them with ``re.fullmatch`` so that a trailing newline never passes.

========================= ============================== ============================
name                      pattern                        used for
========================= ============================== ============================
:data:`NAME`              ``[a-z][a-z0-9_]{0,63}``       score filter names, caption
                                                         kinds, tiers, streams
:data:`LABEL`             ``[A-Za-z0-9][A-Za-z0-9._-]*`` recipe and phase names
                          (1-128 characters)
:data:`RUNG`              ``[1-9][0-9]*p``               latent rungs (``256p``)
versions                  1-:data:`VERSION_MAX_LENGTH`   filter, caption, tokenizer
                          characters, not blank          and model versions
========================= ============================== ============================
"""

from __future__ import annotations

import re

__all__ = ["LABEL", "NAME", "RUNG", "VERSION_MAX_LENGTH", "matches", "valid_version"]

NAME = r"^[a-z][a-z0-9_]{0,63}$"
LABEL = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
RUNG = r"^[1-9][0-9]*p$"
VERSION_MAX_LENGTH = 200


def matches(pattern: str, value: object) -> bool:
    """Whether ``value`` is a string the whole of which matches ``pattern``."""
    body = pattern.removeprefix("^").removesuffix("$")
    return isinstance(value, str) and re.fullmatch(body, value) is not None


def valid_version(value: object) -> bool:
    """Whether ``value`` is a version string: 1-200 characters, not all blank."""
    return isinstance(value, str) and 0 < len(value) <= VERSION_MAX_LENGTH and bool(value.strip())
