"""An installed (non-editable) vidlake runs from any directory: ``vidlake --help`` and
the demo, whose recipe ships as package data.

The wheel is built from a copy of the source tree (nothing is written into the
checkout) with ``pip wheel --no-deps --no-build-isolation`` and installed, without its
dependencies and offline, into a fresh venv whose site-packages reaches this venv's
through a ``.pth`` line (so the dependencies are found but the editable install of
the checkout is not). The commands then run in an empty directory.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.service.test_cli import REPO

PACKAGES = ("catalog", "manifests", "materializer", "interop", "loader", "service")


def test_the_demo_recipe_is_the_documented_one() -> None:
    shipped = REPO / "service" / "demo" / "demo.yaml"
    assert shipped.read_bytes() == (REPO / "docs" / "recipes" / "demo.yaml").read_bytes()


def test_the_image_builds_every_package_into_its_wheel() -> None:
    """deploy/Dockerfile builds the wheel from a copy of each package (it once left
    out interop) and installs the wheel, not the source tree."""
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    for package in PACKAGES:
        assert f"COPY {package} {package}" in dockerfile, package
    assert "pip wheel --no-deps" in dockerfile and "/wheels/vidlake-" in dockerfile


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), "."],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp / "dist").glob("vidlake-*.whl")
    return wheel


def _venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "vidlake-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = ["install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *install],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return venv


@pytest.mark.slow
def test_an_installed_wheel_runs_help_and_the_demo_elsewhere(tmp_path: Path) -> None:
    venv = _venv(tmp_path, _build_wheel(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "VIDLAKE_HOME": str(tmp_path / "home"),
        "COLUMNS": "120",
    }

    def vidlake(*args: str, timeout: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["vidlake", *args], cwd=elsewhere, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import service; print(service.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(venv)), where.stdout  # the wheel, not the checkout
    help_ = vidlake("--help", timeout=60)
    assert help_.returncode == 0 and "demo" in help_.stdout, help_.stderr
    demo = vidlake("demo", timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "demo finished" in demo.stdout
