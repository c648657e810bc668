"""Each package imports only the layers below it, and only their public names.

The layers, lowest first (docs/internals.md draws them)::

    catalog  <  manifests  <  materializer  <  interop  <  service

``loader`` stands beside them: it may import ``catalog.errors``, ``catalog.hashing``,
``catalog.atomic``, ``catalog.objects`` and the snapshot contract (``manifests.format``,
``manifests.ipc``, ``manifests.artifacts``), and nothing else of vidlake
(``tests/loader/test_import_isolation.py`` checks the same at run time, with the
service's dependencies blocked). Only ``catalog`` imports pyiceberg and only
``service`` imports FastAPI or Starlette.

The check reads every module's syntax tree, so it sees imports inside functions and
under ``TYPE_CHECKING`` too: a type-only import upward is still a dependency a reader
has to follow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Each layered package and its rank; a module may import ranks at or below its own.
LAYERS = {"catalog": 0, "manifests": 1, "materializer": 2, "interop": 3, "service": 4}
#: What loader may import of vidlake (a module or the package it is in).
LOADER_MAY_IMPORT = (
    "catalog.errors",
    "catalog.hashing",
    "catalog.atomic",
    "catalog.objects",
    "manifests.format",
    "manifests.ipc",
    "manifests.artifacts",
)
#: Who may import loader: TAR export reads a plan as a rank would, the service's demo
#: runs a training loop.
LOADER_USERS = {"interop", "service"}
#: benchmarks/ is checked as a top layer of its own: it may import any package, never tests.
#: Third-party packages that belong to one vidlake package.
OWNED = {"pyiceberg": {"catalog"}, "fastapi": {"service"}, "starlette": {"service"}}
PACKAGES = (*LAYERS, "loader")


@dataclass(frozen=True)
class Import:
    """One imported name: ``module`` (absolute) and, for ``from`` imports, ``name``."""

    source: str
    line: int
    module: str
    name: str | None

    def where(self) -> str:
        return f"{self.source}:{self.line}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(path: Path) -> Iterator[Import]:
    """Every import of ``path``, and every ``module._private`` attribute read through a
    name an import bound (``from catalog.objects import refs`` … ``refs._s3``)."""
    source = _module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, node.lineno, alias.name, None)
                if alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(source, path.name == "__init__.py", node)
            for alias in node.names:
                yield Import(source, node.lineno, module, alias.name)
                bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield Import(source, node.lineno, bound[node.value.id], node.attr)


def _all_imports() -> list[Import]:
    found: list[Import] = []
    for package in (*PACKAGES, "benchmarks"):
        for path in sorted((REPO / package).rglob("*.py")):
            found.extend(_imports(path))
    return found


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


#: Benchmark modules that may read named private modules: ``benchmarks/ingest.py
#: --stages`` times the fast append's internal stages by wrapping them (instrumentation,
#: not use; the benchmark's figures themselves go through the public API).
PROFILED_INTERNALS = {"benchmarks.ingest": {"catalog._append"}}


def _violation(imp: Import) -> str | None:
    """Why ``imp`` breaks the layering, or None."""
    if imp.module in PROFILED_INTERNALS.get(imp.source, ()) or (
        imp.name is not None
        and f"{imp.module}.{imp.name}" in PROFILED_INTERNALS.get(imp.source, ())
    ):
        return None
    own = imp.source.split(".")[0]
    top = imp.module.split(".")[0]
    if top in OWNED and own not in OWNED[top]:
        return f"{own} imports {top}, which only {sorted(OWNED[top])} may import"
    if top in ("tests", "benchmarks") and own != top:
        return f"{own} imports {top}: shared code belongs in a package"
    if top not in PACKAGES or top == own:
        return None
    target = imp.module if imp.name is None else f"{imp.module}.{imp.name}"
    if _private(imp.module) or (imp.name is not None and imp.name.startswith("_")):
        return f"{own} imports the private name {target} of {top}"
    if own == "benchmarks":
        return None
    if own == "loader":
        if any(imp.module == ok or imp.module.startswith(ok + ".") for ok in LOADER_MAY_IMPORT):
            return None
        if imp.name is not None and f"{imp.module}.{imp.name}" in LOADER_MAY_IMPORT:
            return None
        return f"loader imports {target}; it may import only {', '.join(LOADER_MAY_IMPORT)}"
    if top == "loader":
        return None if own in LOADER_USERS else f"{own} imports loader (a consumer, not a layer)"
    if LAYERS[top] > LAYERS[own]:
        return f"{own} imports {target}, a layer above it"
    return None


def test_packages_import_only_lower_layers_and_public_names() -> None:
    broken = sorted(
        {f"{imp.where()}: {why}" for imp in _all_imports() if (why := _violation(imp)) is not None}
    )
    assert not broken, "layering broken:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("source", "module", "name", "broken"),
    [
        ("catalog.reads", "service.settings", "Settings", True),
        ("manifests.registry", "catalog.backends", "_connect", True),
        ("manifests.registry", "catalog._append", "append", True),
        ("materializer.cut", "pyiceberg.expressions", "In", True),
        ("loader.plan", "manifests.registry", "Registry", True),
        ("loader.plan", "manifests.format", "PLAN_NAME", False),
        ("loader.cache", "catalog", "hashing", False),
        ("materializer.cut", "loader.plan", "open_plan", True),
        ("service.demo", "loader.dataset", "SnapshotDataset", False),
        ("interop.tar_export", "manifests.registry", "Registry", False),
        ("interop.tar_export", "loader.plan", "open_plan", False),
        ("loader.cache", "manifests.registry", "Registry", True),
        ("catalog.erase", "catalog._append", "append", False),
        ("benchmarks.loader", "tests.loader.synth", "write_snapshot", True),
    ],
)
def test_the_checker_tells_breaks_from_allowed_imports(
    source: str, module: str, name: str, broken: bool
) -> None:
    assert (_violation(Import(source, 1, module, name)) is not None) is broken


@pytest.mark.parametrize("package", ["catalog", "manifests", "materializer", "interop"])
def test_only_the_service_reads_the_environment(package: str) -> None:
    """Settings are read in ``service/settings.py`` and passed down (``CatalogConfig``,
    the object stores' ``S3Connection``); the layers below take explicit values."""
    offenders = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in sorted((REPO / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
    ]
    assert offenders == []
