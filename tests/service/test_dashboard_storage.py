"""Live storage operations: status files written by upload/watch, read into panels on
the dashboard and into ``vidlake_storage_op_*`` gauges on ``/metrics``."""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from manifests.storage.watch import WatchStatus
from service.app import create_app
from service.storage_status import UploadStatusFile, read_statuses, status_dir, status_path
from tests.service.support import TestClient, World

HOSTILE = '<img src=x onerror="alert(1)">'


def _upload(directory: Path, name: str = "shard-7") -> UploadStatusFile:
    return UploadStatusFile(
        status_path(directory, "upload", name),
        name=name,
        source="inv.jsonl",
        store="s3://bucket/prefix",
        files_total=10,
        bytes_total=10_000_000,
        heartbeat_s=0.05,
    )


def _plant_watch(directory: Path, *, age_s: float = 0.0, state: str = "running") -> Path:
    status = WatchStatus("/data/gpu-out", "s3://bucket/live", "2026-12-01T10:00:00+00:00")
    status.name, status.state, status.poll_s = "gpu", state, 5.0
    status.files_uploaded, status.bytes_uploaded, status.files_done = 40, 40_000_000, 40
    status.backlog_files, status.backlog_bytes, status.rate_mb_s = 10, 20_000_000, 4.0
    status.failed = [{"path": "/data/gpu-out/bad.bin", "error": "changed while uploading"}]
    status.updated_at = (datetime.now(UTC) - timedelta(seconds=age_s)).isoformat()
    path = status_path(directory, "watch", "gpu")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(status)))
    return path


def test_upload_status_file_tracks_progress_and_outcome(tmp_path: Path) -> None:
    with _upload(tmp_path) as status:
        status.progress(2_000_000, 2)  # receipted before this run: not part of the rate
        time.sleep(0.02)
        status.progress(6_000_000, 6)
        time.sleep(0.15)  # the heartbeat rewrites it meanwhile
        [op] = read_statuses(tmp_path)
        assert op.state == "running" and op.kind == "upload" and op.name == "shard-7"
        assert (op.files_done, op.files_total, op.bytes_done) == (6, 10, 6_000_000)
        assert op.progress == pytest.approx(0.6) and op.rate_mb_s > 0
        assert op.eta_s == pytest.approx(4_000_000 / (op.rate_mb_s * 1e6))
        assert op.age_s is not None and op.age_s < 1.0
        failed = [{"path": "/x/a.bin", "kind": "latent", "error": "size changed"}]
        status.finish(bytes_uploaded=4_000_000, failed=failed)
    [op] = read_statuses(tmp_path)
    assert op.state == "failed" and op.failed == failed and op.eta_s is None


def test_an_interrupted_upload_is_recorded_failed(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), _upload(tmp_path):
        raise KeyboardInterrupt
    [op] = read_statuses(tmp_path)
    assert op.state == "failed" and "KeyboardInterrupt" in op.error


def test_a_silent_running_file_is_stale_and_a_broken_one_unreadable(tmp_path: Path) -> None:
    _plant_watch(tmp_path, age_s=3600)
    (tmp_path / "upload-broken.json").write_text("{not json")
    ops = {op.kind: op for op in read_statuses(tmp_path)}
    assert ops["watch"].state == "stale" and ops["watch"].eta_s is None
    assert ops["upload"].state == "unreadable" and "JSONDecodeError" in ops["upload"].error
    assert read_statuses(tmp_path / "missing") == []


def test_watch_status_reads_backlog_and_progress(tmp_path: Path) -> None:
    _plant_watch(tmp_path)
    [op] = read_statuses(tmp_path)
    assert op.live and (op.backlog_files, op.backlog_bytes) == (10, 20_000_000)
    assert op.progress == pytest.approx(40 / 50) and op.eta_s == pytest.approx(5.0)
    assert op.failed_count == 1


def test_status_path_never_leaves_the_directory(tmp_path: Path) -> None:
    path = status_path(tmp_path, "upload", "../../etc/passwd")
    assert path.parent == tmp_path and path.name == "upload-.._.._etc_passwd.json"


def _values(page: str, kind: str) -> dict[str, str]:
    card = page.split(f'data-kind="{kind}"', 1)[1].split("</article>", 1)[0]
    return dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', card))


def _gauge(text: str, name: str, kind: str, op: str) -> float:
    label = op.replace("\\", "\\\\").replace('"', '\\"')  # the exposition format's escaping
    m = re.search(rf'^{name}{{kind="{kind}",name="{re.escape(label)}"}} (\S+)$', text, re.M)
    assert m, f"{name} for {kind} {op} not in /metrics"
    return float(m.group(1))


