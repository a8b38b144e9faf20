"""The operator's commands on a real fleet: submit, tail, status, runs, cancel, sweeps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.driver.fleet import Fleet, expected_log
from turnkeeper.config import default_host_id

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


def test_the_same_run_id_with_another_request_is_a_one_line_error(fleet: Fleet) -> None:
    assert cli(fleet, "submit", "--agent", "scripted", "--run-id", "dup").returncode == 0
    again = cli(fleet, "submit", "--agent", "scripted", "--prompt", "other", "--run-id", "dup")
    assert again.returncode == 1
    assert again.stderr.startswith("error: run 'dup' already exists")
    assert again.stderr.count("\n") == 1


def test_bad_requests_are_one_line_errors(fleet: Fleet) -> None:
    cases = [
        (["submit"], "give exactly one of --agent PRESET or --command CMD"),
        (["submit", "--agent", "nope"], "unknown agent preset"),
        (["submit", "--agent", "scripted", "--env", "NOVALUE"], "--env expects KEY=VALUE"),
        (["status", "missing"], "no run has the id 'missing'"),
        (["tail", "missing"], "no run has the id 'missing'"),
        (["cancel", "missing"], "no run has the id 'missing'"),
    ]
    for args, message in cases:
        result = cli(fleet, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr


def test_cancel_and_the_sweeps_once(fleet: Fleet) -> None:
    queued = cli(fleet, "submit", "--agent", "scripted", "--run-id", "to-cancel")
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
