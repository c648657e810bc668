"""docs/quickstart.md's "which commands need which scope" table names every command
whose ``--help`` example states a scope, under that scope (service/cli_examples.py is
the source), so a new command cannot leave the table behind."""

from __future__ import annotations

import re
from pathlib import Path

from service.cli_examples import EXAMPLES

REPO = Path(__file__).resolve().parents[2]
SCOPES = ("read", "write", "cut", "admin")


def _table() -> dict[str, list[str]]:
    """scope -> the commands its row of the quickstart's scope table names."""
    text = (REPO / "docs" / "quickstart.md").read_text()
    section = text.split("### Which commands need which scope", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].strip("`") in SCOPES:
            rows[cells[0].strip("`")] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def test_the_scope_table_names_every_command_under_its_scope() -> None:
    rows = _table()
    assert sorted(rows) == sorted(SCOPES)
    missing = []
    for command, lines in EXAMPLES.items():
        for line in lines:
            found = re.search(r"# scope: (\w+)", line)
            if found is None or found.group(1) not in SCOPES:
                continue
            named = rows[found.group(1)]
            if not any(item == command or item.startswith(command + " ") for item in named):
                missing.append(f"{command} ({found.group(1)})")
    assert missing == [], f"docs/quickstart.md's scope table lacks: {', '.join(missing)}"
