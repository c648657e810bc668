"""The CLI answers at once: ``vidlake --help`` and a light ``--url`` command import no
heavy dependency, and the version is the package's everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

from tests.service.test_cli import REPO

#: What ``--help`` and an HTTP command must not load (each costs 0.1-3 s to import).
HEAVY = (
    "pyarrow",
    "numpy",
    "pandas",
    "duckdb",
    "pyiceberg",
    "lancedb",
    "torch",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlglot",
    "boto3",
    "yaml",
    "materializer",
    "manifests",
    "interop",
    "loader",
)


def _imported(*argv: str) -> list[str]:
    code = (
        "import sys, json\n"
        f"sys.argv = ['vidlake', *{list(argv)!r}]\n"
        "from service.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stdout = sys.__stdout__\n"
        "print('\\n' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    loaded = set(json.loads(run.stdout.strip().splitlines()[-1]))
    return sorted(loaded & set(HEAVY))


def test_help_imports_no_heavy_dependency() -> None:
    assert _imported("--help") == []
    assert _imported("sql", "--help") == []


def test_a_command_over_http_imports_no_server_dependency() -> None:
    # Nothing listens on port 9: the command fails fast after importing what it needs.
    assert _imported("snapshots", "--url", "http://127.0.0.1:9") == []
    assert _imported("sql", "SELECT 1", "--url", "http://127.0.0.1:9") == []


def test_version_is_the_package_version() -> None:
    from service.routers.health import API_VERSION

    run = subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert run.stdout.strip() == f"vidlake {version('vidlake')}"
    assert version("vidlake") == API_VERSION
