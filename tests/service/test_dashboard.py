"""The dashboard at ``/``: server-rendered content, and a real browser rendering it."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from tests.service.support import TestClient, World, serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def test_dashboard_shows_counts_jobs_and_snapshots(client: TestClient, world: World) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert '<meta http-equiv="refresh"' in page
    counts = dict(re.findall(r"<tr><td>(\w+)</td><td class=\"num\">([\d,]+)</td></tr>", page))
    assert counts["clips"] == str(len(world.clips)) and counts["assets"] == "10"
    assert counts["tombstones"] == "1"
    assert page.count('class="snapshot"') == len(world.versions)
    assert page.count('<svg class="shares"') == len(world.versions)
    assert "fake-0" in page and "main 50%" in page
    assert client.get("/static/dashboard.css").status_code == 200


def test_dashboard_reads_each_tables_metadata_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from catalog.tables import TABLE_NAMES

    catalog = client.app.state.services.catalog  # type: ignore[attr-defined]
    loaded: list[str] = []
    real = catalog.iceberg_table

    def counting(name: str) -> object:
        loaded.append(name)
        return real(name)

    monkeypatch.setattr(catalog, "iceberg_table", counting)
    assert client.get("/").status_code == 200
    # Counts and the ingest chart come from one metadata read per table (was two).
    assert sorted(loaded) == sorted(TABLE_NAMES)


def test_dashboard_escapes_what_it_shows(client: TestClient, world: World) -> None:
    runner = client.app.state.services.runner  # type: ignore[attr-defined]
    job = runner.submit("cut", lambda p: None, {}, owner="<script>alert(1)</script>")
    deadline = time.monotonic() + 10
    while not runner.store.get(job.id).done and time.monotonic() < deadline:
        time.sleep(0.01)
    page = client.get("/").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.browser
def test_dashboard_in_headless_chromium(world: World, tmp_path: Path) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(
            f"headless Chromium not found at {CHROMIUM}: `make test` installs the Debian "
            "`chromium` package when run as root"
        )
    app = create_app(world.settings(), catalog=world.catalog)
    with serve(app) as url:
        # A running job, so the progress bars have something to show.
        services = app.state.services
        gate = threading.Event()

        def slow(progress: object) -> None:
            progress("plan", 0.6)  # type: ignore[operator]
            gate.wait(60)

        services.runner.submit("cut", slow, {"recipe_name": "browser"}, owner="chromium-test")
        assert httpx.get(f"{url}/v1/health", timeout=10).status_code == 200
        profile = tmp_path / "profile"
        dom = subprocess.run(
            [CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={profile}", "--dump-dom", f"{url}/"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        shot = tmp_path / "dashboard.png"
        subprocess.run(
            [
                CHROMIUM,
                *BROWSER_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={shot}",
                "--window-size=1280,900",
                f"{url}/",
            ],
            capture_output=True,
            timeout=120,
        )
        gate.set()
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "<h1>vidlake</h1>" in html
    assert html.count('class="snapshot"') == len(world.versions)
    assert "chromium-test" in html and "running" in html and 'style="width:60%"' in html
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 5_000  # a rendered page, not a blank one
