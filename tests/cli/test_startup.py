"""The CLI starts on Typer alone: importing it, and showing any command's help, loads
none of what the commands run on (Celery, the web app, the store's SQL layer, the
servers' drivers). The commands a script calls in a loop load only what they run on:
the store's commands neither SQLAlchemy nor the log nor Celery, tail and cancel no
Celery (they send nothing). A structural check, not a timing one: bench/cli_start.py
measures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable

import pytest

from tests.driver.fleet import Fleet

# What a command loads when it runs, never before: each costs tens to hundreds of
# milliseconds of every `turnkeeper status` a script calls in a loop.
HEAVY = (
    "alembic",
    "celery",
    "fastapi",
    "filelock",
    "httpx",
    "kombu",
    "playwright",
    "psycopg",
    "psycopg_pool",
    "pydantic_settings",
    "redis",
    "rich",
    "sqlalchemy",
    "starlette",
    "structlog",
    "turnkeeper.client",
    "turnkeeper.config",
    "turnkeeper.embedded",
    "turnkeeper.log",
    "turnkeeper.store",
    "turnkeeper.tasks",
    "turnkeeper.web",
    "uvicorn",
)

# Runs `turnkeeper ARGS` in this process and prints which of HEAVY it loaded, whatever
# way the command ended.
PROBE = """
import json, sys
heavy, argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
try:
    if argv is None:
        import turnkeeper.cli
    else:
        sys.argv = ["turnkeeper", *argv]
        import turnkeeper.cli as cli
        cli.exit_now = sys.exit  # a quick command would end the process before the print
        cli.main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(json.dumps({"code": code, "loaded": sorted(m for m in heavy if m in sys.modules)}))
"""


def loaded_by(
    argv: list[str] | None, env: dict[str, str] | None = None, heavy: Iterable[str] = HEAVY
) -> dict[str, object]:
    """What ``turnkeeper ARGV`` loaded of ``heavy``; with ``env``, against that stack."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(sorted(heavy)), json.dumps(argv)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_importing_the_cli_loads_nothing_a_command_runs_on() -> None:
    assert loaded_by(None) == {"code": 0, "loaded": []}


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["status", "--help"],
        ["runs", "--help"],
        ["tail", "--help"],
        ["cancel", "--help"],
        ["submit", "--help"],
        ["sessions", "--help"],
        ["transcript", "--help"],
        ["worker", "--help"],
        ["web", "--help"],
        ["demo", "--help"],
        ["dev", "--help"],
        ["keys", "create", "--help"],
    ],
)
def test_help_loads_nothing_a_command_runs_on(argv: list[str]) -> None:
    assert loaded_by(argv) == {"code": 0, "loaded": []}


def test_a_usage_error_is_found_before_anything_loads() -> None:
    """A bad status is refused by the parser: nothing connects, nothing heavy loads."""
    assert loaded_by(["runs", "--status", "bogus"]) == {"code": 2, "loaded": []}


# What the commands a script loops on may load, by what they do: read and write the log
# (tail, and cancel, which ends a queued run's log), render a conversation (tail: rich),
# send a message (submit alone: the queues, never the worker's tasks behind them), and
# check the agent it names (submit: its spec). Nothing else logs in a loop that goes
# well: structlog loads for an event at the level shown (WARNING), not before. None of
# them loads what only a worker runs (its tasks, the driver, the sandboxes), the
# migrations (SQLAlchemy), the web app or the embedded servers' lookup: both URLs are set.
THE_LOG = {"redis", "turnkeeper.client", "turnkeeper.log"}
RENDERING = {"rich"}
SENDING = {"celery", "kombu", "turnkeeper.queues"}
CHECKING = {"turnkeeper.agents.spec"}
LOGGING = {"rich", "structlog"}  # structlog.dev loads rich wherever rich is installed
NEVER_IN_A_LOOP = {
    "alembic",
    "turnkeeper.driver.attempt",
    "turnkeeper.sandbox.factory",
    "turnkeeper.tasks",
    "fastapi",
    "playwright",
    "sqlalchemy",
    "starlette",
    "turnkeeper.embedded",
    "turnkeeper.web.app",
    "uvicorn",
}


def test_the_commands_a_script_loops_on_load_only_what_they_run_on(fleet: Fleet) -> None:
    """submit (no worker runs: the run stays queued), status and runs (the store alone),
    cancel (which settles the run and ends its log) and tail (which reads that log)."""

    def loads(*argv: str) -> set[str]:
        tracked = THE_LOG | RENDERING | SENDING | CHECKING | LOGGING | NEVER_IN_A_LOOP
        result = loaded_by(list(argv), fleet.env, tracked)
        assert result["code"] == 0, (argv, result)
        assert isinstance(result["loaded"], list)
        return set(result["loaded"])

    submitted = loads("submit", "--agent", "scripted", "--prompt", "hi", "--run-id", "loop-1")
    assert SENDING | CHECKING <= submitted <= THE_LOG | SENDING | CHECKING | LOGGING
    assert loads("status", "loop-1") == set()
    assert loads("runs") == set()
    assert loads("cancel", "loop-1") <= THE_LOG
    assert fleet.client.require("loop-1").status.value == "aborted"
    assert loads("tail", "loop-1") <= THE_LOG | RENDERING
