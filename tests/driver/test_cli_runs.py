"""The operator's commands on a real fleet: submit, tail, status, runs, cancel, sweeps."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.cli.output import usage_error
from tests.driver.fleet import Fleet, expected_log
from turnkeeper.config import default_host_id
from turnkeeper.sandbox.command import MAX_ARGUMENT_BYTES

TURNKEEPER = [sys.executable, "-m", "turnkeeper"]
AGENT = {"preset": "scripted", "turns": 2, "pace": 0.02, "seed": 4}


def cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TURNKEEPER, *args],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_submit_prints_only_the_run_id_and_tail_json_is_the_log(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.start_worker()
    submitted = cli(
        fleet, "submit", "--agent", "scripted", "--prompt", "hello", "--run-id", "cli-1"
    )
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout == "cli-1\n"

    tailed = cli(fleet, "tail", "cli-1", "--json")  # follows until the log closes
    assert tailed.returncode == 0, tailed.stderr
    lines = [json.loads(line) for line in tailed.stdout.splitlines()]
    oracle = expected_log("cli-1", "cli-1", {"preset": "scripted"}, "hello", tmp_path / "o")
    assert lines == [{"seq": i + 1, "chunk": c} for i, c in enumerate(oracle)]

    later = cli(fleet, "tail", "cli-1", "--json", "--no-follow", "--from", str(len(oracle) - 2))
    assert [json.loads(line)["seq"] for line in later.stdout.splitlines()] == [
        len(oracle) - 1,
        len(oracle),
    ]

    status = cli(fleet, "status", "cli-1", "--json")
    info = json.loads(status.stdout)
    assert {k: info[k] for k in ("status", "phase", "epoch", "attempt_count", "error")} == {
        "status": "completed",
        "phase": "committed",
        "epoch": 1,
        "attempt_count": 1,
        "error": None,
    }
    assert set(info) >= {"owner", "lease_expires_at"}
    # The placement's host: the worker's TURNKEEPER_HOST_ID (its hostname by default).
    assert info["host"] == fleet.settings.host_id == default_host_id()
    assert info["takeovers"] == {"crash": 0, "lease": 0}

    table = cli(fleet, "runs")
    assert "cli-1" in table.stdout
    assert "completed" in table.stdout


def test_submit_runs_an_agent_of_the_catalog_by_name(fleet: Fleet, tmp_path: Path) -> None:
    """With TURNKEEPER_AGENTS_FILE, ``--agent`` names its agents as over HTTP: the worker
    reads the key file at spawn, the request may set only what ``request_env`` lists."""
    key = tmp_path / "greeting.key"
    key.write_text("from-a-file\n")
    agents = tmp_path / "agents.toml"
    agents.write_text(
        "[agents.greeter]\n"
        """command = ["sh", "-c", 'printf "%s %s\\n" "$GREETING" "$NAME"']\n"""
        'format = "text"\n'
        f'env_files = {{ GREETING = "{key}" }}\n'
        'request_env = ["NAME"]\n'
    )
    fleet.env["TURNKEEPER_AGENTS_FILE"] = str(agents)
    fleet.start_worker()
    submitted = cli(
        fleet,
        "submit",
        "--agent",
        "greeter",
        "--env",
        "NAME=bob",
        "--run-id",
        "g",
        "--prompt",
        "hi",
    )
    assert submitted.returncode == 0, submitted.stderr
    tailed = cli(fleet, "tail", "g", "--json")
    said = [json.loads(line)["chunk"].get("delta") for line in tailed.stdout.splitlines()]
    assert "from-a-file bob" in "".join(d for d in said if isinstance(d, str))
    run = fleet.wait_settled("g")
    assert run.status.value == "completed", run.error
    assert run.payload["agent"]["env_files"] == {"GREETING": str(key)}
    assert "from-a-file" not in json.dumps(run.payload)
    for args, message in [
        (["--env", "GREETING=x"], "agent 'greeter' fixes the env variable(s) GREETING"),
        (["--env", "PATH=/tmp"], "may set only the env names its catalog entry lists"),
    ]:
        refused = cli(fleet, "submit", "--agent", "greeter", "--prompt", "hi", *args)
        assert refused.returncode == 1
        assert message in refused.stderr, refused.stderr
    unknown = cli(fleet, "submit", "--agent", "nope", "--prompt", "hi")
    assert unknown.stderr == (
        "error: unknown agent 'nope'; the catalog has: claude-code, codex, greeter, scripted\n"
    )


def test_the_same_run_id_with_another_request_is_a_one_line_error(fleet: Fleet) -> None:
    first = cli(fleet, "submit", "--agent", "scripted", "--prompt", "hi", "--run-id", "dup")
    assert first.returncode == 0, first.stderr
    again = cli(fleet, "submit", "--agent", "scripted", "--prompt", "other", "--run-id", "dup")
    assert again.returncode == 1
    assert again.stderr == (
        "error: run id 'dup' is taken by a run of another request (its agent, prompt or "
        "options differ); choose another run id, or send that request again (run_id=dup)\n"
    )


def test_bad_requests_are_one_line_errors(fleet: Fleet) -> None:
    """What cannot be done is exit 1, one line; a command line that is wrong (what the
    HTTP API refuses with 400) is exit 2: a usage error."""
    missing = "error: no run has the id 'missing' (run_id=missing)\n"
    for args in (["status", "missing"], ["tail", "missing"], ["cancel", "missing"]):
        result = cli(fleet, *args)
        assert (result.returncode, result.stdout, result.stderr) == (1, "", missing), args
    unknown = cli(fleet, "submit", "--agent", "nope", "--prompt", "hi")
    refused = "error: unknown agent preset 'nope'; known: scripted, claude-code, codex\n"
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (2, "", refused)
    usage = [
        (["--prompt", "hi"], "'--agent' / '--command': give exactly one of them"),
        (
            ["--agent", "scripted", "--command", "true", "--prompt", "hi"],
            "'--agent' / '--command': give exactly one of them",
        ),
        (
            ["--agent", "scripted", "--prompt", "hi", "--env", "NOVALUE"],
            "'--env': expects KEY=VALUE, got 'NOVALUE'",
        ),
        (
            ["--command", "sh -c 'unclosed", "--prompt", "hi"],
            "'--command': cannot split it: No closing quotation",
        ),
    ]
    for args, error in usage:
        result = cli(fleet, "submit", *args)
        expected = usage_error("submit", f"Invalid value for {error}")
        assert (result.returncode, result.stdout, result.stderr) == (2, "", expected), args


def _usage_error(stderr: str) -> str:
    """The words of a usage error, without the box a terminal library may draw."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", stderr).split())


