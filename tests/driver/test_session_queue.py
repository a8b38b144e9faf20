"""One active run per session: a follow-up submitted to a busy session waits behind the
active run, in admission order, and starts when the run ahead settles, never beside it
(docs/architecture.md, "One run of a session at a time")."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import Fleet, expected_log, follow_up_prompt
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus

# Runs until the test opens its gate, a file in the session's workspace.
GATED: dict[str, Any] = {
    "command": ["sh", "-c", "while [ ! -e gate ]; do sleep 0.05; done; echo opened"],
    "format": "text",
}
AGENT: dict[str, Any] = {"preset": "scripted", "turns": 2, "pace": 0.05, "seed": 9}


def _status(fleet: Fleet, run_id: str) -> tuple[str, int | None]:
    done = fleet.run_cli("status", run_id, "--json")
    assert done.returncode == 0, done.stderr
    info: dict[str, Any] = json.loads(done.stdout)
    return info["status"], info["waiting_behind"]


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    """No stale sweep within the test: only the settle of the run ahead starts a follow-up."""
    fleet = Fleet.create(settings, tmp_path / "logs", requeue_after=600.0)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.mark.slow
def test_a_follow_up_waits_for_the_active_run_and_then_runs(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    fleet.start_worker()  # a free slot: only the session keeps the follow-ups waiting
    fleet.start_beat()
    fleet.wait_ready()  # the follow-ups' own messages are taken (and refused) at once
    first = fleet.client.submit(GATED, "one", session_id="chat")
    fleet.wait(first.run_id, lambda r: r.sandbox_ref is not None, what="a sandbox")
    second = fleet.client.submit(AGENT, "two", session_id="chat")
    third = fleet.client.submit(AGENT, "three", session_id="chat")
    assert [_status(fleet, run.run_id) for run in (first, second, third)] == [
        ("running", None),
        ("queued", 1),
        ("queued", 2),
    ]
    workspace = fleet.client.store.session_workspace("chat")
    assert workspace is not None
    assert workspace.sandbox is not None
    (Path(str(workspace.sandbox["root"])) / "workspace" / "gate").touch()

    runs = [fleet.wait_settled(run.run_id) for run in (first, second, third)]
    assert [r.status for r in runs] == [RunStatus.COMPLETED] * 3, fleet.dump_logs()
    for before, after in itertools.pairwise(runs):
        assert before.finished_at is not None
        assert after.started_at is not None
        assert after.started_at >= before.finished_at, "never beside the run ahead"
    assert [r.epoch for r in runs] == [1, 1, 1], "each claimed once"
    workdir = tmp_path / "oracle"
    workdir.mkdir()
    (workdir / "gate").touch()
    earlier: list[tuple[str, list[Any]]] = []
    for run, agent, prompt in zip(
        runs, (GATED, AGENT, AGENT), ("one", "two", "three"), strict=True
    ):
        given = follow_up_prompt(prompt, earlier) if agent is AGENT else prompt
        oracle = expected_log(run.run_id, "chat", agent, given, workdir)
        assert [chunk for _, chunk in fleet.log_of(run.run_id)] == oracle
        earlier.append((prompt, oracle))
    # Two workers' logs: in the order they were written.
    started = sorted(fleet.events("run.next_in_session"), key=lambda e: e["timestamp"])
    assert [(e["run_id"], e["after"]) for e in started] == [
        (second.run_id, first.run_id),
        (third.run_id, second.run_id),
    ]
