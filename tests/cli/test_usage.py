"""Hostile command lines: each is a usage error (exit 2) with the command's usage and
what is wrong, never a traceback, and is found before anything connects. The servers
here do not exist: a command that tried to reach them would fail with exit 1 instead."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cli.output import usage_error

NOWHERE = {
    "TURNKEEPER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere",
    "TURNKEEPER_REDIS_URL": "redis://127.0.0.1:1/0",
}
TOO_LONG = "x" * 256
STATUSES = "'queued', 'running', 'completed', 'failed', 'aborted'"
KEY_NAME = "a key name is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
EMPTY_ID = "must be a non-empty string of at most 255 characters"


def turnkeeper(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    return subprocess.run(
        [sys.executable, "-m", "turnkeeper", *args],
        env={**env, **NOWHERE},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def invalid(option: str, message: str) -> str:
    return f"Invalid value for {option}: {message}"


def at_least(option: str, least: int) -> str:
    return invalid(option, f"Input should be greater than or equal to {least}")


def at_most(option: str, most: int) -> str:
    return invalid(option, f"Input should be less than or equal to {most}")


def not_an_integer(option: str) -> str:
    return invalid(option, "Input should be a valid integer, unable to parse string as an integer")


def control(option: str, what: str) -> str:
    return invalid(option, f"{what} contains a control character")


def empty_or_long(option: str, what: str) -> str:
    return invalid(option, f"{what} must be a non-empty string of at most 255 characters")


def not_a_status(value: str) -> str:
    return invalid("'--status'", f"Value error, {value!r} is not one of {STATUSES}.")


def not_a_time(option: str, value: str) -> str:
    return invalid(option, f"not an ISO 8601 time with its zone: {value!r}")


def not_a_key_name(option: str, value: str) -> str:
    return invalid(option, f"{KEY_NAME}; got {value!r}")


SUBMIT = ["submit", "--agent", "scripted", "--prompt", "hi"]
CASES = [
    # turnkeeper runs: every filter and the paging
    (["runs", "--status", "bogus"], not_a_status("bogus")),
    (["runs", "--status", "RUNNING"], not_a_status("RUNNING")),
    (["runs", "--limit", "-1"], at_least("'--limit'", 1)),
    (["runs", "--limit", "0"], at_least("'--limit'", 1)),
    (["runs", "--limit", "1001"], at_most("'--limit'", 1000)),
    (["runs", "--limit", "1.5"], not_an_integer("'--limit'")),
    (["runs", "--offset", "-1"], at_least("'--offset'", 0)),
    (["runs", "--offset", "garbage"], not_an_integer("'--offset'")),
    (["runs", "--offset", "٣"], not_an_integer("'--offset'")),  # another script's digit
    (["runs", "--offset", "10000001"], at_most("'--offset'", 10_000_000)),
    (["runs", "--search", ""], empty_or_long("'--search'", "search")),
    (["runs", "--search", "a\x01b"], control("'--search'", "search")),
    (["runs", "--session", TOO_LONG], empty_or_long("'--session'", "session_id")),
    (["runs", "--agent", "\x1b[31m"], control("'--agent'", "agent")),
    (["runs", "--key", "bad name"], not_a_key_name("'--key'", "bad name")),
    (["runs", "--key", "-"], not_a_key_name("'--key'", "-")),
    (["runs", "--bogus"], "No such option: --bogus"),
    (["runs", "--created-since", "yesterday"], not_a_time("'--created-since'", "yesterday")),
    (
        ["runs", "--finished-until", "2026-01-01T00:00"],
        not_a_time("'--finished-until'", "2026-01-01T00:00"),
    ),
    (["runs", "--created-until", "9" * 50], not_a_time("'--created-until'", "9" * 40)),
    # turnkeeper sessions
    (["sessions", "--limit", "0"], at_least("'--limit'", 1)),
    (["sessions", "--offset", "-5"], at_least("'--offset'", 0)),
    (["sessions", "--key", "x y"], not_a_key_name("'--key'", "x y")),
    (["sessions", "--search", "\n"], control("'--search'", "search")),
    # turnkeeper transcript SESSION: odd characters are fine, these are not
    (["transcript"], "Missing argument 'SESSION'."),
    (["transcript", ""], empty_or_long("'SESSION'", "session_id")),
    (["transcript", "chat\x1b[2J"], control("'SESSION'", "session_id")),
    (["transcript", "a\tb"], control("'SESSION'", "session_id")),
    (["transcript", TOO_LONG], empty_or_long("'SESSION'", "session_id")),
    # the run commands
    (["status"], "Missing argument 'RUN_ID'."),
    (["status", ""], empty_or_long("'RUN_ID'", "run_id")),
    (["status", "run\x1f"], control("'RUN_ID'", "run_id")),
    (["tail", "x", "--from", "-1"], at_least("'--from'", 0)),
    (["tail", "x\x7f"], control("'RUN_ID'", "run_id")),
    (["cancel", TOO_LONG], empty_or_long("'RUN_ID'", "run_id")),
    (["chat", "s\x07"], control("'SESSION'", "session_id")),
    ([*SUBMIT, "--as", "bad name"], not_a_key_name("'--as'", "bad name")),
    ([*SUBMIT, "--session", "s\n"], control("'--session'", "session_id")),
    ([*SUBMIT, "--run-id", TOO_LONG], empty_or_long("'--run-id'", "run_id")),
    ([*SUBMIT, "--from-entry", ""], empty_or_long("'--from-entry'", "parent_entry_id")),
]


@pytest.mark.parametrize(("args", "error"), CASES, ids=[" ".join(a)[:40] for a, _ in CASES])
def test_a_hostile_command_line_is_a_usage_error(args: list[str], error: str) -> None:
    result = turnkeeper(*args)
    expected = usage_error(args[0], error)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", expected)


def test_an_unknown_command_and_a_missing_value_are_usage_errors() -> None:
    unknown = turnkeeper("nope")
    no_command = (
        "Usage: turnkeeper [OPTIONS] COMMAND [ARGS]...\n"
        "Try 'turnkeeper --help' for help.\n\n"
        "Error: No such command 'nope'.\n"
    )
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (2, "", no_command)
    missing = turnkeeper("runs", "--search")
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        2,
        "",
        "Error: Option '--search' requires an argument.\n",
    )
