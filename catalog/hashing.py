"""SHA-256 helpers shared by the object store, the catalog and the loader."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

__all__ = ["CHUNK", "is_sha256", "require_sha256", "sha256_bytes", "sha256_file"]

CHUNK = 8 * 1024 * 1024
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(value: object) -> bool:
    """True for a lowercase 64-character hex string."""
    return isinstance(value, str) and _HEX64.match(value) is not None


def require_sha256(value: object, what: str = "sha256") -> str:
    """Return ``value`` if it is a lowercase 64-hex SHA-256, else raise InvalidInput."""
    from catalog.errors import InvalidInput

    if not is_sha256(value):
        raise InvalidInput(f"{what} must be 64 lowercase hex characters, got {value!r}", field=what)
    return value  # type: ignore[return-value]


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> tuple[str, int]:
    """Hash a file; return (hex digest, size)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n
