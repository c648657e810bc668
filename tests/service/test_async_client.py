"""``vidlake.AsyncClient`` (issue 17, item 1's async twin): the calls a pipeline makes
concurrently, run as one suite against a live ``vidlake serve`` on loopback and
in-process (httpx's ASGI transport); the same bytes on the wire as the sync client;
retries of an interrupted upload; importable with the loader extra alone."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from service.app import create_app
from service.settings import Settings
from tests.service.support import World, build_world, serve, world_recipe
from vidlake import (
    AsyncClient,
    Client,
    HashMismatch,
    InvalidInput,
    InvalidRecipe,
    InvalidSQL,
    NotFound,
    Unreachable,
)

REPO = Path(__file__).resolve().parents[2]
#: Builds a fresh AsyncClient of the world under test (one per event loop).
Connect = Callable[[], AsyncClient]


@pytest.fixture(scope="module", params=["live", "asgi"])
def lake(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Connect, World]]:
    world = build_world(tmp_path_factory.mktemp(f"async-{request.param}"))
    app = create_app(world.settings(), catalog=world.catalog)
    if request.param == "asgi":
        transport = httpx.ASGITransport(app=app)

        def in_process() -> AsyncClient:
            http = httpx.AsyncClient(base_url="http://lake", transport=transport, timeout=60)
            return AsyncClient("http://lake", http=http)

        yield in_process, world
        app.state.services.close()
        return
    with serve(app) as url:
        yield (lambda: AsyncClient(url)), world


def run(connect: Connect, body: Callable[[AsyncClient], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``body`` with a client on a fresh event loop, closing the client after."""

    async def main() -> Any:
        async with connect() as client:
            return await body(client)

    return asyncio.run(main())


def test_ingests_run_concurrently_in_chunks(lake: tuple[Connect, World]) -> None:
    connect, world = lake
    clip = world.train_clips[0]

    def rows(name: str) -> list[dict[str, Any]]:
        return [
            {"clip_id": clip, "filter_name": name, "filter_version": str(i), "score": 1.0}
            for i in range(5)
        ]

    async def body(client: AsyncClient) -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(
                client.ingest("scores", rows("conc_a"), idempotency_key="conc_a", chunk_rows=2),
                client.ingest("scores", pa.Table.from_pylist(rows("conc_b")), chunk_rows=None),
            )
        )

    a, b = run(connect, body)
    assert (a["inserted"], len(a["chunks"]), b["inserted"]) == (5, 3, 5)
    # The same key again replays every chunk: nothing twice.
    query = "SELECT count(*) AS n FROM scores WHERE filter_name = 'conc_a'"

    async def replay(client: AsyncClient) -> tuple[dict[str, Any], pa.Table]:
        again = await client.ingest(
            "scores", rows("conc_a"), idempotency_key="conc_a", chunk_rows=2
        )
        return again, await client.sql(query)

    again, counted = run(connect, replay)
    assert again["replayed"] is True and counted.column("n").to_pylist() == [5]
    with pytest.raises(InvalidInput, match="unknown table"):
        run(connect, lambda c: c.ingest("nope", rows("x")))


def test_objects_upload_in_parallel(lake: tuple[Connect, World], tmp_path: Path) -> None:
    connect, world = lake
    paths = [tmp_path / f"obj-{i}.bin" for i in range(6)]
    for i, path in enumerate(paths):
        path.write_bytes(f"async object {i} ".encode() * 20000)

    async def body(client: AsyncClient) -> tuple[dict[str, str], str, bool]:
        done = await client.put_objects(paths, workers=3)
        again = await client.put_object(paths[0])  # stored: HEAD answers, nothing sent
        return done, again, await client.has_object("0" * 64)

    done, again, absent = run(connect, body)
    assert done == {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert again == done[str(paths[0])] and absent is False
    assert all(world.catalog.objects.exists(sha) for sha in done.values())
    with pytest.raises(HashMismatch):
        run(connect, lambda c: c.put_object(paths[1], sha256="1" * 64))
    with pytest.raises(NotFound):
        run(connect, lambda c: c.put_objects([paths[0], tmp_path / "missing.bin"]))
    with pytest.raises(InvalidInput, match="workers"):
        run(connect, lambda c: c.put_objects(paths, workers=0))


def test_sql_answers_a_table_and_errors_by_class(lake: tuple[Connect, World]) -> None:
    connect, _ = lake

    async def body(client: AsyncClient) -> tuple[pa.Table, dict[str, Any]]:
        table, document = await asyncio.gather(
            client.sql("SELECT 1 AS one, 'a' AS letter"), client.sql_result("SELECT 2 AS two")
        )
        return table, document

    table, document = run(connect, body)
    assert table.to_pylist() == [{"one": 1, "letter": "a"}]
    assert document["rows"] == [[2]]
    with pytest.raises(InvalidSQL):
        run(connect, lambda c: c.sql("DROP TABLE clips"))


def test_cut_waits_for_its_job_and_versions_list(lake: tuple[Connect, World]) -> None:
    connect, world = lake
    recipe = world_recipe("async-cut", seed=5)
    stages: list[str] = []

    async def body(client: AsyncClient) -> tuple[dict[str, Any], ...]:
        checked = await client.validate(recipe)
        planned = await client.plan(recipe)
        cut = await client.cut(recipe, progress=lambda stage, _: stages.append(stage))
        page, shown = await asyncio.gather(client.snapshots(), client.snapshot(cut["version"]))
        clip = world.train_clips[0]
        return checked, planned, cut, page, shown, await client.lineage(clip)

    checked, planned, cut, page, shown, lineage = run(connect, body)
    assert checked["valid"] is True and "phases" in planned
    assert shown == cut and cut["version"] in [s["version"] for s in page["data"]]
    assert stages, "progress was never reported"
    assert lineage["clip"]["clip_id"] == world.train_clips[0]
    same = run(connect, lambda c: c.cut(recipe))  # these inputs made a version already
    assert same["version"] == cut["version"]
    with pytest.raises(NotFound):
        run(connect, lambda c: c.snapshot(999))
    with pytest.raises(NotFound):
        run(connect, lambda c: c.lineage("0" * 32))
    bad = {**recipe, "tokenizer_version": "no-such-tokenizer"}
    with pytest.raises(InvalidRecipe):
        run(connect, lambda c: c.cut(bad))


def _recorder(sent: list[tuple[str, str, dict[str, str], bytes]]) -> httpx.MockTransport:
    """A server that answers every call with an empty JSON object, recording each."""
    kept = ("content-type", "idempotency-key", "accept", "authorization")

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k in kept}
        sent.append((request.method, str(request.url), headers, request.read()))
        if request.headers.get("accept") == "application/vnd.apache.arrow.stream":
            sink = pa.BufferOutputStream()
            table = pa.table({"n": [1]})
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            return httpx.Response(200, content=sink.getvalue().to_pybytes())
        return httpx.Response(200, json={"version": 1})

    return httpx.MockTransport(handle)


