"""Hostile input on round 2's surfaces: storage status files with garbage, huge or
non-regular status files; odd drift, quality, centroid and cut-execution requests.
Each answers a 4xx naming the problem (or shows the file as unreadable), never a 5xx."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.storage_status import read_statuses
from tests.service.support import TestClient, World, assert_error, build_world, world_recipe

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


# -- REST: round 2's operations with hostile parameters -----------------------------------
HOSTILE_GETS: list[tuple[str, int, str]] = [
    ("/v1/drift/aesthetic?a=1&b=2&threshold=nan", 422, "finite"),
    ("/v1/drift/aesthetic?a=1&b=2&threshold=-inf", 422, "finite"),
    ("/v1/drift/aesthetic?a=1&b=2&threshold=1e309", 422, "finite"),
    ("/v1/drift/aesthetic?a=1&b=2&bins=0", 422, "bins"),
    ("/v1/drift/aesthetic?a=1&b=2&bins=1000000000000", 422, "bins"),
    ("/v1/drift/aesthetic?a=1%2F..%2Fx&b=%E2%98%83", 404, "1/../x"),
    ("/v1/drift/%00?a=1&b=2", 422, "filter name"),
    ("/v1/drift/'%20OR%201=1--?a=1&b=2", 422, "filter name"),
    ("/v1/drift/aesthetic?a=&b=2", 422, "query.a"),
    ("/v1/reference-slice?clips=maybe", 422, "clips"),
    ("/v1/snapshots/-1/quality", 422, "version"),
    ("/v1/snapshots/0/quality", 422, "version"),
    ("/v1/snapshots/99999999999999999999999/quality", 422, "version"),
    ("/v1/snapshots/777/quality", 404, "777"),
    ("/v1/dedup/centroids?embedding_model=m", 422, "num_clusters"),
    ("/v1/dedup/centroids?embedding_model=m&num_clusters=0", 422, "num_clusters"),
    ("/v1/dedup/centroids?embedding_model=m&num_clusters=2&cluster_size=3", 422, "exactly one"),
    ("/dashboard/drift?filter=aesthetic&a=1&b=2&threshold=nan", 422, "finite"),
    ("/dashboard/snapshots/abc", 422, "version"),
]


@pytest.mark.parametrize(("url", "status", "named"), HOSTILE_GETS)
def test_hostile_queries_get_a_4xx_naming_the_problem(
    client: TestClient, url: str, status: int, named: str
) -> None:
    error = assert_error(client.get(url), status)
    assert named in json.dumps(error), error


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"embedding_model": "m", "num_clusters": 0}, "num_clusters"),
        ({"embedding_model": "m", "num_clusters": 10**12}, "no train vectors"),
        ({"embedding_model": "nosuch", "num_clusters": 4}, "no train vectors"),
        ({"embedding_model": "../../etc", "num_clusters": 4}, "no train vectors"),
        ({"embedding_model": "m"}, "exactly one"),
        ([], "body"),
    ],
)
def test_hostile_centroid_fits_are_refused_and_fit_nothing(
    client: TestClient, body: Any, named: str
) -> None:
    error = assert_error(client.post("/v1/dedup/centroids", json=body), 422)
    assert named in json.dumps(error), error


def test_hostile_versions_and_names_are_escaped_on_the_drift_page(client: TestClient) -> None:
    hostile = '<img src=x onerror=alert(1)>"'
    page = client.get("/dashboard/drift", params={"filter": "aesthetic", "a": hostile, "b": "2"})
    assert page.status_code in (200, 404), page.text[:500]
    assert hostile not in page.text and "&lt;img src=x" in page.text
    bad = client.get(
        "/dashboard/drift", params={"filter": "<script>x</script>", "a": "1", "b": "2"}
    )
    assert 400 <= bad.status_code < 500 and "<script>x" not in bad.text


# -- a cut whose partition fails, over HTTP ---------------------------------------------
def _wait(client: TestClient, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("succeeded", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError("the cut job did not finish")


@pytest.mark.slow
def test_a_failed_partition_fails_the_job_by_name_and_a_rerun_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import materializer.partition as partition

    world = build_world(tmp_path / "world", snapshots=0)
    real, calls = partition.run_partition, []

    def flaky(shared: Any, scans: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("worker out of memory")
        return real(shared, scans)

    monkeypatch.setattr(partition, "run_partition", flaky)
    body = {"recipe": world_recipe("flaky-cut", seed=5), "executor": "local:1", "partitions": 3}
    with TestClient(create_app(world.settings(), catalog=world.catalog)) as client:
        first = client.post("/v1/snapshots", json=body)
        assert first.status_code == 202, first.text
        job = _wait(client, first.json()["id"])
        assert job["state"] == "failed", job
        assert job["error"]["code"] == "storage_error", job["error"]
        assert "partition 1 of 3" in job["error"]["message"]
        assert job["error"]["details"]["partition"] == 1
        assert client.get("/v1/snapshots").json()["count"] == 0  # nothing published
        monkeypatch.setattr(partition, "run_partition", real)
        again = client.post("/v1/snapshots", json=body)
        assert again.status_code == 202, again.text
        assert _wait(client, again.json()["id"])["state"] == "succeeded"
        assert client.get("/v1/snapshots").json()["count"] == 1


@pytest.mark.parametrize(
    "extra",
    [
        {"partitions": True},
        {"partitions": "3"},
        {"partitions": 1.5},
        {"partitions": 10**9},
        {"partitions": -1},
        {"executor": "local:0"},
        {"executor": "local:-1"},
        {"executor": "ray://"},
        {"executor": "ray://127.0.0.1:1"},
        {"executor": ["local"]},
        {"executor": "local; rm -rf /"},
    ],
)
def test_a_hostile_execution_is_refused_and_starts_no_job(
    client: TestClient, extra: dict[str, Any]
) -> None:
    body = {"recipe": world_recipe("hostile-execution", seed=5), **extra}
    error = assert_error(client.post("/v1/snapshots", json=body), 422)
    assert next(iter(extra)) in json.dumps(error), error
    assert client.get("/v1/jobs").json()["count"] == 0
