"""Filter drift: two versions of one filter compared on the frozen reference slice.

:func:`drift_report` reads the catalog at one pin and answers the shape the dashboard
draws (``GET /v1/drift/{filter}``, ``vidlake drift``): on the clips of the reference
slice (:mod:`catalog.reference`, train assets only), each version's latest score per
clip as a histogram over shared edges, quantiles, the two-sample Kolmogorov-Smirnov
statistic (the largest gap between the two empirical CDFs: 0 for the same
distribution, 1 for disjoint ones), each version's coverage of the slice's clips and,
with a threshold, the kill rate (the share of scored clips below it, which a
``min:`` filter at the threshold drops). ``kill_rate_over_time`` is the early warning
of upstream shift: per source, per UTC day of the score rows' time (``computed_at``,
the scores table's time column) and per version, the kill rate over every scored
train clip, not only the slice's.

:func:`reference_slice` lists the slice (assets, and clips with ``clips=True``) for
scoring fleets, which must score it with every filter version.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pydantic import BaseModel, Field

from catalog.errors import InvalidInput, NotFound
from catalog.names import NAME, matches, valid_version
from catalog.reads import one_of

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from catalog.pins import Pin

__all__ = [
    "QUANTILES",
    "DriftPublic",
    "ReferenceSlicePublic",
    "drift_report",
    "ks_statistic",
    "reference_slice",
]

#: The quantiles every report lists.
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
MAX_BINS = 1000


class HasCatalog(Protocol):
    """A :class:`~service.lake.Lake` or :class:`~service.deps.Services`."""

    @property
    def catalog(self) -> VidlakeCatalog: ...


class DriftPublic(BaseModel):
    """Two versions of one filter on the reference slice (``docs/instruments.md``)."""

    filter: str
    version_a: str
    version_b: str
    slice: dict[str, int] = Field(description="The slice's train assets and their clips")
    coverage: dict[str, float] = Field(description="Per version: share of slice clips scored")
    histogram: dict[str, list[float] | list[int]] = Field(
        description="edges (bins + 1, shared) and per version the clip counts per bin"
    )
    quantiles: dict[str, list[float | None]] = Field(
        description="q and per version the score at each (null: no scored clip)"
    )
    ks: float | None = Field(description="Two-sample KS statistic (null: a side is empty)")
    kill_rate: dict[str, float | None] | None = Field(
        description="threshold and per version the share of scored slice clips below it"
    )
    kill_rate_over_time: list[dict[str, Any]] = Field(
        description="Per source, UTC day of the score rows and version: clips, kill_rate "
        "(every scored train clip; empty without a threshold)"
    )


class ReferenceSlicePublic(BaseModel):
    """The reference slice's members, for scoring fleets (never filter them out)."""

    fraction: float
    assets: list[str]
    clips: list[str] | None = None


def _catalog(lake: VidlakeCatalog | HasCatalog) -> VidlakeCatalog:
    from catalog.catalog import VidlakeCatalog

    return lake if isinstance(lake, VidlakeCatalog) else lake.catalog


def _scans(catalog: VidlakeCatalog, pin: Pin) -> tuple[pa.Table, pa.Table]:
    """The train assets (``asset_id``, ``source``) and clips (``clip_id``, ``asset_id``)."""
    assets = catalog.scan("assets", pin=pin, columns=["asset_id", "source"])
    return assets, catalog.scan("clips", pin=pin, columns=["clip_id", "asset_id"])


def _slice(catalog: VidlakeCatalog, assets: pa.Table, clips: pa.Table) -> tuple[pa.Array, pa.Table]:
    """The slice's asset ids (sorted) and its clips among ``clips``."""
    ids = pc.unique(assets["asset_id"])
    members = ids.filter(pa.array(catalog.reference.contains(ids)))
    return members.sort(), clips.filter(pc.is_in(clips["asset_id"], value_set=members))


def reference_slice(lake: VidlakeCatalog | HasCatalog, *, clips: bool = False) -> dict[str, Any]:
    """The reference slice at the catalog's current state: its asset ids (sorted) and,
    with ``clips``, its train clip ids."""
    catalog = _catalog(lake)
    members, clip_rows = _slice(catalog, *_scans(catalog, catalog.pin()))
    found: dict[str, Any] = {"fraction": catalog.reference.fraction, "assets": members.to_pylist()}
    if clips:
        found["clips"] = sorted(pc.unique(clip_rows["clip_id"]).to_pylist())
    return found


def _check_args(filter_name: str, a: str, b: str, threshold: float | None, bins: int) -> None:
    if not matches(NAME, filter_name):
        raise InvalidInput(f"not a filter name: {filter_name!r}", field="filter")
    for field, version in (("a", a), ("b", b)):
        if not valid_version(version):
            raise InvalidInput(f"not a version: {version!r}", field=field)
    if threshold is not None and not math.isfinite(threshold):
        raise InvalidInput(f"threshold must be finite, got {threshold}", field="threshold")
    if not 1 <= bins <= MAX_BINS:
        raise InvalidInput(f"bins must be 1 … {MAX_BINS}, got {bins}", field="bins")


_LATEST_SQL = """
SELECT clip_id, filter_version AS version, arg_max(score, computed_at) AS score,
       max(computed_at) AS at
FROM scores WHERE filter_version IN ($a, $b) GROUP BY clip_id, filter_version
"""

