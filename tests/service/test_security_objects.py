"""Eval isolation of ``GET|HEAD /v1/objects/{sha}`` (issue 15, item 1, objects side).

A Hypothesis property over interleavings of requests (every token, GET, HEAD and
Range) and ingests that change which objects are eval-only: an object referenced
only by eval rows is never visible without the ``eval`` scope — a 404 exactly like
a missing object — and every other object is served to every ``read`` caller."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from tests.service.support import TestClient, World, assert_error, bearer, build_world, write_tokens

READERS = {"tok-read": False, "tok-cut": False, "tok-admin": False, "tok-eval": True}
_counter = itertools.count()


@dataclass
class Model:
    """What the test knows: which splits reference each object."""

    world: World
    client: TestClient
    refs: dict[str, set[str]] = field(default_factory=dict)

    def eval_only(self, sha: str) -> bool:
        splits = self.refs.get(sha, set())
        return bool(splits) and splits == {"eval"}

    def put(self, text: str) -> str:
        return self.world.catalog.objects.put_bytes(text.encode() * 20).info.sha256

    def ingest(self, path: str, rows: list[dict[str, Any]]) -> None:
        r = self.client.post(f"/v1/{path}", json=rows, headers=bearer("tok-write"))
        assert r.status_code == 200, r.text
        assert r.json()["inserted"] == len(rows), r.text

    def latent(self, clip_id: str, sha: str) -> None:
        tokenizer = f"vae-h{next(_counter)}"
        row = {
            "clip_id": clip_id,
            "rung": "256p",
            "tokenizer_version": tokenizer,
            "format": "pt",
            "object_sha256": sha,
            "tensor_keys": ["latent"],
            "tokens": 16,
        }
        self.ingest("latents", [row])
        self.refs.setdefault(sha, set()).add(self.world.clip_split[clip_id])

    def caption(self, clip_id: str, sha: str) -> None:
        row = {
            "clip_id": clip_id,
            "caption_version": "h1",
            "kind": f"k{next(_counter)}",
            "text": "a caption",
            "text_embedding_sha256": sha,
        }
        self.ingest("captions", [row])
        self.refs.setdefault(sha, set()).add(self.world.clip_split[clip_id])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Model]:
    home = tmp_path_factory.mktemp("objects")
    world = build_world(home)
    tokens = write_tokens(home / "tokens.json")
    with TestClient(create_app(world.settings(tokens_file=tokens), catalog=world.catalog)) as c:
        m = Model(world, c)
        for clip_id, sha in world.latent_object.items():
            m.refs.setdefault(sha, set()).add(world.clip_split[clip_id])
        for version in world.versions:  # artifacts: referenced by no row
            for ref in world.registry.get(version).artifacts.values():
                m.refs.setdefault(ref.sha256, set())
        m.refs[m.put("unreferenced")] = set()
        shared = m.put("shared by a train and an eval clip")
        m.latent(world.train_clips[0], shared)
        m.latent(world.eval_clips[0], shared)
        m.caption(world.eval_clips[1], m.put("eval caption embedding"))
        m.caption(world.train_clips[1], m.put("train caption embedding"))
        yield m


def check(model: Model, token: str, sha: str, method: str) -> None:
    headers = bearer(token)
    if method == "RANGE":
        headers["Range"] = "bytes=2-5"
    r = model.client.request(
        "HEAD" if method == "HEAD" else "GET", f"/v1/objects/{sha}", headers=headers
    )
    if model.eval_only(sha) and not READERS[token]:
        assert r.status_code == 404, (token, sha, method, r.status_code)
        if method != "HEAD":
            error = assert_error(r, 404, "not_found")
            assert error["message"] == f"no object {sha}"  # exactly like a missing one
        return
    assert r.status_code == (206 if method == "RANGE" else 200), (token, method, r.text[:200])
    assert r.headers["x-vidlake-sha256"] == sha
    if method == "HEAD":
        assert r.content == b"" and int(r.headers["content-length"]) > 0
    elif method == "RANGE":
        assert len(r.content) == 4


def share(model: Model, pick: int) -> None:
    """A train row starts referencing an eval-only object: it becomes visible."""
    hidden = sorted(s for s in model.refs if model.eval_only(s))
    if hidden:
        model.latent(
            model.world.train_clips[pick % len(model.world.train_clips)], hidden[pick % len(hidden)]
        )


def new_eval(model: Model, pick: int, as_caption: bool) -> None:
    """A fresh object is served while unreferenced, and hidden once an eval row names it."""
    sha = model.put(f"fresh eval object {next(_counter)}")
    model.refs[sha] = set()
    check(model, "tok-read", sha, "GET")
    clip = model.world.eval_clips[pick % len(model.world.eval_clips)]
    (model.caption if as_caption else model.latent)(clip, sha)
    check(model, "tok-read", sha, "GET")


requests = st.tuples(
    st.just("request"),
    st.sampled_from(sorted(READERS)),
    st.integers(0, 10_000),
    st.sampled_from(["GET", "HEAD", "RANGE"]),
)
ingests = st.tuples(st.sampled_from(["share", "latent", "caption"]), st.integers(0, 10_000))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
@given(ops=st.lists(st.one_of(requests, requests, requests, ingests), min_size=1, max_size=10))
def test_no_eval_only_object_is_visible_without_eval(
    model: Model, ops: list[tuple[Any, ...]]
) -> None:
    for op in ops:
        if op[0] == "request":
            _, token, pick, method = op
            pool = sorted(model.refs)
            check(model, token, pool[pick % len(pool)], method)
        elif op[0] == "share":
            share(model, op[1])
        else:
            new_eval(model, op[1], as_caption=op[0] == "caption")
    # Every object, every reader, at the end of the sequence.
    for sha in sorted(model.refs):
        for token in READERS:
            check(model, token, sha, "HEAD")


def test_the_fixture_covers_every_kind_of_object(model: Model) -> None:
    kinds = {
        "eval-only": any(model.eval_only(s) for s in model.refs),
        "unreferenced": any(not r for r in model.refs.values()),
        "shared": any(r == {"train", "eval"} for r in model.refs.values()),
        "train": any(r == {"train"} for r in model.refs.values()),
    }
    assert all(kinds.values()), kinds


def test_the_index_is_cached_per_catalog_state(model: Model, tmp_path: Path) -> None:
    services = model.client.app.state.services  # type: ignore[attr-defined]
    index = services.eval_objects
    pin = services.pin()
    first = index.at(pin)
    assert index.at(pin) is first  # no rebuild for the same state
    new_eval(model, 0, as_caption=False)
    assert index.at(services.pin()) is not first
