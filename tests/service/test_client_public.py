"""``from vidlake import Client`` (issue 17, item 1): the public client, against a live
``vidlake serve`` on loopback, run where only the loader extra's packages may be
imported; what it sends on the wire; retries of an interrupted upload."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
import yaml

from service.app import create_app
from service.client import HttpClient, Unreachable
from service.settings import Settings
from tests.service.support import World, build_world, serve, world_recipe
from vidlake import Client, HashMismatch, InvalidBatch, InvalidInput, NotFound

REPO = Path(__file__).resolve().parents[2]

#: What a node with ``pip install vidlake[loader]`` lacks (torch it has, but the client
#: must not load it either).
BLOCKED = (
    "fastapi",
    "starlette",
    "uvicorn",
    "duckdb",
    "pyiceberg",
    "lancedb",
    "sqlglot",
    "typer",
    "yaml",
    "torch",
    "materializer",
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, World]]:
    world = build_world(tmp_path_factory.mktemp("public-client"))
    with serve(create_app(world.settings(), catalog=world.catalog)) as url:
        yield url, world


_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys

    BLOCKED = set(sys.argv[2].split(","))

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not installed with vidlake[loader]")
            return None

    sys.meta_path.insert(0, Block())
    from pathlib import Path
    from vidlake import Client

    url, work, recipe_text, clip = sys.argv[1], Path(sys.argv[3]), sys.argv[4], sys.argv[5]
    latent = work / "latent.bin"
    latent.write_bytes(b"latent " * 50000)
    with Client(url) as lake:
        rows = [
            {"clip_id": clip, "filter_name": "public", "filter_version": str(i), "score": 1.0}
            for i in range(7)
        ]
        done = lake.ingest("scores", rows, idempotency_key="public", chunk_rows=3)
        sha = lake.put_object(latent)
        checked = lake.validate(recipe_text)
        snap = lake.cut(recipe_text)
        table = lake.sql("SELECT count(*) AS n FROM scores WHERE filter_name = 'public'")
        out = {
            "inserted": done["inserted"],
            "chunks": len(done["chunks"]),
            "sha_ok": sha == hashlib.sha256(latent.read_bytes()).hexdigest(),
            "valid": checked["valid"],
            "version": snap["version"],
            "listed": [s["version"] for s in lake.snapshots()["data"]],
            "step": lake.step(snap["version"], 0)["count"] > 0,
            "n": table.column("n").to_pylist(),
            "leaked": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
        }
    print(json.dumps(out))
    """
)


def test_the_public_client_runs_with_the_loader_extra_alone(
    live: tuple[str, World], tmp_path: Path
) -> None:
    url, world = live
    recipe = yaml.safe_dump(world_recipe("public-client", seed=11))
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCRIPT,
            url,
            ",".join(BLOCKED),
            str(tmp_path),
            recipe,
            world.train_clips[0],
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["leaked"] == []
    assert (out["inserted"], out["chunks"], out["sha_ok"], out["valid"]) == (7, 3, True, True)
    assert out["version"] in out["listed"] and out["step"] is True
    assert out["n"] == [7]


def test_sql_answers_a_table_and_the_document(live: tuple[str, World]) -> None:
    url, _ = live
    with Client(url) as lake:
        table = lake.sql("SELECT 1 AS one, 'a' AS letter")
        assert isinstance(table, pa.Table)
        assert table.to_pylist() == [{"one": 1, "letter": "a"}]
        document = lake.sql_result("SELECT 1 AS one")
        assert document["rows"] == [[1]] and document["columns"][0]["name"] == "one"


def test_rows_go_as_arrow_in_chunks(live: tuple[str, World]) -> None:
    url, world = live
    sent: list[tuple[str, str | None, str | None]] = []

    def record(request: httpx.Request) -> None:
        sent.append(
            (
                request.url.path,
                request.headers.get("content-type"),
                request.headers.get("idempotency-key"),
            )
        )

    http = httpx.Client(base_url=url, event_hooks={"request": [record]}, timeout=60)
    rows = [
        {"clip_id": world.train_clips[2], "filter_name": "wire", "filter_version": str(i)}
        | {"score": float(i)}
        for i in range(5)
    ]
    with HttpClient(url, http=http) as client:
        done = client.ingest("scores", rows, idempotency_key="wire", chunk_rows=2)
    assert done["inserted"] == 5
    arrow = "application/vnd.apache.arrow.stream"
    assert sent == [
        ("/v1/scores", arrow, "wire.0"),
        ("/v1/scores", arrow, "wire.1"),
        ("/v1/scores", arrow, "wire.2"),
    ]


def test_rows_arrow_cannot_type_go_as_json(live: tuple[str, World]) -> None:
    url, world = live
    rows: list[dict[str, Any]] = [
        {"clip_id": world.train_clips[3], "filter_name": "mixed", "filter_version": "1"},
        {"clip_id": world.train_clips[3], "filter_name": "mixed", "filter_version": 2},
    ]
    with Client(url) as lake, pytest.raises(InvalidBatch) as refused:
        lake.ingest("scores", [{**r, "score": 1.0} for r in rows])
    # JSON's row checks name the row Arrow could not type.
    assert refused.value.details.get("row") == 1