def test_a_prompt_the_agent_cannot_take_is_a_usage_error(fleet: Fleet) -> None:
    """No prompt, an empty one, or one that is not text (argv bytes that are not UTF-8)
    is refused before anything is admitted, as a usage error of ``--prompt`` (exit 2).
    The agent's argument limit is the kernel's limit on one argument of this command
    too: a prompt exactly at it, in bytes, is admitted."""
    empty = (
        "Invalid value for '--prompt': the prompt is empty: give the agent the input of its turn"
    )
    not_text = (
        "Invalid value for '--prompt': the prompt is not UTF-8 text: it holds a lone surrogate"
    )
    cases: list[tuple[list[str | bytes], str]] = [
        ([], empty),
        (["--prompt", ""], empty),
        (["--prompt", " \n\t"], empty),
        (["--command", "true", "--prompt", ""], empty),
        (["--prompt", b"caf\xe9"], not_text),
    ]
    for args, message in cases:
        agent: list[str | bytes] = [] if "--command" in args else ["--agent", "scripted"]
        result = subprocess.run(
            [*TURNKEEPER, "submit", *agent, *args],
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (result.returncode, result.stdout) == (2, ""), (args, result.stderr)
        assert message in _usage_error(result.stderr), (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert fleet.client.list_runs() == []
    for run_id, prompt in (
        ("at-limit", "x" * MAX_ARGUMENT_BYTES),
        ("at-limit-umlauts", "ü" * (MAX_ARGUMENT_BYTES // 2) + "x"),
    ):
        assert len(prompt.encode()) == MAX_ARGUMENT_BYTES
        result = cli(fleet, "submit", "--agent", "scripted", "--prompt", prompt, "--run-id", run_id)
        assert (result.returncode, result.stdout) == (0, f"{run_id}\n"), result.stderr
        assert fleet.client.require(run_id).payload["prompt"] == prompt


def test_cancel_and_the_sweeps_once(fleet: Fleet) -> None:
    queued = cli(fleet, "submit", "--agent", "scripted", "--prompt", "hi", "--run-id", "to-cancel")
    assert queued.returncode == 0
    cancelled = cli(fleet, "cancel", "to-cancel")
    assert cancelled.stdout == "to-cancel aborted\n"
    for sweep, fields in [
        ("reconcile", "taken_over=0 redispatched=0 failed=0 requeued=0 rerouted=0"),
        ("reap", "destroyed=0 orphans=0 logs_ended=0"),  # a queued run never had a sandbox
        ("prune", "0"),
    ]:
        result = cli(fleet, sweep, "--once")
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"{sweep}: {fields}\n"