def test_both_clients_send_the_same_bytes() -> None:
    rows = [{"clip_id": "c", "filter_name": "f", "filter_version": str(i)} for i in range(3)]
    recipe = world_recipe("wire", seed=1)
    sync_sent: list[tuple[str, str, dict[str, str], bytes]] = []
    async_sent: list[tuple[str, str, dict[str, str], bytes]] = []
    headers = {"Authorization": "Bearer t"}
    with Client(
        "http://lake",
        http=httpx.Client(base_url="http://lake", headers=headers, transport=_recorder(sync_sent)),
    ) as lake:
        lake.ingest("scores", rows, idempotency_key="k", chunk_rows=2)
        lake.validate(recipe)
        lake.sql("SELECT 1", snapshot=1, limit=5)
        lake.snapshots(limit=3)
        lake.lineage("clip/1")

    async def body() -> None:
        http = httpx.AsyncClient(
            base_url="http://lake", headers=headers, transport=_recorder(async_sent)
        )
        async with AsyncClient("http://lake", http=http) as lake:
            await lake.ingest("scores", rows, idempotency_key="k", chunk_rows=2)
            await lake.validate(recipe)
            await lake.sql("SELECT 1", snapshot=1, limit=5)
            await lake.snapshots(limit=3)
            await lake.lineage("clip/1")

    asyncio.run(body())
    assert async_sent == sync_sent and len(sync_sent) == 6


def test_an_interrupted_upload_is_retried(tmp_path: Path) -> None:
    path = tmp_path / "obj.bin"
    path.write_bytes(b"payload" * 3000)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()

    def server(fail_puts: int, store: dict[str, bytes]) -> httpx.MockTransport:
        state = {"puts": 0}

        async def handle(request: httpx.Request) -> httpx.Response:
            digest = request.url.path.rsplit("/", 1)[-1]
            if request.method == "HEAD":
                return httpx.Response(200 if digest in store else 404)
            state["puts"] += 1
            if state["puts"] <= fail_puts:
                raise httpx.ConnectError("connection reset", request=request)
            store[digest] = await request.aread()
            return httpx.Response(201, json={"sha256": digest, "created": True})

        return httpx.MockTransport(handle)

    async def upload(fail_puts: int, attempts: int, store: dict[str, bytes]) -> str:
        http = httpx.AsyncClient(base_url="http://lake", transport=server(fail_puts, store))
        async with AsyncClient("http://lake", http=http) as lake:
            return await lake.put_object(path, attempts=attempts)

    store: dict[str, bytes] = {}
    assert asyncio.run(upload(2, 3, store)) == sha
    assert store[sha] == path.read_bytes()
    with pytest.raises(Unreachable):
        asyncio.run(upload(5, 2, {}))


_ISOLATED = textwrap.dedent(
    """
    import sys

    BLOCKED = {"fastapi", "starlette", "uvicorn", "duckdb", "pyiceberg", "lancedb",
               "sqlglot", "typer", "yaml", "torch", "materializer"}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not installed with vidlake[loader]")
            return None

    sys.meta_path.insert(0, Block())
    from vidlake import AsyncClient
    import vidlake.async_client
    print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
    """
)


def test_the_async_client_imports_with_the_loader_extra_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _ISOLATED], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().replace("'", '"')) == []


def test_the_client_guide_async_example_runs(tmp_path: Path) -> None:
    """docs/client.md's AsyncClient example, as written, against an empty lake."""
    text = (REPO / "docs" / "client.md").read_text()
    (example,) = [
        b.split("```")[0]
        for b in text.split("```python\n")[1:]
        if "AsyncClient(" in b.split("```")[0]
    ]
    with serve(create_app(Settings(home=tmp_path / "lake"))) as url:
        done = subprocess.run(
            [sys.executable, "-c", example],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "VIDLAKE_URL": url, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "assets 0 versions 0", done.stdout
