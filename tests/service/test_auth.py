"""Auth: the scope matrix (401 without or with an unknown token, 403 without the
scope), eval material gated by the ``eval`` scope (SQL and lineage included), and
the refusal to serve an open API off loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from catalog.errors import InvalidInput
from service.app import create_app
from service.auth import (
    Authenticator,
    check_bind,
    check_host,
    hash_token,
    is_loopback,
    load_tokens,
)
from tests.service.support import (
    TOKENS,
    TestClient,
    World,
    assert_error,
    bearer,
    publish_fake_cut,
)

# (method, path, json body, scope). Bodies are chosen so that a caller with the scope
# gets a 2xx or a 4xx other than 401/403 without changing anything.
MATRIX: list[tuple[str, str, Any, str]] = [
    ("GET", "/", None, "read"),
    ("GET", "/v1/snapshots", None, "read"),
    ("GET", "/v1/snapshots/1", None, "read"),
    ("GET", "/v1/snapshots/1/artifacts/plan.arrow", None, "read"),
    ("GET", "/v1/snapshots/1/steps/0", None, "read"),
    ("GET", "/v1/snapshots/1/diff/2", None, "read"),
    ("GET", "/v1/jobs", None, "read"),
    ("GET", "/v1/jobs/job_nope", None, "read"),
    ("GET", "/v1/lineage/clips/" + "0" * 32, None, "read"),
    ("GET", "/v1/objects/" + "0" * 64, None, "read"),
    ("POST", "/v1/sql", {"query": "SELECT 1"}, "read"),
    ("POST", "/v1/recipes:validate", {"recipe": {}}, "read"),
    ("POST", "/v1/recipes:plan", {"recipe": {}}, "read"),
    ("GET", "/v1/schemas", None, "read"),
    ("GET", "/v1/schemas/clips", None, "read"),
    ("POST", "/v1/assets", [], "write"),
    ("POST", "/v1/clips", [], "write"),
    ("POST", "/v1/latents", [], "write"),
    ("POST", "/v1/scores", [], "write"),
    ("POST", "/v1/captions", [], "write"),
    ("POST", "/v1/tombstones", [], "write"),
    ("POST", "/v1/asset-events", [], "write"),
    ("POST", "/v1/jobs", [], "write"),
    ("POST", "/v1/embeddings", [], "write"),
    ("POST", "/v1/snapshots", {"recipe": {}}, "cut"),
    ("POST", "/v1/snapshots/1/patch", {"reason": "x"}, "cut"),
    ("POST", "/v1/snapshots/999/pin", {"reason": "x"}, "cut"),
    ("DELETE", "/v1/snapshots/999/pin", None, "cut"),
    ("GET", "/v1/snapshots/1/erasure", None, "read"),
    ("GET", "/v1/erasures", None, "read"),
    ("GET", "/v1/erasures/er_" + "0" * 24, None, "read"),
    ("POST", "/v1/erasures", {"asset_id": "nope"}, "admin"),
]


def holders(scope: str) -> list[str]:
    return [
        t
        for t, scopes in TOKENS.items()
        if scope in scopes or ("admin" in scopes and scope != "eval")
    ]


@pytest.mark.parametrize(("method", "path", "body", "scope"), MATRIX)
def test_scope_matrix(authed: TestClient, method: str, path: str, body: Any, scope: str) -> None:
    def call(headers: dict[str, str]) -> Any:
        return authed.request(method, path, json=body, headers=headers)

    r = call({})
    assert_error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert_error(call(bearer("not-a-token")), 401, "unauthorized")
    assert_error(call({"Authorization": "Basic dXNlcjpwYXNz"}), 401, "unauthorized")
    for token in TOKENS:
        r = call(bearer(token))
        if token in holders(scope):
            assert r.status_code not in (401, 403), (token, r.text)
        else:
            error = assert_error(r, 403, "forbidden")
            assert error["details"]["scope"] == scope


def test_health_and_metrics_need_no_token(authed: TestClient) -> None:
    body = authed.get("/v1/health").json()
    assert body["auth"] == "tokens" and body["status"] == "ok"
    assert authed.get("/metrics").status_code == 200


def sql_rows(client: TestClient, token: str, query: str) -> list[list[Any]]:
    r = client.post("/v1/sql", json={"query": query}, headers=bearer(token))
    assert r.status_code == 200, r.text
    rows: list[list[Any]] = r.json()["rows"]
    return rows


def test_eval_rows_need_the_eval_scope_in_sql(authed: TestClient, world: World) -> None:
    eval_clips, eval_assets = set(world.eval_clips), set(world.eval_assets)
    queries = {
        "clips": "SELECT clip_id FROM clips",
        "assets": "SELECT asset_id FROM assets",
        "scores": "SELECT DISTINCT clip_id FROM scores",
        "captions": "SELECT DISTINCT clip_id FROM captions",
        "latents": "SELECT DISTINCT clip_id FROM latents",
    }
    for table, query in queries.items():
        hidden = {r[0] for r in sql_rows(authed, "tok-read", query)}
        shown = {r[0] for r in sql_rows(authed, "tok-eval", query)}
        secret = eval_assets if table == "assets" else eval_clips
        assert not hidden & secret, table
        assert secret <= shown, table
        assert shown - hidden == secret, table
    # Joins and subqueries cannot reach around the filter.
    sneaky = (
        "SELECT count(*) FROM scores s JOIN clips c USING (clip_id) "
        f"WHERE c.asset_id IN ({', '.join(repr(a) for a in sorted(eval_assets))})"
    )
    assert sql_rows(authed, "tok-read", sneaky) == [[0]]
    assert sql_rows(authed, "tok-eval", sneaky)[0][0] > 0


def test_eval_lineage_needs_the_eval_scope(authed: TestClient, world: World) -> None:
    clip = world.eval_clips[0]
    # A 404 exactly like a clip that does not exist: existence is not disclosed.
    error = assert_error(
        authed.get(f"/v1/lineage/clips/{clip}", headers=bearer("tok-read")), 404, "not_found"
    )
    missing = assert_error(
        authed.get("/v1/lineage/clips/" + "f" * 32, headers=bearer("tok-read")), 404
    )
    assert error["message"] == missing["message"].replace("f" * 32, clip)
    assert set(error["details"]) == {"clip_id"}
    body = authed.get(f"/v1/lineage/clips/{clip}", headers=bearer("tok-eval")).json()
    assert body["clip"]["split"] == "eval" and body["snapshots"] == []
    train = world.train_clips[0]
    assert authed.get(f"/v1/lineage/clips/{train}", headers=bearer("tok-read")).status_code == 200


def test_tokens_file_formats_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "tokens.yaml"
    good.write_text(f"{hash_token('s3cret')}: {{name: ci, scopes: [read, eval]}}\n")
    tokens = load_tokens(good)
    principal = Authenticator(tokens).authenticate("Bearer s3cret")
    assert principal.name == "ci" and principal.sees_eval and not principal.has("write")
    for bad in [
        "[1, 2]",
        "{not yaml",
        f"{hash_token('x')}: {{name: a, scopes: [root]}}",
        "abc: {name: a, scopes: [read]}",
        f"{hash_token('x')}: {{scopes: [read]}}",
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        with pytest.raises(InvalidInput):
            load_tokens(path)
    with pytest.raises(InvalidInput):
        load_tokens(tmp_path / "missing.json")


def test_open_mode_only_on_loopback(tmp_path: Path, world: World) -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"))
    # A dual-stack socket reports IPv4 clients mapped into IPv6.
    assert is_loopback("::ffff:127.0.0.1") and is_loopback("[::ffff:127.3.2.1]")
    assert not any(
        is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.7", "example.com", "::ffff:10.0.0.7")
    )
    check_host("127.0.0.1", {})
    with pytest.raises(InvalidInput) as info:
        check_host("0.0.0.0", {})
    assert "tokens" in info.value.message
    check_host("0.0.0.0", load_tokens(_tokens(tmp_path)))
    check_bind(world.settings())
    with pytest.raises(InvalidInput):
        check_bind(world.settings(host="0.0.0.0"))
    check_bind(world.settings(host="0.0.0.0", tokens_file=_tokens(tmp_path)))
    app = create_app(world.settings(host="0.0.0.0"), catalog=world.catalog)
    with pytest.raises(InvalidInput), TestClient(app):
        pass  # the lifespan refuses to start
    app = create_app(
        world.settings(host="0.0.0.0", tokens_file=_tokens(tmp_path)), catalog=world.catalog
    )
    with TestClient(app) as c:
        assert_error(c.get("/v1/snapshots"), 401)


def _tokens(tmp_path: Path) -> Path:
    path = tmp_path / "t.json"
    path.write_text(f'{{"{hash_token("k")}": {{"name": "k", "scopes": ["read"]}}}}')
    return path


def test_patches_record_the_token_not_the_claimed_name(authed: TestClient, world: World) -> None:
    r = authed.post(
        "/v1/snapshots/1/patch",
        json={"reason": "audit", "exclude_rows": [0], "by": "somebody-else"},
        headers=bearer("tok-cut"),
    )
    assert r.status_code == 201, r.text
    snap = authed.get(f"/v1/snapshots/{r.json()['version']}", headers=bearer("tok-read")).json()
    assert snap["patch"]["by"] == "tok-cut"


def test_a_step_holding_eval_material_needs_the_eval_scope(
    authed: TestClient, world: World, tmp_path: Path
) -> None:
    # A training cut never holds eval clips; a registry could (a foreign writer).
    broken = publish_fake_cut(world, tmp_path / "broken", seed=99, with_eval=True)
    v = broken.version
    steps = range(broken.snapshot["num_steps"])
    evals = set(world.eval_clips)
    seen = [
        authed.get(f"/v1/snapshots/{v}/steps/{s}", headers=bearer("tok-eval")).json() for s in steps
    ]
    tainted = [
        s
        for s, body in zip(steps, seen, strict=True)
        if evals & {x["clip_id"] for x in body["samples"]}
    ]
    clean = [s for s in steps if s not in tainted]
    assert tainted, "the broken cut should put an eval clip in some step"
    for s in tainted:
        r = authed.get(f"/v1/snapshots/{v}/steps/{s}", headers=bearer("tok-read"))
        assert_error(r, 403, "forbidden")
    for s in clean:
        r = authed.get(f"/v1/snapshots/{v}/steps/{s}", headers=bearer("tok-read"))
        assert r.status_code == 200


def test_artifacts_and_diffs_of_a_version_holding_eval_need_the_eval_scope(
    authed: TestClient, world: World, tmp_path: Path
) -> None:
    broken = publish_fake_cut(world, tmp_path / "tainted", seed=98, with_eval=True)
    clean = world.versions[0]
    v = broken.version
    for name in ("index.arrow", "plan.arrow", "manifest.parquet", "snapshot.json"):
        path = f"/v1/snapshots/{v}/artifacts/{name}"
        error = assert_error(authed.get(path, headers=bearer("tok-read")), 403, "forbidden")
        assert error["details"] == {"scope": "eval", "version": v}
        assert authed.get(path, headers=bearer("tok-eval")).status_code == 200
        ok = authed.get(f"/v1/snapshots/{clean}/artifacts/{name}", headers=bearer("tok-read"))
        assert ok.status_code == 200, name
    for a, b in ((clean, v), (v, clean)):
        path = f"/v1/snapshots/{a}/diff/{b}"
        assert_error(authed.get(path, headers=bearer("tok-read")), 403, "forbidden")
        added = authed.get(path, headers=bearer("tok-eval")).json()
        assert set(world.eval_clips) & set(added["clips_added"] + added["clips_removed"])
    r = authed.get(f"/v1/snapshots/{clean}/diff/{world.versions[1]}", headers=bearer("tok-read"))
    assert r.status_code == 200