def _flaky_server(fail_puts: int, store: dict[str, bytes]) -> httpx.MockTransport:
    state = {"puts": 0}

    def handle(request: httpx.Request) -> httpx.Response:
        sha = request.url.path.rsplit("/", 1)[-1]
        if request.method == "HEAD":
            return httpx.Response(200 if sha in store else 404)
        state["puts"] += 1
        if state["puts"] <= fail_puts:
            raise httpx.ConnectError("connection reset", request=request)
        body = request.read()
        if hashlib.sha256(body).hexdigest() != sha:
            error = {"code": "hash_mismatch", "message": "no", "details": {}}
            return httpx.Response(422, json={"error": error})
        store[sha] = body
        return httpx.Response(201, json={"sha256": sha, "size": len(body), "created": True})

    return httpx.MockTransport(handle)


def test_an_interrupted_upload_is_retried(tmp_path: Path) -> None:
    path = tmp_path / "obj.bin"
    path.write_bytes(b"payload" * 1000)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    store: dict[str, bytes] = {}
    http = httpx.Client(base_url="http://lake", transport=_flaky_server(2, store))
    with Client("http://lake", http=http) as lake:
        assert lake.put_object(path, attempts=3) == sha
    assert store[sha] == path.read_bytes()
    http = httpx.Client(base_url="http://lake", transport=_flaky_server(5, {}))
    with Client("http://lake", http=http) as lake, pytest.raises(Unreachable):
        lake.put_object(path, attempts=2)
    http = httpx.Client(base_url="http://lake", transport=_flaky_server(0, {}))
    with Client("http://lake", http=http) as lake, pytest.raises(HashMismatch):
        lake.put_object(path, sha256="0" * 64, attempts=3)  # a 4xx is not retried


def _guide_code() -> str:
    text = (REPO / "docs" / "client.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    (example,) = [b for b in blocks if "Bring your own" in text and "put_object(path)" in b]
    return str(example)


def test_the_client_guide_runs_as_written(tmp_path: Path) -> None:
    """docs/client.md's own-corpus example, against an empty lake over HTTP."""
    settings = Settings(home=tmp_path / "lake")
    with serve(create_app(settings)) as url:
        run = subprocess.run(
            [sys.executable, "-c", _guide_code()],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "VIDLAKE_URL": url, "PYTHONPATH": str(REPO)},
            timeout=240,
        )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "version 1 steps 2 samples in step 0" in run.stdout, run.stdout


def test_progress_without_rich_is_plain_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.client_transfer import ingest_chunks

    monkeypatch.setitem(sys.modules, "rich.progress", None)  # as if rich were absent
    sent: list[str | None] = []

    def send(chunk: object, key: str | None) -> dict[str, object]:
        sent.append(key)
        return {"table": "scores", "received": 2, "inserted": 2, "replayed": False}

    rows = [{"a": i} for i in range(4)]
    done = ingest_chunks(send, "scores", rows, idempotency_key="k", chunk_rows=2, progress=True)
    assert sent == ["k.0", "k.1"] and done["inserted"] == 4 and done["replayed"] is False
    assert "ingest scores: 4/4 rows" in capsys.readouterr().err


def test_put_objects_uploads_in_parallel_and_reports_the_first_failure(
    live: tuple[str, World], tmp_path: Path
) -> None:
    url, world = live
    paths = [tmp_path / f"many-{i}.bin" for i in range(12)]
    for i, path in enumerate(paths):
        path.write_bytes(f"object {i} ".encode() * 5000)
    with Client(url) as lake:
        done = lake.put_objects(paths, workers=4, progress=True)
        assert list(done) == [str(p) for p in paths]
        assert done == {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
        assert all(world.catalog.objects.exists(sha) for sha in done.values())
        with pytest.raises(NotFound):
            lake.put_objects([paths[0], tmp_path / "missing.bin"], workers=2)
        with pytest.raises(InvalidInput, match="workers"):
            lake.put_objects(paths, workers=0)


def test_a_plain_http_client_loads_no_ca_bundle() -> None:
    """Loading the CA bundle was a third of ``vidlake snapshots --url``'s start-up; a
    client of an ``http://`` server needs none, one of ``https://`` still verifies."""
    import ssl

    with Client("http://127.0.0.1:9") as plain, Client("https://lake.invalid") as tls:
        bare = plain.http._transport._pool._ssl_context  # type: ignore[attr-defined]
        full = tls.http._transport._pool._ssl_context  # type: ignore[attr-defined]
    assert bare.cert_store_stats()["x509_ca"] == 0
    assert (bare.verify_mode, bare.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert full.cert_store_stats()["x509_ca"] > 0 and full.verify_mode == ssl.CERT_REQUIRED


def test_a_cli_command_over_http_skips_httpx_own_cli() -> None:
    """httpx's command line (click, rich, pygments) is not imported by ``vidlake``'s."""
    code = (
        "import sys\n"
        "sys.argv = ['vidlake', 'snapshots', '--url', 'http://127.0.0.1:9']\n"
        "from service.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pygments', 'httpx'}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert run.stdout.strip().splitlines()[-1] == "['httpx']", run.stdout + run.stderr[-2000:]
