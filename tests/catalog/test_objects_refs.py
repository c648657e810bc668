"""References to ``s3://`` objects are read through the store's own connection (its
endpoint and path style), not boto3's defaults, and S3 errors there translate like the
store's own."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest

from catalog.errors import NotFound, StorageError
from catalog.objects import open_store
from catalog.objects.base import ObjectStore
from catalog.objects.refs import ObjectRef, RefStore, put_ref, read_url_range, url_size
from catalog.objects.s3 import S3ObjectStore
from catalog.objects.s3_client import S3Connection, shared_client
from tests.fixtures.s3 import s3_client

pytestmark = pytest.mark.s3

#: Where boto3's default endpoint points in these tests: nothing listens there.
_NOWHERE = "http://127.0.0.1:9"


def _stores(tmp_path: Path, endpoint: str, bucket: str) -> list[ObjectStore]:
    local = open_store(str(tmp_path / "lake"), endpoint_url=endpoint, path_style=True)
    remote = S3ObjectStore(bucket, "lake", endpoint_url=endpoint, path_style=True)
    return [local, remote]


@pytest.mark.parametrize("kind", [0, 1], ids=["local-store", "s3-store"])
def test_s3_references_use_the_configured_endpoint(
    kind: int, s3_server: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"a shard that lives where its publisher put it " * 50
    s3_client(s3_server).put_object(Bucket=s3_bucket, Key="pub/shard-0.tar", Body=data)
    sha = hashlib.sha256(data).hexdigest()
    store = _stores(tmp_path, s3_server, s3_bucket)[kind]
    put_ref(store, ObjectRef(sha, len(data), f"s3://{s3_bucket}/pub/shard-0.tar"))
    # boto3's own default endpoint is a dead one: only the store's endpoint has the bytes.
    monkeypatch.setenv("AWS_ENDPOINT_URL", _NOWHERE)
    refs = RefStore(store)
    assert refs.get_range(sha, 7, 9) == data[7:16]
    assert refs.get(sha) == data
    assert refs.verify(sha).size == len(data)
    assert refs.download(sha, tmp_path / "copy").size == len(data)
    assert (tmp_path / "copy").read_bytes() == data
    # The connection travels with a pickled store (into DataLoader workers).
    again = pickle.loads(pickle.dumps(refs))
    assert again.get_range(sha, 0, 4) == data[:4]
    assert store.s3_connection == S3Connection(endpoint_url=s3_server, path_style=True)
    client = shared_client(store.s3_connection)
    assert client.meta.endpoint_url == s3_server
    assert client.meta.config.s3 == {"addressing_style": "path"}


def test_s3_url_reads_translate_errors(
    s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = S3Connection(endpoint_url=s3_server, path_style=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", _NOWHERE)
    with pytest.raises(NotFound) as missing:
        url_size(f"s3://{s3_bucket}/pub/absent.tar", conn)
    assert missing.value.details["url"] == f"s3://{s3_bucket}/pub/absent.tar"
    with pytest.raises(StorageError) as no_bucket:
        read_url_range("s3://no-such-bucket-here/pub/a.tar", 0, 10, conn)
    assert no_bucket.value.code == "storage_error"
    assert no_bucket.value.details["code"] == "NoSuchBucket"
