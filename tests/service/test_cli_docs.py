"""Every ``vidlake`` command line in the quickstart's shell blocks names a command and
options that exist (it once documented ``--url`` where a command had none)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from service.cli import app

REPO = Path(__file__).resolve().parents[2]
PAGES = ("quickstart.md", "operations.md", "interop.md")


def _command_lines(page: Path) -> list[str]:
    lines: list[str] = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(), re.S):
        joined = block.replace("\\\n", " ")
        lines += [ln.strip() for ln in joined.splitlines() if ln.strip().startswith("vidlake ")]
    return lines


def test_documented_command_lines_parse() -> None:
    runner = CliRunner()
    checked = 0
    for name in PAGES:
        for line in _command_lines(REPO / "docs" / name):
            argv = [a for a in shlex.split(line, comments=True)[1:] if a not in ("…", "[", "]")]
            argv = [a for a in argv if not a.startswith("[")]
            # The vidlake command ends where the shell's next one begins.
            ends = [i for i, a in enumerate(argv) if a in ("&&", "||", "|", ";", ">", ">>")]
            argv = argv[: ends[0]] if ends else argv
            # --help is eager: it stops after parsing, so only unknown commands and
            # options fail (exit 2), and nothing runs.
            result = runner.invoke(app, [*argv, "--help"])
            assert result.exit_code == 0, (name, line, result.output)
            checked += 1
    assert checked >= 20
