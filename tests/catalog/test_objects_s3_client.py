"""The one botocore translator and the one client factory (no server needed)."""

from __future__ import annotations

import pickle

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from catalog.errors import ChecksumMismatch, Conflict, InvalidInput, NotFound, StorageError
from catalog.objects.s3_client import (
    KeyExists,
    S3Connection,
    WriteInFlight,
    guarded,
    make_client,
    split_s3_url,
    translate,
)

URL = "s3://bucket/some/key"


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": "says S3"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "PutObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("NoSuchKey", 404, NotFound),
        ("404", 404, NotFound),
        ("PreconditionFailed", 412, KeyExists),
        ("ConditionalRequestConflict", 409, WriteInFlight),
        ("BadDigest", 400, ChecksumMismatch),
        ("XAmzContentSHA256Mismatch", 400, ChecksumMismatch),
        ("AccessDenied", 403, StorageError),
        ("SlowDown", 503, StorageError),
    ],
)
def test_client_errors_translate_by_code(code: str, status: int, kind: type) -> None:
    err = translate(_client_error(code, status), "put", URL, key="some/key")
    assert type(err) is kind
    assert err.details["key"] == "some/key"  # type: ignore[attr-defined]
    if kind is StorageError:
        assert err.details["code"] == code  # type: ignore[attr-defined]
        assert err.details["status"] == status  # type: ignore[attr-defined]
        assert err.code == "storage_error"  # type: ignore[attr-defined]
    assert isinstance(err, Conflict) == (kind in (KeyExists, WriteInFlight))


def test_missing_bucket_is_a_storage_error_and_a_list_404_is_not_not_found() -> None:
    err = translate(_client_error("NoSuchBucket", 404), "get", URL)
    assert type(err) is StorageError and err.details == {"bucket": "bucket", "code": "NoSuchBucket"}
    assert type(translate(_client_error("", 404), "list", URL)) is StorageError
    assert type(translate(_client_error("", 404), "head", URL)) is NotFound


def test_connection_errors_and_others() -> None:
    down = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    assert type(translate(down, "get", URL)) is StorageError
    bug = ValueError("not botocore's")
    assert translate(bug, "get", URL) is bug
    with pytest.raises(ValueError):
        guarded("get", URL, lambda: (_ for _ in ()).throw(bug))
    with pytest.raises(KeyExists) as exists:
        guarded("put", URL, lambda: (_ for _ in ()).throw(_client_error("PreconditionFailed", 412)))
    assert isinstance(exists.value.__cause__, ClientError)
    assert guarded("get", URL, lambda: 42) == 42


def test_connection_values_and_the_factory() -> None:
    conn = S3Connection(endpoint_url="http://minio:9000", path_style=True, region_name="eu-west-1")
    assert pickle.loads(pickle.dumps(conn)) == conn
    client = make_client(conn)
    assert client.meta.endpoint_url == "http://minio:9000"
    assert client.meta.region_name == "eu-west-1"
    assert client.meta.config.s3 == {"addressing_style": "path"}
    assert client.meta.config.retries == {"total_max_attempts": 8, "mode": "standard"}
    with pytest.raises(InvalidInput):
        S3Connection(max_attempts=0)
    with pytest.raises(InvalidInput):
        S3Connection(retry_mode="legacy")  # type: ignore[arg-type]
    assert split_s3_url("s3://b/k/x.tar") == ("b", "k/x.tar")
    for bad in ("s3://b", "s3:///k", "http://b/k"):
        with pytest.raises(InvalidInput):
            split_s3_url(bad)
