"""The demo end to end, twice on one home: `make demo` run again must work too.

The second run finds the corpus in place and the service answers its first cut with
the version the first run's takedown recut made (idempotent cuts), so it trains on
that version; it must not crash on the 200 that carries no job id.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.demo.run import run_demo
from service.settings import Settings


@pytest.mark.slow
def test_the_demo_runs_twice_on_one_home(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    first = run_demo(settings)
    assert first["resume_identical"] and first["versions"] == [1, 2]
    again = run_demo(settings)
    assert again["resume_identical"]
    assert again["versions"][0] == 2  # the state the first run left: v2's inputs
    assert again["versions"][1] == 3  # a second takedown changes the catalog: a new cut
