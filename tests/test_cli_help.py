"""Every command's one-line summary in `--help` says what it does: click cuts a docstring at its first
period, which turned "Kovaleva et al. 2019: ..." into "Kovaleva et al."; every group is checked."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main


def groups(group: click.Group, path=()):
    yield path
    ctx = click.Context(group, info_name="attnstore")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from groups(command, (*path, name))


GROUPS = list(groups(main))


def listed(args: list[str]) -> dict[str, str]:
    """The 'Commands:' section of `attnstore ARGS --help`: name -> short help."""
    result = CliRunner().invoke(main, [*args, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    section = result.output.split("Commands:", 1)[1]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = re.match(r"^  (\S+)(?:\s+(.*))?$", line)
        if match:
            rows[match.group(1)] = (match.group(2) or "").strip()
        elif line.strip() and rows:  # a wrapped summary continues on the next line
            last = list(rows)[-1]
            rows[last] += " " + line.strip()
    return rows


def test_every_group_is_checked():
    assert {(), ("db",), ("probe",), ("report",), ("patterns",)} <= set(GROUPS)


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(p) or "attnstore")
def test_short_help_is_a_whole_summary(path):
    rows = listed(list(path))
    assert rows
    for name, text in rows.items():
        assert text, f"{' '.join(path)} {name}: no summary"
        assert not text.endswith("al."), f"{' '.join(path)} {name}: {text!r} is cut at 'et al.'"
        assert not text.endswith("..."), f"{' '.join(path)} {name}: {text!r} is cut to fit"


def test_report_subcommands_say_what_they_write():
    rows = listed(["report"])
    assert rows["table1"].startswith("Write Kovaleva et al.'s Table 1")
    assert rows["ablation"].startswith("Write Kovaleva et al.'s Figs. 8-9")
    assert rows["clark"].startswith("Write Clark et al.'s")
