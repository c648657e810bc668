"""Crash tests of item 6: an ingester killed with SIGKILL at random moments, then rerun.

Each trial starts a child (forked from a server that has imported the catalog, so a
trial costs a fork, not an interpreter start) that reruns a fixed sequence of batches
from the one before the batch its predecessor was killed in: what an earlier child
committed is replayed, the rest appended. The last run replays every batch.
The child is killed at a random delay (or, for assets, right between the assets commit
and the events commit). Rows are never removed, so checks at the end see every copy a
killed run left: after a last uninterrupted run every batch appears exactly once and
every near-duplicate event exists exactly once.
"""

from __future__ import annotations

import collections
import multiprocessing
import random
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from tests.catalog import _crash_ingester as child

pytestmark = pytest.mark.slow

KILLS = 24
ROUNDS = 400  # more than any run reaches before its kill
MAX_DELAY_S = 0.6


@pytest.fixture(scope="module")
def ctx() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.catalog._crash_ingester"])
    return context


def _lake(root: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(root, eval_fraction=0.0)) as cat:
        cat.add_assets(child.base_assets())
        cat.add_clips(child.base_clips())


def _start(ctx: Any, mode: str, root: Path, rounds: int, first: int = 0) -> tuple[Any, Connection]:
    mine, theirs = ctx.Pipe(duplex=False)
    args = (mode, str(root), first, rounds, theirs)
    proc = ctx.Process(target=child.run, args=args, daemon=True)
    proc.start()
    theirs.close()
    return proc, mine


def _until(conn: Connection, kind: str, deadline: float) -> list[tuple[Any, ...]]:
    """Messages up to and including the first of ``kind`` (or until the deadline)."""
    seen: list[tuple[Any, ...]] = []
    while time.monotonic() < deadline and conn.poll(max(0.0, deadline - time.monotonic())):
        try:
            msg = conn.recv()
        except EOFError:
            break
        seen.append(msg)
        if msg[0] == kind:
            break
    return seen


def _kill(proc: Any, conn: Connection) -> None:
    proc.kill()
    proc.join(10)
    conn.close()


_TAG_OF = {"scores": "job_id", "captions": "job_id", "jobs": "job_id"}
_TAG_OF |= {"tombstones": "requested_by", "asset_events": "actor"}


def _copies(
    cat: VidlakeCatalog, tables: tuple[str, ...] = child.APPEND_TABLES
) -> dict[tuple[str, str], int]:
    """(table, round tag) -> rows, over the append-only tables of the child."""
    counts: dict[tuple[str, str], int] = collections.Counter()
    for table in tables:
        col = _TAG_OF[table]
        for tag in cat.scan(table, columns=[col])[col].to_pylist():
            if tag is not None:
                counts[(table, tag)] += 1
    return counts


def _check_append(cat: VidlakeCatalog, rounds: int | None) -> int:
    """No round is in a table twice; with ``rounds``, each is there exactly once."""
    copies = _copies(cat)
    for (table, tag), n in copies.items():
        assert n == len(child.append_batch(table, int(tag[1:]))), (table, tag, n)
    if rounds is not None:
        want = {(t, f"r{r}") for t in child.APPEND_TABLES for r in range(rounds)}
        assert set(copies) == want
    return len({tag for _, tag in copies})


def test_killed_appends_rerun_without_duplicates(ctx: Any, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    _lake(root)
    cat = VidlakeCatalog.open(CatalogConfig.embedded(root))  # each scan reads fresh state
    rng = random.Random(11)
    landed_unreported = resume = 0
    for _ in range(KILLS):
        proc, conn = _start(ctx, "append", root, ROUNDS, max(0, resume - 1))
        assert _until(conn, "ready", time.monotonic() + 30)[-1] == ("ready",)
        seen = _until(conn, "finished", time.monotonic() + rng.uniform(0, MAX_DELAY_S))
        _kill(proc, conn)
        assert not seen or seen[-1][0] != "finished", "ROUNDS is too small to be killed"
        resume = max([resume, *(m[1] for m in seen if m[0] == "start")])
        if seen and seen[-1][0] == "start":  # killed inside a call: did it commit?
            _, r, table = seen[-1]
            landed = _copies(cat, (table,)).get((table, f"r{r}"), 0)
            assert landed in (0, len(child.append_batch(table, r)))
            landed_unreported += landed > 0
        # (Rows are never removed: the last checks see any duplicate made before.)
    reached = _check_append(cat, None)
    proc, conn = _start(ctx, "append", root, reached)
    assert _until(conn, "finished", time.monotonic() + 120)[-1] == ("finished",)
    proc.join(10)
    _check_append(cat, reached)
    cat.close()
    print(f"{KILLS} kills, {reached} rounds, {landed_unreported} commits landed unreported")


def _links(cat: VidlakeCatalog) -> list[tuple[str, str]]:
    ev = cat.scan("asset_events", include_eval=True)
    ev = ev.filter(pc.equal(ev["event"], "near_duplicate"))
    assets = cat.scan("assets", columns=["asset_id"], include_eval=True)["asset_id"]
    assert len(assets) == len(set(assets.to_pylist()))
    pairs = zip(ev["asset_id"].to_pylist(), ev["related_asset_id"].to_pylist(), strict=True)
    return sorted(pairs)


def test_killed_asset_ingest_loses_no_events(ctx: Any, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    _lake(root)
    cat = VidlakeCatalog.open(CatalogConfig.embedded(root))
    rng = random.Random(12)
    targeted = resume = 0
    for trial in range(KILLS):
        proc, conn = _start(ctx, "assets", root, ROUNDS, max(0, resume - 1))
        assert _until(conn, "ready", time.monotonic() + 30)[-1] == ("ready",)
        if trial % 2 == 0:  # targeted: right after the assets commit
            seen = _until(conn, "between", time.monotonic() + 60)
            assert seen[-1][0] == "between"
            targeted += 1
        else:
            seen = _until(conn, "finished", time.monotonic() + rng.uniform(0, 2 * MAX_DELAY_S))
        _kill(proc, conn)
        resume = max([resume, *(m[1] for m in seen if m[0] == "start")])
        if trial % 8 == 7:  # (rows are never removed: the last check sees every copy)
            links = _links(cat)
            assert len(links) == len(set(links)), "an event was recorded twice"
    ids = set(cat.scan("assets", columns=["asset_id"], include_eval=True)["asset_id"].to_pylist())
    reached = max(r + 1 for r in range(ROUNDS) if child.sha(f"copy-{r}-0") in ids)
    proc, conn = _start(ctx, "assets", root, reached)
    assert _until(conn, "finished", time.monotonic() + 120)[-1] == ("finished",)
    proc.join(10)
    assert _links(cat) == child.expected_links(reached)
    cat.close()
    assert targeted >= KILLS // 2
    print(f"{KILLS} kills ({targeted} between the commits), {reached} rounds")
