"""The one version of vidlake: the installed distribution's (``pyproject.toml``).

``/v1/health``, the OpenAPI document, the dashboard and ``vidlake --version`` all
report :data:`VERSION`, read from the package metadata with :mod:`importlib.metadata`,
so that a release bumps one number. A source tree run without an install (no metadata)
reports ``0+unknown`` rather than a made-up release.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["VERSION"]


def _installed() -> str:
    try:
        return version("vidlake")
    except PackageNotFoundError:
        return "0+unknown"


VERSION = _installed()
