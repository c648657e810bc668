"""Every ``vidlake`` command's ``--help`` ends with an example of itself."""

from __future__ import annotations

from typing import Any

import typer.main
from typer.testing import CliRunner

from service.cli import app
from service.cli_examples import EXAMPLES


def _commands() -> dict[str, Any]:
    found: dict[str, Any] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, sub in getattr(group, "commands", {}).items():
            if hasattr(sub, "commands"):  # a group (typer vendors click)
                walk(sub, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = sub

    walk(typer.main.get_command(app), "")
    return found


def test_every_command_has_an_example_and_every_example_a_command() -> None:
    commands = set(_commands())
    assert sorted(commands - set(EXAMPLES)) == []
    assert sorted(set(EXAMPLES) - commands) == []


def test_help_ends_with_the_commands_own_example() -> None:
    runner = CliRunner()
    for path in _commands():
        lines = EXAMPLES[path]
        result = runner.invoke(app, [*path.split(), "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        tail = result.output.rstrip().splitlines()[-len(lines) :]
        assert [t.strip() for t in tail] == list(lines), (path, result.output)
        assert f"vidlake {path}" in result.output.split("Example:")[-1], path
