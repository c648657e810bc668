"""Reading a version's plan quality report (``quality.json``, :mod:`materializer.quality`).

:func:`load_quality` is the one reader: the REST route (``GET
/v1/snapshots/{v}/quality``), both ``Client`` implementations (``report``), the CLI
(``vidlake report``) and the dashboard go through it. A version cut before the report
existed, or a patch (its plan is its base's, minus rows), has none: ``None`` here,
and :func:`quality_of` turns that into a :class:`~catalog.errors.NotFound` that says
so (the version itself exists).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from catalog.errors import IntegrityError, NotFound
from manifests.format import QUALITY_NAME
from manifests.registry import Registry
from service.snapshot_reader import SnapshotReader

__all__ = ["load_quality", "quality_of"]


class _HasRegistry(Protocol):
    @property
    def registry(self) -> Registry: ...


Source = SnapshotReader | Registry | _HasRegistry


def load_quality(source: Source, version: int) -> dict[str, Any] | None:
    """Version ``version``'s ``quality.json`` (verified), or None when it has none.

    ``source`` is a :class:`SnapshotReader` (cached, verified local copies), a
    :class:`Registry`, or anything with a ``registry`` (a ``Lake``, the service's
    ``Services``: its ``reader`` is used when it has one).

    Raises:
        NotFound: No version ``version``.
        ChecksumMismatch: The stored artifact does not verify.
    """
    reader = source if isinstance(source, SnapshotReader) else getattr(source, "reader", None)
    if isinstance(reader, SnapshotReader):
        if QUALITY_NAME not in reader.record(version).artifacts:
            return None
        data = reader.local(version, QUALITY_NAME).read_bytes()
    else:
        registry = source if isinstance(source, Registry) else source.registry
        if QUALITY_NAME not in registry.get(version).artifacts:
            return None
        data = registry.read_artifact(version, QUALITY_NAME)
    report = json.loads(data)
    if not isinstance(report, dict):
        raise IntegrityError(f"{QUALITY_NAME} of version {version} is not a JSON object")
    return report


def quality_of(source: Source, version: int) -> dict[str, Any]:
    """:func:`load_quality`, with a version that has no report as a NotFound.

    Raises:
        NotFound: No version ``version`` (``details.version``), or it has no report
            (``details.reason == "no_quality_report"``).
    """
    report = load_quality(source, version)
    if report is None:
        raise NotFound(
            f"version {version} has no plan quality report ({QUALITY_NAME}): it was cut "
            "before vidlake measured plans, or it is a patch (its plan is its base's "
            "minus rows; see the base version's report)",
            version=version,
            reason="no_quality_report",
        )
    return report
