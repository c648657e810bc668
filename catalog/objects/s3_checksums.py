"""Which SHA-256 an S3 endpoint reports can be trusted as the content of an object.

A stored SHA-256 is only as good as the endpoint that keeps it: moto (and some
S3-compatible servers) store whatever checksum a client sends without checking it, so a
corrupt object can carry the "right" one. :func:`probe_checksums` therefore PUTs a small
body with a deliberately wrong SHA-256 to a throw-away key: only an endpoint that refuses
it (``BadDigest``, as AWS S3 does) is trusted. An endpoint that accepts it (the probe
object is deleted again), or a probe that fails in any other way (a read-only
credential), proves nothing.

Even a trusted checksum counts only when it covers the whole object
(:func:`full_object_sha256`): ``ChecksumType`` is ``FULL_OBJECT``, or, where the endpoint
reports no type, the object came from a single PUT (its ETag has no ``-N`` part count and
the value no ``-N`` suffix). A composite multipart checksum or an ETag is never taken as a
content hash.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from catalog.objects.base import log
from catalog.objects.s3_client import DIGEST_CODES

__all__ = ["b64", "full_object_sha256", "probe_checksums"]


def b64(digest: bytes) -> str:
    """A raw digest as S3's base64 checksum header value."""
    return base64.b64encode(digest).decode("ascii")


def probe_checksums(client: Any, bucket: str, key: str, url: str) -> bool:
    """PUT a small body with a wrong SHA-256 at ``key``: True only if the endpoint refuses
    it (``url`` names the store in the log)."""
    from botocore.exceptions import BotoCoreError, ClientError

    body = f"vidlake checksum probe {key}".encode()
    wrong = hashlib.sha256(body + b"!").digest()
    try:
        client.put_object(
            Bucket=bucket,
            Key=key,
            Body=body,
            IfNoneMatch="*",
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=b64(wrong),
        )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in DIGEST_CODES:
            log.info("%s checks client checksums: verify trusts its SHA-256", url)
            return True
        log.warning(
            "checksum probe on %s failed (%s): verify reads every object in full", url, code or exc
        )
        return False
    except BotoCoreError as exc:
        log.warning("checksum probe on %s failed (%s): verify reads in full", url, exc)
        return False
    log.warning(
        "%s stored a body whose SHA-256 it was told wrongly: it does not check client "
        "checksums, so verify reads every object in full",
        url,
    )
    try:
        client.delete_object(Bucket=bucket, Key=key)
    except (BotoCoreError, ClientError) as exc:  # harmless garbage; say where it is
        log.warning("could not delete the checksum probe %s: %s", key, exc)
    return False


def full_object_sha256(head: dict[str, Any]) -> str | None:
    """The hex SHA-256 of the whole object from a HeadObject response, if it has one.

    Composite (multipart) checksums and ETags never qualify (see the module docstring).
    """
    value = head.get("ChecksumSHA256")
    if not value:
        return None
    kind = head.get("ChecksumType")
    if kind is not None:
        if kind != "FULL_OBJECT":
            return None
    elif "-" in value or "-" in str(head.get("ETag", "")).strip('"'):
        return None  # no type reported: trust only a single-PUT object's checksum
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None
