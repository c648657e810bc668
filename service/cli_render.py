"""Fitting a query result into the terminal: truncate cell text, never headers.

A wide ``vidlake sql`` result used to leave rich to shrink every column, which cut
headers down to ``c…`` while long cells wrapped over many lines. :func:`fit_widths`
gives every column at least its header's width, shares the rest of the terminal
among the columns whose cells are wider (narrow columns keep what they need), and
:func:`clip` cuts each cell to its column's width with ``…``. When even the headers
do not fit, the table is printed as wide as they need (the terminal wraps it) rather
than lose a column name.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["clip", "fit_widths", "table_width"]

ELLIPSIS = "…"


def table_width(widths: Sequence[int]) -> int:
    """Characters a rich table with these column widths takes (borders, padding)."""
    return sum(widths) + 3 * len(widths) + 1


def fit_widths(headers: Sequence[str], cells: Sequence[Sequence[str]], width: int) -> list[int]:
    """Each column's width: the header's at least, its widest cell's at most, the
    spare room of ``width`` shared out evenly among the columns that want more."""
    want = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    caps = [len(h) for h in headers]
    spare = width - table_width(caps)
    while spare > 0:
        hungry = [i for i, c in enumerate(caps) if c < want[i]]
        if not hungry:
            break
        share = max(1, spare // len(hungry))
        for i in hungry:
            grant = min(share, want[i] - caps[i], spare)
            caps[i] += grant
            spare -= grant
            if spare <= 0:
                break
    return caps


def clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with a trailing ``…``."""
    line = text.replace("\n", " ")
    return line if len(line) <= width else line[: max(width - 1, 0)] + ELLIPSIS
