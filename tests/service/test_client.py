"""The one :class:`service.client.Client`, run as the same suite against a live server
on loopback (:class:`HttpClient`) and in-process (:class:`LocalClient`): the same
answers, and the same error classes and codes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from catalog.errors import (
    Conflict,
    InvalidBatch,
    InvalidInput,
    InvalidRecipe,
    InvalidSQL,
    NotFound,
    StorageError,
)
from materializer.recipe import load_recipe
from service.app import create_app
from service.client import (
    INGEST_TABLES,
    Client,
    HashMismatch,
    HttpClient,
    RemoteError,
    Unreachable,
    error_from_body,
)
from service.client_local import LocalClient
from service.deps import Services
from tests.service.support import World, build_world, serve, world_recipe

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["http", "local"])
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Client, World]]:
    """A client of a fresh world (one per implementation: the suite writes to it)."""
    world = build_world(tmp_path_factory.mktemp(f"client-{request.param}"))
    if request.param == "local":
        services = Services(world.settings(), catalog=world.catalog)
        client = LocalClient(world.settings(), services=services)
        yield client, world
        client.close()
        services.close()
        return
    with serve(create_app(world.settings(), catalog=world.catalog)) as url:
        http = HttpClient(url)
        yield http, world
        http.close()


def test_snapshots_and_snapshot(pair: tuple[Client, World]) -> None:
    client, world = pair
    page = client.snapshots()
    assert [s["version"] for s in page["data"]] == sorted(world.versions, reverse=True)
    v = world.versions[0]
    assert client.snapshot(v) == world.registry.get(v).snapshot
    assert client.erasure_marks(v) == []
    with pytest.raises(NotFound) as missing:
        client.snapshot(999)
    assert missing.value.code == "not_found" and missing.value.http_status == 404
    with pytest.raises(NotFound):
        client.erasure_marks(999)


def test_ingest_rows_and_an_arrow_table(pair: tuple[Client, World]) -> None:
    client, world = pair
    clip = world.train_clips[0]
    row = {"clip_id": clip, "filter_name": "motion", "filter_version": "9", "score": 1.5}
    done = client.ingest("scores", [row])
    assert (done["table"], done["received"], done["inserted"]) == ("scores", 1, 1)
    table = pa.Table.from_pylist([{**row, "filter_version": "10"}])
    arrow = client.ingest("scores", table, idempotency_key="client-arrow")
    assert arrow["inserted"] == 1 and arrow["idempotency_key"] == "client-arrow"
    replay = client.ingest("scores", table, idempotency_key="client-arrow")
    assert replay["replayed"] is True and replay["inserted"] == 1
    with pytest.raises(InvalidBatch) as bad:
        client.ingest("scores", [{**row, "score": "high"}])
    assert bad.value.code == "invalid_batch" and bad.value.details.get("row") == 0
    with pytest.raises(InvalidInput, match="unknown table 'nosuch'"):
        client.ingest("nosuch", [row])


def test_sql_step_diff_and_lineage(pair: tuple[Client, World]) -> None:
    client, world = pair
    result = client.sql("SELECT count(*) AS n FROM clips")
    assert result["columns"][0]["name"] == "n" and result["rows"][0][0] > 0
    with pytest.raises(InvalidSQL) as hostile:
        client.sql("COPY clips TO '/tmp/x.csv'")
    assert 400 <= hostile.value.http_status < 500
    a, b = world.versions[:2]
    step = client.step(a, 0)
    assert step["step"] == 0 and step["count"] == len(step["samples"]) > 0
    with pytest.raises(NotFound):
        client.step(a, 10**6)
    diff = client.diff(a, b, max_clips=1)
    assert (diff["a"], diff["b"]) == (a, b) and len(diff["clips_added"]) <= 1
    lineage = client.lineage(step["samples"][0]["clip_id"])
    assert lineage["clip"]["clip_id"] == step["samples"][0]["clip_id"]


def test_patch_pin_and_unpin(pair: tuple[Client, World]) -> None:
    client, world = pair
    v = world.versions[-1]
    clip = client.step(v, 0)["samples"][0]["clip_id"]
    made = client.patch(v, reason="bad clip", exclude_clip_ids=[clip])
    assert made["patch_of"] == v
    assert "phases" in client.snapshot(made["version"])  # what the CLI renders
    with pytest.raises(InvalidInput):
        client.patch(v, reason="")
    pinned = client.pin(v, "release")
    assert pinned["pinned"] is True and pinned["changed"] is True
    assert client.pin(v, "release")["changed"] is False
    assert client.unpin(v)["changed"] is True
    assert client.unpin(v)["changed"] is False


def test_validate_and_cut_wait_for_the_job(pair: tuple[Client, World], tmp_path: Path) -> None:
    client, _ = pair
    path = tmp_path / "recipe.yaml"
    import yaml

    path.write_text(yaml.safe_dump(world_recipe("client-cut", seed=5)))
    recipe = load_recipe(path)
    checked = client.validate(recipe)
    assert checked["valid"] is True and checked["sha256"] == recipe.sha256()
    stages: list[str] = []
    snap = client.cut(recipe, progress=lambda stage, fraction: stages.append(stage))
    assert snap["recipe_sha256"] == recipe.sha256() and "phases" in snap
    assert stages  # the job's progress reached the caller
    assert client.cut(recipe)["version"] == snap["version"]  # the same inputs: that version
    cuts = [j for j in client.jobs()["data"] if j["kind"] == "cut"]
    assert cuts and client.job(cuts[0]["id"])["state"] == "succeeded"
    with pytest.raises(NotFound):
        client.job("nope")


def test_erase_needs_a_hard_tombstone(pair: tuple[Client, World]) -> None:
    client, world = pair
    with pytest.raises(InvalidInput) as refused:
        client.erase(world.train_assets[0])
    assert "hard tombstone" in refused.value.message
    assert client.erasures() == {"data": [], "count": 0}
    with pytest.raises(InvalidInput):
        client.erasure("not-an-erasure-id")
    with pytest.raises(NotFound):
        client.erasure("er_" + "0" * 24)


def _scores(world: World, versions: list[str]) -> list[dict[str, object]]:
    clip = world.train_clips[1]
    return [
        {"clip_id": clip, "filter_name": "chunked", "filter_version": v, "score": 0.5}
        for v in versions
    ]


def test_a_chunked_ingest_resumes_with_the_same_key(pair: tuple[Client, World]) -> None:
    client, world = pair
    tag = type(client).__name__
    rows = _scores(world, [f"{tag}-{i}" for i in range(5)])
    broken = [*rows[:4], {**rows[4], "score": "high"}]
    with pytest.raises(InvalidBatch):  # the third chunk fails: two are committed
        client.ingest("scores", broken, idempotency_key=f"resume-{tag}", chunk_rows=2)
    done = client.ingest("scores", rows, idempotency_key=f"resume-{tag}", chunk_rows=2)
    assert (done["received"], done["inserted"], done["duplicates"]) == (5, 5, 0)
    keys = [c["idempotency_key"] for c in done["chunks"]]
    assert keys == [f"resume-{tag}.0", f"resume-{tag}.1", f"resume-{tag}.2"]
    assert [c["replayed"] for c in done["chunks"]] == [True, True, False]
    again = client.ingest("scores", rows, idempotency_key=f"resume-{tag}", chunk_rows=2)
    assert again["replayed"] is True and again["inserted"] == 5
    found = client.sql_table(
        f"SELECT count(*) AS n FROM scores WHERE filter_version LIKE '{tag}-%'"
    )
    assert found.column("n").to_pylist() == [5]
    with pytest.raises(InvalidInput, match="chunk_rows"):
        client.ingest("scores", rows, chunk_rows=0)
    with pytest.raises(InvalidInput, match="cannot ingest a int"):
        client.ingest("scores", 5)


def test_a_pandas_frame_is_a_batch(pair: tuple[Client, World]) -> None:
    pd = pytest.importorskip("pandas")
    client, world = pair
    frame = pd.DataFrame(_scores(world, [f"{type(client).__name__}-pd-{i}" for i in range(3)]))
    assert client.ingest("scores", frame, chunk_rows=2)["inserted"] == 3


def test_put_object_uploads_once_and_verifies(pair: tuple[Client, World], tmp_path: Path) -> None:
    client, world = pair
    path = tmp_path / "latent.bin"
    path.write_bytes(os.urandom(3 << 20))  # several 1 MiB reads
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert not client.has_object(expected)
    assert client.put_object(path, progress=True) == expected
    assert client.has_object(expected)
    assert world.catalog.objects.get(expected) == path.read_bytes()
    assert client.put_object(path) == expected  # present: skipped
    other = tmp_path / "other.bin"
    other.write_bytes(b"not the bytes of that hash")
    claimed = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(HashMismatch) as wrong:
        client.put_object(other, sha256=claimed)
    assert wrong.value.code == "hash_mismatch" and wrong.value.http_status == 422
    assert not client.has_object(claimed)
    assert not client.has_object(hashlib.sha256(other.read_bytes()).hexdigest())
    with pytest.raises(NotFound):
        client.put_object(tmp_path / "missing.bin")


def test_recipes_as_text_files_and_mappings(pair: tuple[Client, World], tmp_path: Path) -> None:
    client, _ = pair
    import yaml

    document = world_recipe("client-forms", seed=7)
    path = tmp_path / "forms.yaml"
    path.write_text(yaml.safe_dump(document))
    sha = load_recipe(path).sha256()
    for form in (document, path, str(path), yaml.safe_dump(document)):
        assert client.validate(form)["sha256"] == sha, form
    with pytest.raises(InvalidRecipe, match="cannot read recipe"):
        client.validate(tmp_path / "missing.yaml")
    snap = client.cut(str(path), progress=True)
    assert snap["recipe_sha256"] == sha


def test_sql_as_an_arrow_table(pair: tuple[Client, World]) -> None:
    client, _ = pair
    table = client.sql_table("SELECT count(*) AS n FROM clips", limit=5)
    assert isinstance(table, pa.Table) and table.column_names == ["n"]
    assert (
        table.column("n").to_pylist()[0]
        == client.sql("SELECT count(*) AS n FROM clips")["rows"][0][0]
    )
    with pytest.raises(InvalidSQL):
        client.sql_table("COPY clips TO '/tmp/x.csv'")


# -- the HTTP side alone ------------------------------------------------------------------
def test_an_unreachable_server_is_one_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unreachable) as down:
        HttpClient(f"http://127.0.0.1:{port}", timeout=2.0).snapshots()
    assert "cannot reach" in down.value.message and down.value.http_status >= 500


def test_error_bodies_become_the_error_classes() -> None:
    body = {"error": {"code": "storage_error", "message": "s3 down", "details": {"code": "X"}}}
    exc = error_from_body(502, body, "fallback")
    assert isinstance(exc, StorageError)
    assert (exc.code, exc.message, exc.details) == ("storage_error", "s3 down", {"code": "X"})
    assert exc.to_dict() == body["error"]
    too_big = error_from_body(413, {"error": {"code": "payload_too_large", "message": "m"}}, "")
    assert isinstance(too_big, InvalidInput) and too_big.code == "payload_too_large"
    assert too_big.http_status == 413
    conflict = error_from_body(None, {"code": "conflict", "message": "lost"}, "job failed")
    assert isinstance(conflict, Conflict) and conflict.message == "lost"
    crashed = error_from_body(None, {"code": "internal_error", "message": "boom"}, "job failed")
    assert isinstance(crashed, RemoteError) and crashed.code == "internal_error"
    garbage = error_from_body(500, "<html>", "Internal Server Error")
    assert type(garbage) is RemoteError
    assert garbage.message == "Internal Server Error" and garbage.http_status == 500


def test_ingest_tables_are_the_catalog_tables() -> None:
    from catalog.tables import TABLES

    assert set(INGEST_TABLES) == set(TABLES)


def test_the_http_client_imports_no_server_dependency() -> None:
    code = (
        "import sys, service.client; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('fastapi', 'starlette', 'pyiceberg', 'duckdb', 'lancedb')))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert run.stdout.strip() == "[]"


def test_production_code_runs_no_test_client() -> None:
    """The CLI once served five commands through starlette's TestClient."""
    offenders = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "service").rglob("*.py"))
        if "testclient" in p.read_text().lower()
    ]
    assert offenders == []
