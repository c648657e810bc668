"""Content-addressed object stores: a local directory and S3 (see ``base`` for the contract)."""

from __future__ import annotations

from catalog.objects.base import ObjectInfo, ObjectStore, PutResult, object_key
from catalog.objects.s3_client import S3Connection

__all__ = ["ObjectInfo", "ObjectStore", "PutResult", "S3Connection", "object_key", "open_store"]


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    path_style: bool | None = None,
) -> ObjectStore:
    """Open a store from a URL.

    ``s3://bucket/prefix`` opens an S3 store (boto3's default credential chain;
    ``endpoint_url`` or ``AWS_ENDPOINT_URL`` for compatible endpoints; ``path_style``
    for path-style addressing). Anything else — ``file:///dir`` or a plain path — opens
    a local directory store, which reads the ``s3://`` objects it references through
    the same endpoint and path style.
    """
    if url.startswith("s3://"):
        from catalog.objects.s3 import S3ObjectStore

        return S3ObjectStore.from_url(url, endpoint_url=endpoint_url, path_style=path_style)
    from catalog.objects.local import LocalObjectStore

    path = url.removeprefix("file://")
    s3 = S3Connection(endpoint_url=endpoint_url, path_style=path_style)
    return LocalObjectStore(path, s3_connection=s3)
