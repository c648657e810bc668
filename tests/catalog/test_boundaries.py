"""Only ``catalog`` imports pyiceberg, and the catalog reads no environment.

pyiceberg is one external system with one home (STYLE.md: one seam per external
system); other packages reach Iceberg state through the facade's methods. Settings are
read in ``service/settings.py`` only and passed down through ``CatalogConfig``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("catalog", "manifests", "materializer", "interop", "loader", "service")


def _modules(package: str) -> list[Path]:
    top = ROOT / package
    return sorted(top.rglob("*.py")) if top.is_dir() else []


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_module_outside_catalog_imports_pyiceberg() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for package in PACKAGES
        if package != "catalog"
        for path in _modules(package)
        for name in sorted(_imports(path))
        if name == "pyiceberg" or name.startswith("pyiceberg.")
    ]
    assert offenders == []


def test_the_catalog_reads_no_environment() -> None:
    offenders = []
    for path in _modules("catalog"):
        if "objects" in path.relative_to(ROOT).parts:
            continue  # the object stores' S3 settings are passed down separately
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
