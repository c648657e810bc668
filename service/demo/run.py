"""``vidlake demo``: the whole path on the embedded default, in a few minutes.

1. Generate a synthetic corpus into the embedded catalog (first run only).
2. Start the service on 127.0.0.1 and, through REST, cut the demo recipe as a job.
3. Train a tiny model with 2 loader ranks in separate processes, SIGKILL them mid-run,
   resume with 1 rank from the checkpointed ``state_dict``, and check that the sample
   sequence equals an uninterrupted run's.
4. Take an asset down, cut again, show the diff, a lineage SQL query and the
   forensic view of one step.
5. Say where to look next.

Each run registers new snapshot versions; the corpus is generated once per home.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.settings import Settings

if TYPE_CHECKING:
    from service.client import HttpClient

__all__ = ["run_demo"]

#: The demo's recipe ships as package data (the same text as docs/recipes/demo.yaml,
#: kept equal by a test): an installed package has no docs/ beside it.
RECIPE = resources.files("service.demo").joinpath("demo.yaml")
TRAIN_STEPS = 40
KILL_AFTER = 15
CACHE_BUDGET = 256 * 1024**2

console = Console()


def run_demo(settings: Settings, *, assets: int = 1500) -> dict[str, Any]:
    """Run the demo against ``settings`` (the embedded default unless configured)."""
    from service.client import HttpClient

    home = settings.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    console.rule("[bold]vidlake demo")
    console.print(f"home: {home}")
    lake = _demo_lake(settings)
    summary = _corpus(lake, home, assets)

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start_server(settings, port)
    try:
        http = HttpClient(url, timeout=120.0)
        console.rule("[bold]2. cut a snapshot through REST")
        snap = _cut(http)
        _print_shares(snap)

        console.rule("[bold]3. train with 2 ranks, kill, resume with 1")
        same = _train_kill_resume(url, snap["version"], home)

        console.rule("[bold]4. takedown, recut, diff, lineage, forensics")
        after = _takedown_and_recut(http, snap, summary)
        _lineage(http, snap)
    finally:
        server.should_exit = True
    console.rule("[bold]5. where to look next")
    console.print(
        "  dashboard and API:  [cyan]vidlake serve[/cyan] then open http://127.0.0.1:"
        f"{settings.port}/ (OpenAPI docs at /docs)\n"
        f"  files written:      {home} (catalog.db, warehouse/, objects/, lance/, cache/)\n"
        "  snapshots:          [cyan]vidlake snapshots[/cyan], [cyan]vidlake show N[/cyan]\n"
        "  docs:               docs/quickstart.md, docs/recipes.md, docs/loader.md"
    )
    result = {
        "versions": [snap["version"], after["version"]],
        "resume_identical": same,
        "seconds": round(time.perf_counter() - started, 1),
    }
    console.print(f"demo finished in {result['seconds']} s")
    if not same:
        raise SystemExit("the resumed sample sequence differs from the uninterrupted one")
    return result


# -- 1. corpus ---------------------------------------------------------------------------------
def _demo_lake(settings: Settings) -> Any:
    """The lake, its catalog created with the demo's fixed carve-out salt; a catalog
    that already exists keeps its own."""
    from catalog.errors import Conflict
    from service.demo.corpus import DEMO_EVAL_SALT
    from service.lake import Lake

    lake = Lake(settings, eval_salt=DEMO_EVAL_SALT)
    try:
        lake.catalog  # noqa: B018 (opens, or creates with the salt)
    except Conflict:
        return Lake(settings)
    return lake


def _corpus(lake: Any, home: Path, assets: int) -> dict[str, Any]:
    from catalog.errors import Conflict
    from service.demo.corpus import generate_corpus

    console.rule("[bold]1. synthetic corpus")
    marker = home / "demo-corpus.json"
    if marker.exists():
        summary: dict[str, Any] = json.loads(marker.read_text())
        console.print(f"corpus already present ({summary['assets']} assets); reusing it")
        return summary
    with Progress(
        TextColumn("{task.description:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bars:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=max(total, 1))
            bars.update(tasks[stage], completed=done, total=max(total, 1))

        try:
            result = generate_corpus(lake.catalog, assets=assets, seed=0, progress=progress)
        except Conflict as exc:
            raise SystemExit(
                f"{home} holds part of a demo corpus from an interrupted run ({exc.message}); "
                "run `make clean` (it removes ./.vidlake) and `make demo` again"
            ) from exc
    keys = ("assets", "clips", "latents", "scores", "captions", "eval_assets", "latent_bytes")
    summary = {key: getattr(result, key) for key in keys}
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(marker)  # the marker appears only once the corpus is complete
    table = Table("table", "rows")
    for key in ("assets", "clips", "latents", "scores", "captions", "eval_assets"):
        table.add_row(key, str(summary[key]))
    console.print(table)
    console.print(f"pinned catalog state: {lake.catalog.pin().to_dict()}")
    return summary


# -- 2. server and cut ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(settings: Settings, port: int) -> Any:
    import httpx
    import uvicorn

    from service.app import create_app

    app = create_app(settings.model_copy(update={"host": "127.0.0.1", "port": port}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="vidlake-demo-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1.0).status_code == 200:
                console.print(f"service up on http://127.0.0.1:{port}")
                return server
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the demo server did not start within 60 s")


def _cut(http: HttpClient) -> dict[str, Any]:
    from materializer.recipe import load_recipe

    with Progress(
        TextColumn("{task.description:<11}"), BarColumn(), TimeElapsedColumn(), console=console
    ) as bars:
        tasks: dict[str, Any] = {}

        def report(stage: str, fraction: float) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=1.0)
            bars.update(tasks[stage], completed=fraction)

        snap = http.cut(load_recipe(RECIPE.read_text("utf-8")), progress=report)
    if not tasks:  # no job ran: a rerun of the demo, these inputs already made a version
        console.print(
            f"these inputs (recipe, catalog state, code) already made v{snap['version']}: "
            "the service answers with it instead of cutting again"
        )
    return snap


def _print_shares(snap: dict[str, Any]) -> None:
    console.print(
        f"snapshot v{snap['version']}: {snap['counts']['samples']} samples, "
        f"{snap['num_steps']} steps, {snap['plan_rows']} plan rows"
    )
    table = Table("phase", "stream", "target", "realized")
    for phase in snap["phases"]:
        for name, target in phase["targets"].items():
            table.add_row(
                phase["name"], name, f"{target:.3f}", f"{phase['realized'].get(name, 0):.3f}"
            )
    console.print(table)
    drops = Table("dropped because", "samples")
    for reason, n in snap["drops"].items():
        drops.add_row(reason, str(n))
    console.print(drops)


# -- 3. training with a kill and an elastic resume ------------------------------------------------
def _train_rank(
    url: str, version: int, rank: int, world: int, start: int, stop: int, workdir: str
) -> None:
    """One rank: a tiny model over the latents; checkpoint after every step."""
    import torch

    from loader.dataset import SnapshotDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = SnapshotDataset(
        url,
        version,
        rank=rank,
        world_size=world,
        cache_dir=Path(workdir) / "cache",
        cache_budget_bytes=CACHE_BUDGET,
        start_step=start,
        end_step=stop,
    )
    log_path = Path(workdir) / f"rank{rank}-of-{world}.jsonl"
    with ds, open(log_path, "a") as log:
        for batch in ds:
            x = batch["latent"].float().mean(dim=(2, 3, 4))  # (b, 16) channel means
            loss = torch.nn.functional.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            state = ds.state_dict(next_step=batch["step"] + 1)
            record = {"step": batch["step"], "rows": batch["rows"].tolist(), "state": state}
            log.write(json.dumps(record) + "\n")
            log.flush()
            os.fsync(log.fileno())


def _read_log(path: Path) -> dict[int, dict[str, Any]]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line torn by the kill
            continue
        out[record["step"]] = record
    return out


def _train_kill_resume(url: str, version: int, home: Path) -> bool:
    import shutil

    workdir = home / "demo-train"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    ctx = mp.get_context("spawn")

    # The uninterrupted reference: one rank, every step.
    ref = ctx.Process(target=_train_rank, args=(url, version, 0, 1, 0, TRAIN_STEPS, str(workdir)))
    ref.start()
    ref.join()
    _check_exit(ref, "the reference run")
    reference = _read_log(workdir / "rank0-of-1.jsonl")
    (workdir / "rank0-of-1.jsonl").rename(workdir / "reference.jsonl")

    ranks = [
        ctx.Process(target=_train_rank, args=(url, version, r, 2, 0, TRAIN_STEPS, str(workdir)))
        for r in range(2)
    ]
    for p in ranks:
        p.start()
    logs = [workdir / f"rank{r}-of-2.jsonl" for r in range(2)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and min(len(_read_log(p)) for p in logs) < KILL_AFTER:
        for p in ranks:
            if not p.is_alive():
                _check_exit(p, "a training rank")
        time.sleep(0.05)
    for p in ranks:
        # On a loaded machine one rank may have finished every step already (and been
        # reaped by is_alive()); the last checkpoint both wrote still decides the resume.
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        p.join()
    done = [_read_log(p) for p in logs]
    # A checkpoint counts once every rank wrote it (the collective save of real jobs).
    common = sorted(set(done[0]) & set(done[1]))
    resume_at = common[-1] + 1
    states = {d[common[-1]]["state"]["next_step"] for d in done}
    console.print(
        f"killed both ranks (SIGKILL) after steps {max(done[0])} and {max(done[1])}; "
        f"last complete checkpoint: next_step={resume_at}"
    )
    assert states == {resume_at}

    resumed = ctx.Process(
        target=_train_rank, args=(url, version, 0, 1, resume_at, TRAIN_STEPS, str(workdir))
    )
    resumed.start()
    resumed.join()
    _check_exit(resumed, "the resumed run")
    after = _read_log(workdir / "rank0-of-1.jsonl")

    sequence = [done[0][s]["rows"] + done[1][s]["rows"] for s in range(resume_at)]
    sequence += [after[s]["rows"] for s in range(resume_at, TRAIN_STEPS)]
    expected = [reference[s]["rows"] for s in range(TRAIN_STEPS)]
    same = sequence == expected
    flat = [r for step in sequence for r in step]
    console.print(
        f"resumed with 1 rank at step {resume_at}: {len(flat)} samples over "
        f"{TRAIN_STEPS} steps; identical to the uninterrupted run: "
        + ("[green]yes[/green]" if same else "[red]NO[/red]")
    )
    return same


def _check_exit(process: Any, what: str) -> None:
    if process.exitcode not in (0, None):
        raise RuntimeError(f"{what} failed (exit code {process.exitcode}); see its traceback above")


# -- 4. takedown, recut, diff, lineage ----------------------------------------------------------
def _takedown_and_recut(
    http: HttpClient, snap: dict[str, Any], summary: dict[str, Any]
) -> dict[str, Any]:
    step = http.step(snap["version"], 0)
    asset = step["samples"][0]["asset_id"]
    http.ingest(
        "tombstones", [{"asset_id": asset, "reason": "demo: licence withdrawn", "kind": "soft"}]
    )
    console.print(f"tombstoned asset {asset[:16]}…")
    after = _cut(http)
    diff = http.diff(snap["version"], after["version"])
    console.print(
        f"v{snap['version']} → v{after['version']}: {diff['num_clips_removed']} clips removed, "
        f"{diff['num_clips_added']} added; tombstoned drops: "
        f"{after['drops'].get('tombstoned', 0)}"
    )
    return after


def _lineage(http: HttpClient, snap: dict[str, Any]) -> None:
    step = http.step(snap["version"], 3)
    sample = step["samples"][0]
    clip = sample["clip_id"]
    query = (
        "SELECT c.clip_id, a.source, a.source_tier, a.license_id, s.filter_name, "
        "s.filter_version, round(s.score, 3) AS score "
        "FROM clips c JOIN assets a USING (asset_id) JOIN scores s USING (clip_id) "
        f"WHERE c.clip_id = '{clip}' ORDER BY s.filter_name, s.filter_version"
    )
    result = http.sql(query)
    table = Table(*[c["name"] for c in result["columns"]], title=f"lineage SQL for clip {clip}")
    for row in result["rows"]:
        table.add_row(*[str(v) for v in row])
    console.print(table)
    lineage = http.lineage(clip)
    served = lineage.get("snapshots", [])
    console.print(
        f"clip {clip} served by: "
        + ", ".join(f"v{s['version']} steps {s['steps'][:5]}" for s in served)
    )
    forensic = Table("row", "clip", "stream", "tier", "source", title="forensics: step 3")
    for s in step["samples"][:8]:
        forensic.add_row(
            str(s.get("row")),
            s["clip_id"][:12],
            str(s.get("stream")),
            str(s.get("tier")),
            str(s.get("source")),
        )
    console.print(forensic)