_OVER_TIME_SQL = (
    """
WITH latest AS ("""
    + _LATEST_SQL
    + """)
SELECT a.source, strftime(timezone('UTC', l.at), '%Y-%m-%d') AS day, l.version,
       count(*) AS clips, avg((l.score < $threshold)::DOUBLE) AS kill_rate
FROM latest l JOIN clips c ON c.clip_id = l.clip_id JOIN assets a ON a.asset_id = c.asset_id
GROUP BY ALL ORDER BY a.source, day, l.version
"""
)


def _scores(catalog: VidlakeCatalog, pin: Pin, filter_name: str, a: str, b: str) -> pa.Table:
    """The train score rows of ``filter_name``; NotFound for a version it never had."""
    rows = catalog.scan(
        "scores",
        pin=pin,
        columns=["clip_id", "filter_version", "score", "computed_at"],
        row_filter=one_of("filter_name", [filter_name]),
    )
    known = sorted(pc.unique(rows["filter_version"]).to_pylist())
    for field, version in (("a", a), ("b", b)):
        if version not in known:
            raise NotFound(
                f"filter {filter_name!r} has no scores at version {version!r}"
                + (f"; versions: {', '.join(known)}" if known else "; it has no scores"),
                field=field,
                known=known,
            )
    return rows


def ks_statistic(x: NDArray[np.float64], y: NDArray[np.float64]) -> float | None:
    """The two-sample Kolmogorov-Smirnov statistic ``sup |F_x - F_y|`` (None when a
    sample is empty)."""
    if x.size == 0 or y.size == 0:
        return None
    xs, ys = np.sort(x), np.sort(y)
    grid = np.concatenate([xs, ys])
    fx = np.searchsorted(xs, grid, side="right") / xs.size
    fy = np.searchsorted(ys, grid, side="right") / ys.size
    return float(np.max(np.abs(fx - fy)))


def _edges(x: NDArray[np.float64], y: NDArray[np.float64], bins: int) -> NDArray[np.float64]:
    both = np.concatenate([x, y])
    lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, bins + 1)


def _quantiles(x: NDArray[np.float64]) -> list[float | None]:
    if x.size == 0:
        return [None] * len(QUANTILES)
    return [float(v) for v in np.quantile(x, QUANTILES)]


def _kill(x: NDArray[np.float64], threshold: float) -> float | None:
    return float(np.mean(x < threshold)) if x.size else None


def drift_report(
    lake: VidlakeCatalog | HasCatalog,
    filter_name: str,
    version_a: str,
    version_b: str,
    *,
    threshold: float | None = None,
    bins: int = 20,
) -> dict[str, Any]:
    """Filter ``filter_name`` at ``version_a`` against ``version_b`` on the reference
    slice (the shape of :class:`DriftPublic`; see the module docstring).

    Raises:
        InvalidInput: A bad name, version, threshold or bin count.
        NotFound: The filter has no scores at one of the versions.
    """
    _check_args(filter_name, version_a, version_b, threshold, bins)
    catalog = _catalog(lake)
    pin = catalog.pin()
    scores = _scores(catalog, pin, filter_name, version_a, version_b)
    assets, clips = _scans(catalog, pin)
    members, slice_clips = _slice(catalog, assets, clips)
    con = duckdb.connect(":memory:", config={"threads": 2})
    try:
        con.register("scores", scores)
        params = {"a": version_a, "b": version_b}
        latest = con.sql(_LATEST_SQL, params=params).to_arrow_table()
        over_time: list[dict[str, Any]] = []
        if threshold is not None:
            con.register("clips", clips)
            con.register("assets", assets)
            found = con.sql(_OVER_TIME_SQL, params={**params, "threshold": threshold})
            over_time = found.to_arrow_table().to_pylist()
    finally:
        con.close()
    in_slice = latest.filter(pc.is_in(latest["clip_id"], value_set=slice_clips["clip_id"]))
    values = {
        side: in_slice.filter(pc.equal(in_slice["version"], version))["score"]
        .to_numpy()
        .astype(np.float64)
        for side, version in (("a", version_a), ("b", version_b))
    }
    n_clips = len(pc.unique(slice_clips["clip_id"]))
    return {
        "filter": filter_name,
        "version_a": version_a,
        "version_b": version_b,
        "slice": {"assets": len(members), "clips": n_clips},
        **_compare(values, n_clips, threshold, bins),
        "kill_rate_over_time": over_time,
    }


def _compare(
    values: dict[str, NDArray[np.float64]], n_clips: int, threshold: float | None, bins: int
) -> dict[str, Any]:
    """Coverage, histograms, quantiles, KS and kill rates of sides ``a`` and ``b``."""
    edges = _edges(values["a"], values["b"], bins)
    return {
        "coverage": {s: (v.size / n_clips if n_clips else 0.0) for s, v in values.items()},
        "histogram": {
            "edges": [float(e) for e in edges],
            **{s: [int(c) for c in np.histogram(v, bins=edges)[0]] for s, v in values.items()},
        },
        "quantiles": {"q": list(QUANTILES), **{s: _quantiles(v) for s, v in values.items()}},
        "ks": ks_statistic(values["a"], values["b"]),
        "kill_rate": None
        if threshold is None
        else {"threshold": threshold, **{s: _kill(v, threshold) for s, v in values.items()}},
    }
