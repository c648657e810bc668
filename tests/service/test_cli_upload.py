"""``vidlake upload``: files into the object store, over ``--url`` and embedded, each
file's SHA-256 printed; a bad path or a read-only token is a clean exit 2."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.app import create_app
from tests.service.support import World, build_world, serve, write_tokens
from tests.service.test_cli import _vidlake


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, str]]:
    world = build_world(tmp_path_factory.mktemp("cli-upload"))
    tokens = write_tokens(world.home / "tokens.json")
    with serve(create_app(world.settings(tokens_file=tokens), catalog=world.catalog)) as url:
        yield world, url


def _files(directory: Path, tag: str) -> list[Path]:
    paths = [directory / f"{tag}-{i}.bin" for i in range(2)]
    for i, path in enumerate(paths):
        path.write_bytes(f"{tag} latent {i}".encode() * 1000)
    return paths


def test_upload_over_http_and_embedded(live: tuple[World, str], tmp_path: Path) -> None:
    world, url = live
    for mode, extra in (("http", ["--url", url, "--token", "tok-write"]), ("local", [])):
        paths = _files(tmp_path, mode)
        run = _vidlake(world.home, "upload", *map(str, paths), "--json", *extra)
        assert run.returncode == 0, run.stderr
        printed = json.loads(run.stdout)
        expected = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
        assert [d["sha256"] for d in printed] == expected
        assert [world.catalog.objects.get(sha) for sha in expected] == [
            p.read_bytes() for p in paths
        ]
        plain = _vidlake(world.home, "upload", str(paths[0]), *extra)
        assert plain.returncode == 0 and expected[0] in plain.stdout, plain.stderr


def test_upload_errors_exit_2(live: tuple[World, str], tmp_path: Path) -> None:
    world, url = live
    missing = _vidlake(world.home, "upload", str(tmp_path / "nope.bin"), "--url", url)
    assert missing.returncode == 2 and "not found" in missing.stderr, missing.stderr
    (path,) = _files(tmp_path, "ro")[:1]
    refused = _vidlake(world.home, "upload", str(path), "--url", url, "--token", "tok-read")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert not world.catalog.objects.exists(hashlib.sha256(path.read_bytes()).hexdigest())
