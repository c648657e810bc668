"""The error tree keeps its machine-readable fields: ``code``, ``message`` and
``details`` are reserved, so a detail of the same name stays a detail."""

from __future__ import annotations

import pytest

from catalog.errors import InvalidBatch, NotFound, StorageError, VidlakeError


def test_a_detail_named_code_does_not_replace_the_error_code() -> None:
    err = StorageError("reading s3://b/k failed", code="AccessDenied", key="k")
    assert err.code == "storage_error"
    assert err.details == {"code": "AccessDenied", "key": "k"}
    assert err.to_dict() == {
        "code": "storage_error",
        "message": "reading s3://b/k failed",
        "details": {"code": "AccessDenied", "key": "k"},
    }


@pytest.mark.parametrize("name", ["message", "details", "http_status", "to_dict", "args"])
def test_reserved_and_class_names_stay_details(name: str) -> None:
    err = NotFound("no such clip", **{name: "shadow"})
    assert err.message == "no such clip"
    assert err.http_status == 404
    assert err.details[name] == "shadow"
    assert err.to_dict()["details"] == {name: "shadow"}
    assert str(err) == "no such clip"


def test_other_details_are_still_attributes() -> None:
    err = InvalidBatch("row 3: bad split", row=3, field="split")
    assert (err.row, err.field) == (3, "split")
    assert isinstance(err, VidlakeError)
    assert err.to_dict()["code"] == "invalid_batch"
