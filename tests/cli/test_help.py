"""Every command's ``--help`` is plain text a user can read: no type tags on flags, no
markup of the docstrings it comes from, no boxes. Runs as a user runs it: a process."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import typer.main

from turnkeeper.cli.app import app

# What leaked into help before: `<bool>` on every flag, RST literals (``--exit``) and
# Python's type names; and what a rich renderer would add: boxes and markup tags.
LEAKS = re.compile(r"<bool>|``|<list\[|[╭╮╰╯│─]|\[/?(bold|green|red|dim|yellow)")


def command_paths() -> list[list[str]]:
    """Every command and subcommand of the app, as the words a user types."""
    paths: list[list[str]] = []
    pending: list[tuple[list[str], object]] = [([], typer.main.get_command(app))]
    while pending:
        path, command = pending.pop()
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            paths.append(path)
            continue
        if path:
            paths.append(path)
        pending += [([*path, name], sub) for name, sub in subcommands.items()]
    return sorted(paths)


def help_of(path: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    return subprocess.run(
        [sys.executable, "-m", "turnkeeper", *path, "--help"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_every_command_has_plain_help() -> None:
    paths = command_paths()
    assert ["runs"] in paths
    assert ["transcript"] in paths
    assert ["keys", "create"] in paths
    for path in [[], *paths]:
        shown = help_of(path)
        assert (shown.returncode, shown.stderr) == (0, ""), path
        assert shown.stdout.startswith(f"Usage: {' '.join(['turnkeeper', *path])} "), path
        assert LEAKS.search(shown.stdout) is None, (path, shown.stdout)


def test_status_help_exactly() -> None:
    shown = help_of(["status"])
    assert shown.stdout == (
        "Usage: turnkeeper status [OPTIONS] {RUN_ID}\n"
        "\n"
        "  Show a run's status, phase, epoch, attempts, owner, sandbox host, lease\n"
        "  (while it runs) and error (its reason and message); for a queued run, how\n"
        "  many runs of its session it waits behind (0: it starts next).\n"
        "\n"
        "Arguments:\n"
        "  RUN_ID <str>  The run's id.  [required]\n"
        "\n"
        "Options:\n"
        "  --json  One JSON object.\n"
        "  --help  Show this message and exit.\n"
    )
