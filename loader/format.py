"""Transitional alias of :mod:`manifests.format`, the snapshot format's one home.

Reason this module exists: ``materializer/plan.py`` and ``materializer/plan_draw.py``
still import ``loader.format`` on this branch (another branch splits them into
``materializer/plan/``); the merge re-points those imports and deletes this file.
Nothing else may import it.
"""

from __future__ import annotations

from manifests.format import *  # noqa: F403
from manifests.format import __all__ as __all__
