"""Listings in an S3 bucket: keys under a prefix, the named keys of a store, and the
versions and unfinished multipart uploads of one key.

Every function takes the client and bucket it works on; errors come back translated
(:func:`catalog.objects.s3_client.translate`). A store's named keys are found with one
delimited listing of its top level, so that ``objects/`` (millions of keys) is never
enumerated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from catalog.errors import InvalidInput, VidlakeError
from catalog.objects.base import OBJECTS_DIR, check_key
from catalog.objects.s3_client import guarded, translate

__all__ = ["list_under", "named_keys", "unfinished_uploads", "versions_of"]


def list_under(
    client: Any, bucket: str, prefix: str, *, delimiter: str = "", prefixes: bool = False
) -> Iterator[dict[str, Any]]:
    """Keys under ``prefix`` (``Key``, ``Size``); with ``prefixes``, the common prefixes
    of a delimited listing come as keys too (size 0)."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    if delimiter:
        kwargs["Delimiter"] = delimiter
    try:
        for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
            yield from page.get("Contents", [])
            if prefixes:
                for common in page.get("CommonPrefixes", []):
                    yield {"Key": common["Prefix"], "Size": 0}
    except VidlakeError:
        raise
    except Exception as exc:
        err = translate(exc, "list", f"s3://{bucket}/{prefix}", key=prefix)
        if err is exc:
            raise
        raise err from exc


def named_keys(client: Any, bucket: str, root: str, prefix: str) -> list[str]:
    """The valid named keys (relative to ``root``) that start with ``prefix``, sorted."""
    keys: list[str] = []
    for item in list_under(client, bucket, root, delimiter="/", prefixes=True):
        name = item["Key"][len(root) :]
        if name.endswith("/"):
            if name == f"{OBJECTS_DIR}/" or not (
                name.startswith(prefix) or prefix.startswith(name)
            ):
                continue
            sub = root + (prefix if prefix.startswith(name) else name)
            keys.extend(i["Key"][len(root) :] for i in list_under(client, bucket, sub))
        elif name.startswith(prefix):
            keys.append(name)
    return sorted(k for k in keys if _valid_key(k))


def versions_of(client: Any, bucket: str, key: str) -> list[str]:
    """Every version id (delete markers included) of exactly ``key``; none in an
    unversioned bucket."""
    pages = client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=key)
    return guarded(
        "delete",
        f"s3://{bucket}/{key}",
        lambda: [
            v["VersionId"]
            for page in pages
            for v in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
            if v["Key"] == key
        ],
        key=key,
    )


def unfinished_uploads(client: Any, bucket: str, key: str) -> list[str]:
    """The upload ids of multipart uploads of exactly ``key`` that were never finished."""
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=key)
    return guarded(
        "delete",
        f"s3://{bucket}/{key}",
        lambda: [u["UploadId"] for p in pages for u in p.get("Uploads", []) if u["Key"] == key],
        key=key,
    )


def _valid_key(key: str) -> bool:
    try:
        check_key(key)
    except InvalidInput:
        return False
    return True
