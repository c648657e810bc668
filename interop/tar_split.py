"""A publisher's train/val split rule, applied per sample from its sidecar.

A publisher that splits by a grouping key (a match, a video, a scene) so that no group
straddles train and val writes the rule once in its manifest instead of a split per
shard::

    "split": {"key": "match_id", "method": "sha256_mod", "modulus": 100, "val_below": 2}
    "split": {"key": "match_id", "method": "list", "val": ["match-00098", …]}

``sha256_mod``: a sample is ``val`` when ``int(sha256(utf8(sidecar[key])), 16) %
modulus < val_below``; ``list``: when ``sidecar[key]`` is one of ``val``. Any other
rule, or a sample whose sidecar lacks the key, is an error: an import never guesses
"all train" (val samples trained on are an eval leak).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from catalog.errors import InvalidInput

__all__ = ["METHODS", "SplitRule", "parse_split_rule"]

METHODS = ("sha256_mod", "list")


def _bad(message: str, **details: Any) -> InvalidInput:
    return InvalidInput(message, field="manifest", **details)


@dataclass(frozen=True)
class SplitRule:
    """A parsed split rule (see the module docstring)."""

    key: str
    method: str
    modulus: int = 0
    val_below: int = 0
    val: frozenset[str] = frozenset()

    def split_of(self, sidecar: Mapping[str, Any], sample_id: str) -> str:
        """``val`` or ``train`` for one sample; InvalidInput when its sidecar lacks the key."""
        value = sidecar.get(self.key)
        if value is None or isinstance(value, (dict, list, bool)):
            raise _bad(
                f"sample {sample_id!r}: the manifest splits by {self.key!r} but its sidecar "
                f"has no {self.key!r}",
                sample_id=sample_id,
                split_key=self.key,
            )
        text = str(value)
        if self.method == "list":
            return "val" if text in self.val else "train"
        digest = int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)
        return "val" if digest % self.modulus < self.val_below else "train"


def _int(doc: Mapping[str, Any], name: str, low: int) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _bad(f"split.{name} must be an integer >= {low}, not {value!r}")
    return value


def parse_split_rule(doc: Any) -> SplitRule:
    """Parse a manifest's ``split`` object; InvalidInput when vidlake cannot apply it."""
    if not isinstance(doc, dict):
        raise _bad(f"split must be an object naming its key and method, not {doc!r}")
    key, method = doc.get("key"), doc.get("method")
    if not isinstance(key, str) or not key:
        raise _bad("split.key must name the sidecar field the split groups by")
    if method not in METHODS:
        raise _bad(
            f"split.method {method!r} is not a rule vidlake can apply (known: {list(METHODS)}); "
            "refusing to import every sample as train",
            split=doc,
        )
    if method == "list":
        val = doc.get("val")
        if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
            raise _bad("split.val must be a list of the key's val values")
        return SplitRule(key, method, val=frozenset(val))
    modulus = _int(doc, "modulus", 1)
    below = _int(doc, "val_below", 0)
    if below > modulus:
        raise _bad(f"split.val_below {below} exceeds split.modulus {modulus}")
    return SplitRule(key, method, modulus, below)
