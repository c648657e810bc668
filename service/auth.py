"""Bearer-token authentication and scopes.

Tokens live in a file (JSON or YAML) that stores only their SHA-256, never the
tokens themselves::

    tokens:
      3b4c…(64 hex):   {name: curation-fleet, scopes: [write]}
      9f1e…:           {name: alice, scopes: [read, cut, eval]}

(the ``tokens:`` wrapper is optional). Scopes:

========= =========================================================================
``read``  metadata, artifacts, objects, SQL, lineage, jobs, the dashboard
``write`` ingest batches (assets, clips, latents, scores, captions, embeddings,
          tombstones, asset events, curation job records)
``cut``   start cuts, patch, pin and unpin snapshots
``admin`` implies ``read``, ``write`` and ``cut``
``eval``  see eval material (eval assets and everything derived), in every endpoint
          and through SQL; never implied by another scope
========= =========================================================================

With no tokens configured the service runs **open** (every caller has every scope,
``eval`` included) — allowed only on a loopback address: :func:`check_bind` (what the
CLI's ``serve`` and the app's startup call) refuses anything else.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalog.errors import Forbidden, InvalidInput, Unauthorized
from catalog.hashing import is_sha256

if TYPE_CHECKING:
    from service.settings import Settings

__all__ = [
    "ANONYMOUS",
    "SCOPES",
    "Authenticator",
    "Principal",
    "check_bind",
    "check_host",
    "hash_token",
    "is_loopback",
    "load_tokens",
]

SCOPES = ("read", "write", "cut", "admin", "eval")
_ADMIN_IMPLIES = frozenset({"read", "write", "cut"})


@dataclass(frozen=True)
class Principal:
    """Who is calling and what they may do."""

    name: str
    scopes: frozenset[str]

    def has(self, scope: str) -> bool:
        """Whether the caller holds ``scope`` (``admin`` implies read/write/cut)."""
        return scope in self.scopes or ("admin" in self.scopes and scope in _ADMIN_IMPLIES)

    def require(self, scope: str) -> None:
        """Raise Forbidden unless the caller holds ``scope``."""
        if not self.has(scope):
            raise Forbidden(
                f"token {self.name!r} lacks the {scope!r} scope", scope=scope, principal=self.name
            )

    @property
    def sees_eval(self) -> bool:
        """Whether eval material is visible to this caller."""
        return "eval" in self.scopes


#: The caller of an open (token-less, loopback-only) service: every scope.
ANONYMOUS = Principal("anonymous", frozenset(SCOPES))


def hash_token(token: str) -> str:
    """The SHA-256 hex digest a tokens file stores for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def load_tokens(path: str | Path) -> dict[str, Principal]:
    """Read a tokens file: SHA-256 of a token -> its principal.

    Raises:
        InvalidInput: the file is missing, unparsable, or an entry is malformed
            (unknown scope, a key that is not a SHA-256, no name).
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read tokens file {file}: {exc}", field="tokens_file") from exc
    try:
        if file.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data: Any = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # json's ValueError or any yaml.YAMLError
        raise InvalidInput(
            f"tokens file {file} does not parse: {exc}", field="tokens_file"
        ) from exc
    if isinstance(data, Mapping) and "tokens" in data:
        data = data["tokens"]
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InvalidInput(f"tokens file {file} must hold a mapping", field="tokens_file")
    return {str(key): _principal(file, key, entry) for key, entry in data.items()}


def _principal(file: Path, key: Any, entry: Any) -> Principal:
    where = f"tokens file {file}, entry {str(key)[:16]}…"
    if not is_sha256(key):
        raise InvalidInput(f"{where}: keys are SHA-256 hex digests of tokens", field="tokens_file")
    if not isinstance(entry, Mapping):
        raise InvalidInput(f"{where}: an entry is {{name, scopes}}", field="tokens_file")
    name, scopes = entry.get("name"), entry.get("scopes")
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(f"{where}: needs a non-empty name", field="tokens_file")
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise InvalidInput(f"{where}: scopes must be a list of strings", field="tokens_file")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise InvalidInput(
            f"{where}: unknown scopes {unknown}; known: {list(SCOPES)}", field="tokens_file"
        )
    return Principal(name=name, scopes=frozenset(scopes))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost`` counts, and so does an
    IPv4 loopback address mapped into IPv6, ``::ffff:127.0.0.1``, as a dual-stack
    socket reports IPv4 clients)."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_host(host: str, tokens: Mapping[str, Principal]) -> None:
    """Refuse to serve an open (token-less) API on a non-loopback address.

    Raises:
        InvalidInput: ``host`` is not loopback and no tokens are configured.
    """
    if not tokens and not is_loopback(host):
        raise InvalidInput(
            f"refusing to bind {host} without tokens: configure tokens_file "
            "(VIDLAKE_TOKENS_FILE) or bind a loopback address",
            field="host",
            host=host,
        )


def check_bind(settings: Settings) -> None:
    """What ``vidlake serve`` and the app's startup call: the tokens file (if any)
    parses, and an open API is bound to loopback only.

    Raises:
        InvalidInput: a bad tokens file, or a non-loopback ``settings.host`` without
            tokens.
    """
    tokens = load_tokens(settings.tokens_file) if settings.tokens_file is not None else {}
    check_host(settings.host, tokens)


class Authenticator:
    """Resolves an ``Authorization`` header to a :class:`Principal`.

    Args:
        tokens: SHA-256 of each token -> principal; empty means open mode.
    """

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        self._tokens = dict(tokens)

    @property
    def open(self) -> bool:
        """True when no tokens are configured (every caller is :data:`ANONYMOUS`)."""
        return not self._tokens

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller named by a ``Bearer`` header.

        Raises:
            Unauthorized: tokens are configured and the header is absent, not a
                bearer token, or names an unknown token.
        """
        if self.open:
            return ANONYMOUS
        if not authorization:
            raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        principal = self._tokens.get(hash_token(token))
        if principal is None:
            raise Unauthorized("unknown token")
        return principal
