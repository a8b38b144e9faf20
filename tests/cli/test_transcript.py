"""``turnkeeper transcript`` and ``turnkeeper status`` on runs a worker ran: the entry
ids a branch needs, the tree a branch makes, the same document as
``GET /sessions/{id}``; a settled run's status without its lease, its error in words."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import quote

import httpx
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer

SESSION = "odd/s ü?#%"  # what an id may hold: a path's slash, a space, a query's marks
REPLY = ["sh", "-c", 'echo "reply to: $0"', "{prompt}"]
# Its stderr holds an escape sequence: a hostile agent's, which a terminal would obey.
FAIL = ["sh", "-c", "printf 'oops\\033[2J\\n' >&2; echo twice >&2; exit 3"]


@pytest.fixture
def admin(web: WebServer, api_keys: ApiKeys) -> Iterator[httpx.Client]:
    with web.http(api_keys.admin) as client:
        yield client


def _cli(fleet: Fleet, *args: str, code: int = 0) -> str:
    result = fleet.run_cli(*args)
    assert (result.returncode, result.stderr) == (code, ""), (args, result.stderr)
    return result.stdout


def _submit(fleet: Fleet, run_id: str, prompt: str, *extra: str) -> None:
    command = shlex.join(REPLY)
    args = ["--command", command, "--session", SESSION, "--run-id", run_id, "--prompt", prompt]
    assert _cli(fleet, "submit", *args, *extra) == f"{run_id}\n"
    assert json.loads(_cli(fleet, "tail", run_id, "--json").splitlines()[-1])["chunk"]["type"] == (
        "RUN_FINISHED"
    )


def test_transcript_shows_the_entry_ids_a_branch_takes(fleet: Fleet, admin: httpx.Client) -> None:
    fleet.start_worker()
    _submit(fleet, "t-1", "hello")
    _submit(fleet, "t-2", "again")
    before = _cli(fleet, "transcript", SESSION)
    assert before == (
        f"session {SESSION}: 4 entries of 2 run(s); * marks the path the next message follows\n"
        "   entry                 kind       text\n"
        "*  t-1/input             user       hello\n"
        "*  t-1/turn-0/assistant  assistant  reply to: hello\n"
        "*  t-2/input             user       again\n"
        "*  t-2/turn-0/assistant  assistant  reply to: again\n"
    )
    # The id shown is what --from-entry takes: a retry of t-2's message, from t-1's reply.
    _submit(fleet, "t-3", "retry", "--from-entry", "t-1/turn-0/assistant")
    after = _cli(fleet, "transcript", SESSION)
    assert after == (
        f"session {SESSION}: 6 entries of 3 run(s); * marks the path the next message follows\n"
        "   entry                   kind       text\n"
        "*  t-1/input               user       hello\n"
        "*  t-1/turn-0/assistant    assistant  reply to: hello\n"
        "   ├ t-2/input             user       again\n"
        "   │ t-2/turn-0/assistant  assistant  reply to: again\n"
        "*  └ t-3/input             user       retry\n"
        "*    t-3/turn-0/assistant  assistant  reply to: retry\n"
    )
    tree = json.loads(_cli(fleet, "transcript", SESSION, "--json"))
    answer = admin.get(f"/sessions/{quote(SESSION, safe='')}")
    assert answer.status_code == 200, answer.text
    assert tree == answer.json()
    assert tree["active_path"] == [
        "t-1/input",
        "t-1/turn-0/assistant",
        "t-3/input",
        "t-3/turn-0/assistant",
    ]

    missing = fleet.run_cli("transcript", "no such session")
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        1,
        "",
        "error: no session has the id 'no such session' (session_id=no such session)\n",
    )


def test_status_of_a_settled_run_says_its_error_in_words(fleet: Fleet) -> None:
    fleet.start_worker()
    command = shlex.join(FAIL)
    assert _cli(fleet, "submit", "--command", command, "--run-id", "f-1", "--prompt", "x") == (
        "f-1\n"
    )
    fleet.run_cli("tail", "f-1")  # until the log closes (exit 1: the run failed)
    run = fleet.wait_settled("f-1")
    assert run.owner is not None
    assert run.started_at is not None
    assert run.finished_at is not None

    def at(value: datetime) -> str:
        return value.astimezone(UTC).isoformat()

    assert _cli(fleet, "status", "f-1") == (
        "run_id              f-1\n"
        "session_id          f-1\n"
        "status              failed\n"
        "phase               committed\n"
        "epoch               1\n"
        "attempt_count       1\n"
        "max_attempts        5\n"
        f"owner               {run.owner}\n"
        f"host                {run.sandbox_host}\n"
        "cancel_requested_at -\n"
        f"created_at          {at(run.created_at)}\n"
        f"started_at          {at(run.started_at)}\n"
        f"finished_at         {at(run.finished_at)}\n"
        "error               agent-exit: the agent exited with code 3\n"
        "  stderr            oops\\x1b[2J\n"
        "                    twice\n"
        "  exit_code         3\n"
        "waiting_behind      -\n"
        "takeovers           crash 0, lease 0\n"
    )
    # --json keeps every field as the store has it, the error as its object.
    info = json.loads(_cli(fleet, "status", "f-1", "--json"))
    assert info["error"] == {
        "reason": "agent-exit",
        "message": "the agent exited with code 3",
        "exit_code": 3,
        "stderr": "oops\x1b[2J\ntwice\n",
    }
    assert info["lease_expires_at"] == (
        at(run.lease_expires_at) if run.lease_expires_at is not None else None
    )


def test_submit_follow_names_its_run_once(fleet: Fleet) -> None:
    """The run's id comes with its first chunk; nothing printed it before as well."""
    fleet.start_worker()
    command = shlex.join(REPLY)
    args = ["--command", command, "--run-id", "followed", "--prompt", "hi", "--follow"]
    assert _cli(fleet, "submit", *args) == "● run followed\n\nreply to: hi\n\n● finished\n"
