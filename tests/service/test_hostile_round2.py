"""Hostile input on round 2's surfaces: storage status files with garbage, huge or
non-regular status files; odd drift, quality, centroid and cut-execution requests.
Each answers a 4xx naming the problem (or shows the file as unreadable), never a 5xx."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from service.app import create_app
from service.storage_status import read_statuses
from tests.service.support import TestClient, World

NOW = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def _upload_doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": "upload", "name": "x", "state": "running", "updated_at": NOW,
        "started_at": NOW, "files_done": 1, "files_total": 4, "bytes_done": 10,
        "bytes_total": 40, "rate_mb_s": 1.0, "failed": [],
    }  # fmt: skip
    doc.update(overrides)
    return doc


GARBAGE: dict[str, str] = {
    "failed-strings": json.dumps(_upload_doc(failed=["a", "b"])),
    "failed-string": json.dumps(_upload_doc(failed="oops")),
    "failed-number": json.dumps(_upload_doc(failed=7)),
    "huge-int": json.dumps(_upload_doc(bytes_total=10**400)),
    "float-inf": json.dumps(_upload_doc())[:-1] + ', "bytes_total": 1e400}',
    "rate-nan": json.dumps(_upload_doc())[:-1] + ', "rate_mb_s": NaN}',
    "rate-inf": json.dumps(_upload_doc())[:-1] + ', "rate_mb_s": Infinity}',
    "rate-string": json.dumps(_upload_doc(rate_mb_s="fast")),
    "watch-nan-poll": json.dumps({"kind": "watch", "poll_s": "nan", "updated_at": NOW}),
    "list": "[1, 2]",
    "binary": "\udcff\x00\x01",
    "deep": "[" * 100_000 + "]" * 100_000,
}


def _write_garbage(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in GARBAGE.items():
        (directory / f"upload-{name}.json").write_bytes(text.encode("utf-8", "surrogateescape"))


def test_garbage_status_files_are_reported_unreadable_or_sane(tmp_path: Path) -> None:
    _write_garbage(tmp_path)
    ops = {Path(op.path).stem.split("-", 1)[1]: op for op in read_statuses(tmp_path)}
    assert set(ops) == set(GARBAGE)  # none skipped silently
    unreadable = {n for n, op in ops.items() if op.state == "unreadable"}
    assert unreadable == set(GARBAGE) - {"rate-nan", "rate-inf", "rate-string", "watch-nan-poll"}
    assert ops["rate-nan"].rate_mb_s == ops["rate-inf"].rate_mb_s == 0.0
    for op in ops.values():
        for value in (op.rate_mb_s, op.eta_s, op.progress, op.age_s):
            assert value is None or (isinstance(value, float) and value == value), op
            assert value is None or abs(value) != float("inf"), op


def test_a_huge_status_file_is_not_read_into_memory(tmp_path: Path) -> None:
    big = tmp_path / "upload-big.json"
    with big.open("wb") as f:  # sparse: 4 GiB on paper, nothing on disk
        f.truncate(4 << 30)
    (op,) = read_statuses(tmp_path)
    assert op.state == "unreadable" and "too large" in op.error


def test_a_fifo_status_file_does_not_hang_the_reader(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "watch-pipe.json")
    (op,) = read_statuses(tmp_path)
    assert op.state == "unreadable" and "not a regular file" in op.error


def test_dashboard_and_metrics_survive_garbage_status_files(world: World, tmp_path: Path) -> None:
    directory = tmp_path / "status"
    _write_garbage(directory)
    os.mkfifo(directory / "watch-pipe.json")
    settings = world.settings(storage_status_dir=directory)
    with TestClient(create_app(settings, catalog=world.catalog)) as client:
        page = client.get("/")
        metrics = client.get("/metrics")
    assert page.status_code == 200, page.text[-2000:]
    assert metrics.status_code == 200, metrics.text[-2000:]
    assert "NaN" not in metrics.text.split("vidlake_storage_op", 1)[-1].split("\n# ", 1)[0]