def test_dashboard_panel_and_gauges_show_the_same_figures(world: World, tmp_path: Path) -> None:
    settings = world.settings(storage_status_dir=tmp_path / "status")
    directory = status_dir(settings)
    assert directory == tmp_path / "status"
    _plant_watch(directory)
    with _upload(directory, HOSTILE) as up:
        up.progress(0, 0)
        time.sleep(0.02)
        up.progress(5_000_000, 5)
        with TestClient(create_app(settings, catalog=world.catalog)) as client:
            page = client.get("/").text
            metrics = client.get("/metrics").text
    assert HOSTILE not in page and "&lt;img src=x" in page
    watch, upload = _values(page, "watch"), _values(page, "upload")
    assert watch["backlog_files"] == "10" and watch["failed"] == "1"
    assert float(watch["progress"]) == pytest.approx(0.8) and float(watch["eta_s"]) == 5.0
    assert "/data/gpu-out/bad.bin" in page and "changed while uploading" in page
    assert upload["bytes_done"] == "5000000" and upload["bytes_total"] == "10000000"
    assert 'aria-valuenow="50"' in page
    assert _gauge(metrics, "vidlake_storage_op_backlog_files", "watch", "gpu") == 10
    assert _gauge(metrics, "vidlake_storage_op_failed_files", "watch", "gpu") == 1
    assert _gauge(metrics, "vidlake_storage_op_running", "watch", "gpu") == 1
    assert _gauge(metrics, "vidlake_storage_op_eta_seconds", "watch", "gpu") == 5.0
    rate = _gauge(metrics, "vidlake_storage_op_rate_bytes_per_second", "upload", HOSTILE)
    assert rate == pytest.approx(float(upload["rate_mb_s"]) * 1e6)
    assert _gauge(metrics, "vidlake_storage_op_bytes_done", "upload", HOSTILE) == 5_000_000
    assert _gauge(metrics, "vidlake_storage_op_files_total", "upload", HOSTILE) == 10


def test_no_operations_says_where_status_files_go(world: World, tmp_path: Path) -> None:
    settings = world.settings(storage_status_dir=tmp_path / "none")
    with TestClient(create_app(settings, catalog=world.catalog)) as client:
        page = client.get("/").text
        metrics = client.get("/metrics").text
    assert "no storage operations" in page and str(tmp_path / "none") in page
    assert "vidlake_storage_op_running{" not in metrics


@pytest.mark.s3
def test_cli_upload_and_watch_write_into_the_status_directory(
    s3_server: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no --status-file, both commands write where the service reads
    (VIDLAKE_STORAGE_STATUS_DIR), and a finished run says so."""
    from typer.testing import CliRunner

    from catalog.hashing import sha256_file
    from manifests.storage.inventory import Inventory, InventoryEntry
    from service.cli import app
    from service.settings import get_settings

    directory = tmp_path / "status"
    monkeypatch.setenv("VIDLAKE_STORAGE_STATUS_DIR", str(directory))
    get_settings.cache_clear()
    try:
        data = tmp_path / "gpu"
        data.mkdir()
        blobs = [data / f"h{i}.bin" for i in range(3)]
        for i, blob in enumerate(blobs):
            blob.write_bytes(bytes([i]) * (1000 + i))
        entries = [InventoryEntry.of("watched", b, sha256=sha256_file(b)[0]) for b in blobs]
        inv = Inventory({"vidlake_inventory": 1}, tuple(entries)).write(tmp_path / "inv.jsonl")
        s3 = ["--bucket", s3_bucket, "--prefix", "st", "--endpoint-url", s3_server]
        rdir = ["--receipts-dir", str(tmp_path / "r")]
        runner = CliRunner()
        up = runner.invoke(
            app, ["storage", "upload", str(inv), "--name", "n1", *rdir, *s3, "--json"]
        )
        assert up.exit_code == 0, up.output
        (data / "h0.bin.done").write_text("")
        args = ["storage", "watch", str(data), "--name", "gpu", *rdir, *s3, "--json"]
        watch = runner.invoke(app, [*args, "--passes", "1", "--poll-seconds", "0"])
        assert watch.exit_code == 0, watch.output
    finally:
        get_settings.cache_clear()
    ops = {op.kind: op for op in read_statuses(directory)}
    assert ops["upload"].state == "done" and ops["upload"].name == "n1"
    assert (ops["upload"].files_done, ops["upload"].bytes_total) == (3, 3003)
    assert ops["upload"].progress == 1.0
    assert ops["watch"].state == "stopped" and ops["watch"].name == "gpu"
    # its own receipts: the marked file went up, the two others wait to be stable
    assert ops["watch"].files_done == 1 and ops["watch"].backlog_files == 2


def test_an_unwritable_status_file_never_stops_the_upload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # the status directory's place is taken by a file
    with _upload(blocker) as status:
        status.progress(1, 1)
        status.finish(bytes_uploaded=1, failed=[])
    assert status.doc["state"] == "done"
    assert sum("cannot write the status file" in r.message for r in caplog.records) == 1
