"""The CLI's two clients: every command with ``--url`` against a live server on
loopback prints what the same command prints in embedded mode."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from service.app import create_app
from tests.service.support import World, artifact_table, build_world, serve, world_recipe
from tests.service.test_cli import REPO, _vidlake


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, str]]:
    world = build_world(tmp_path_factory.mktemp("cli-client"))
    with serve(create_app(world.settings(), catalog=world.catalog)) as url:
        yield world, url


def test_both_clients_print_the_same_documents(live: tuple[World, str]) -> None:
    world, url = live
    v = str(world.versions[0])
    for args in (["snapshots"], ["show", v], ["step", v, "0"], ["diff", v, str(world.versions[1])]):
        remote = _vidlake(world.home, *args, "--json", "--url", url)
        local = _vidlake(world.home, *args, "--json")
        assert remote.returncode == local.returncode == 0, (remote.stderr, local.stderr)
        assert json.loads(remote.stdout) == json.loads(local.stdout), args


def test_cut_then_patch_over_http_render_the_new_versions(
    live: tuple[World, str], tmp_path: Path
) -> None:
    """``patch --url`` published, then crashed rendering the answer (KeyError 'phases')."""
    world, url = live
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(world_recipe("cli-client", seed=3)))
    cut = _vidlake(world.home, "cut", str(recipe), "--url", url)
    assert cut.returncode == 0 and "stream shares" in cut.stdout, cut.stderr
    v = max(world.registry.versions())
    clip = str(artifact_table(world.registry, v, "index.arrow").column("clip_id")[0])
    run = _vidlake(world.home, "patch", str(v), "--clip", clip, "--reason", "bad", "--url", url)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert f"snapshot v{v + 1}" in run.stdout and "stream shares" in run.stdout


def test_pin_and_unpin_over_http(live: tuple[World, str]) -> None:
    world, url = live
    v = str(world.versions[0])
    pinned = _vidlake(world.home, "pin", v, "--reason", "release", "--url", url, "--json")
    assert pinned.returncode == 0, pinned.stderr
    assert json.loads(pinned.stdout)["pinned"] is True
    unpinned = _vidlake(world.home, "unpin", v, "--url", url, "--json")
    assert json.loads(unpinned.stdout) == {"version": int(v), "unpinned": True}


def test_errors_exit_alike_in_both_modes(live: tuple[World, str], tmp_path: Path) -> None:
    world, url = live
    for extra in ([], ["--url", url]):
        missing = _vidlake(world.home, "show", "999", *extra)
        assert missing.returncode == 2 and "(not_found)" in missing.stderr, missing.stderr
        hostile = _vidlake(world.home, "sql", "COPY clips TO '/tmp/x.csv'", *extra)
        assert hostile.returncode == 2 and "(invalid_sql)" in hostile.stderr, hostile.stderr


def test_ctrl_c_ends_the_cli_at_once_even_with_a_job_running(tmp_path: Path) -> None:
    """An in-process job runs on a worker thread; Ctrl-C must not wait for it."""
    code = (
        "import time\n"
        "from service.cli_common import open_client\n"
        "with open_client(None, None) as client:\n"
        "    client.services.runner.submit('cut', lambda progress: time.sleep(120), {})\n"
        "    time.sleep(0.5)\n"
        "    raise KeyboardInterrupt\n"
    )
    env = {"VIDLAKE_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=90
    )
    assert run.returncode == 130 and "interrupted" in run.stderr, run.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("mode", ["embedded", "http"])
def test_patch_by_rows_and_where_in_both_modes(live: tuple[World, str], mode: str) -> None:
    world, url = live
    v = world.versions[0]
    manifest = pq.read_table(pa.BufferReader(world.registry.read_artifact(v, "manifest.parquet")))
    streams = manifest.column("stream").to_pylist()
    expect = streams.count(streams[0])
    other = next(r for r, s in enumerate(streams) if s != streams[0])
    extra = ("--url", url) if mode == "http" else ()
    run = _vidlake(
        world.home,
        "patch",
        str(v),
        "--row",
        str(other),
        "--where",
        f"stream = {streams[0]}",
        "--reason",
        "bad stream",
        "--json",
        *extra,
    )
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    made = json.loads(run.stdout)
    assert made["patch_of"] == v and made["patch"]["excluded"]["manifest_rows"] == expect + 1

    bad = _vidlake(world.home, "patch", str(v), "--where", "nosuch = 1", "--reason", "x", *extra)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr


@pytest.mark.parametrize("mode", ["embedded", "http"])
def test_ingest_embeddings_in_both_modes(
    live: tuple[World, str], mode: str, tmp_path: Path
) -> None:
    """concepts.md documents `vidlake ingest embeddings`; the CLI refused the table."""
    world, url = live
    clip = str(artifact_table(world.registry, world.versions[0], "index.arrow")["clip_id"][0])
    rows = tmp_path / "vectors.json"
    rows.write_text(json.dumps([{"clip_id": clip, "vector": [0.1, 0.2, 0.3, 0.4]}]))
    extra = ("--url", url) if mode == "http" else ()
    model = ("--model-version", f"cli-{mode}")
    first = _vidlake(world.home, "ingest", "embeddings", str(rows), *model, "--json", *extra)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["inserted"] == 1
    again = _vidlake(world.home, "ingest", "embeddings", str(rows), *model, "--json", *extra)
    assert json.loads(again.stdout)["duplicates"] == 1, again.stderr

    rows.write_text(json.dumps([{"clip_id": "f" * 64, "vector": [0.1, 0.2, 0.3, 0.4]}]))
    unknown = _vidlake(world.home, "ingest", "embeddings", str(rows), *model, *extra)
    assert unknown.returncode == 2 and "not in the catalog" in unknown.stderr, unknown.stderr
    wrong = _vidlake(world.home, "ingest", "clips", str(rows), *model, *extra)
    assert wrong.returncode == 2 and "embeddings only" in wrong.stderr, wrong.stderr


def test_weights_not_summing_to_one_warn_and_are_noted_in_the_snapshot(
    live: tuple[World, str], tmp_path: Path
) -> None:
    world, _ = live
    doc = world_recipe("notes", seed=11)
    doc["phases"][0]["weights"] = {k: 2 * v for k, v in doc["phases"][0]["weights"].items()}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(doc))

    checked = _vidlake(world.home, "validate", str(recipe), "--json")
    assert checked.returncode == 0, checked.stderr
    (warning,) = json.loads(checked.stdout)["warnings"]
    assert "weights sum to 2, not 1; normalised" in warning
    assert "warning" in checked.stderr and "sum to 2" in checked.stderr

    cut = _vidlake(world.home, "cut", str(recipe), "--json")
    assert cut.returncode == 0, cut.stderr
    assert json.loads(cut.stdout)["notes"] == [warning]
    doc["phases"][0]["weights"] = {k: v / 2 for k, v in doc["phases"][0]["weights"].items()}
    recipe.write_text(yaml.safe_dump(doc))
    quiet = _vidlake(world.home, "validate", str(recipe), "--json")
    assert json.loads(quiet.stdout)["warnings"] == [] and "warning" not in quiet.stderr


def test_ingest_reports_rows_and_throughput(live: tuple[World, str], tmp_path: Path) -> None:
    world, url = live
    clip = str(artifact_table(world.registry, world.versions[0], "index.arrow")["clip_id"][0])
    rows = tmp_path / "scores.json"
    score = {"clip_id": clip, "filter_name": "aesthetic", "filter_version": "2", "score": 6.5}
    rows.write_text(json.dumps([score]))
    run = _vidlake(world.home, "ingest", "scores", str(rows), "--url", url)
    assert run.returncode == 0, run.stderr
    assert "ingested 1 row (" in run.stderr and "into scores" in run.stderr
    assert "rows/s" in run.stderr and "MB/s" in run.stderr
    assert json.loads(run.stdout)["table"] == "scores"  # stdout stays the result
