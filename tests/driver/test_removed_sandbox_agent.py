"""A sandbox removed under a living agent: the continuation starts once that agent is dead.

A provider calls a sandbox gone when its directory is missing. Removing a directory
kills nothing: an agent whose sandbox was removed under it (an operator's ``rm -rf``, a
disk remounted) runs on, its working directory a deleted one. The run then goes on in a
new sandbox (docs/architecture.md, "A loss seen late"), and the agent that continues it
must not run beside the first: at most one agent process is alive per run. The
continuation holds itself after its first line, so the test looks at the first agent
while the second one runs.

Two moments of the removal: while the successor is held between its classification
(ATTACH) and its attach (the failpoint ``classified``), and before the successor looks
at all (it classifies LOST). Each on the default jail (bwrap: the agent is found again
by its cgroup) and over ssh (by its working directory on the sandbox host).
"""

from __future__ import annotations

import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.driver.fleet import (
    _HOLD,
    Fleet,
    _held,
    chunks_while_held,
    expected_log,
    held_agent,
    release_held,
    wait_held,
)
from tests.driver.test_sandbox_loss import _assert_consistent, _assert_every_call_answered_once
from tests.driver.test_takeover import AGENT, PROMPT
from tests.sshd import Sshd, sshd_unavailable
from tests.unavailable import cannot_run
from turnkeeper.config import Settings
from turnkeeper.driver.placement import Placement
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.workers.failpoints import release

HELD_LINES = 20
"""The first agent holds itself after this many lines: the owner dies mid-run."""


@pytest.fixture(params=["bwrap", "ssh"])
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The settings of a fleet whose sandboxes the provider under test makes."""
    if request.param == "bwrap":
        yield {}
        return
    cannot_run(sshd_unavailable())
    sshd = Sshd(tmp_path / "sshd")
    sshd.start()
    try:
        yield {"sandbox_provider": "ssh", **sshd.settings()}
    finally:
        sshd.stop()


class HeldRun:
    """A run whose first agent is held after ``HELD_LINES`` lines, all of them in its
    log, and whose continuation (the agent's own) holds itself after its first line."""

    def __init__(self, fleet: Fleet, run_id: str) -> None:
        self.first = uuid.uuid4().hex
        self.second = uuid.uuid4().hex
        spec = held_agent(AGENT, self.first, HELD_LINES)
        spec["continue"] = [sys.executable, "-c", _HOLD, self.second, "1", *spec["continue"]]
        fleet.client.submit(spec, PROMPT, run_id=run_id)
        wait_held(self.first)
        logs = fleet.logs / f"held-{run_id}"
        fleet.wait_chunks(run_id, chunks_while_held(run_id, AGENT, PROMPT, HELD_LINES, logs))
        self.run = fleet.client.require(run_id)
        self.first_agents = [proc.pid for proc in _held(self.first)]
        assert self.first_agents, "the first agent runs"

    def remove_sandbox(self) -> None:
        """The sandbox's directory goes; its processes are left as they are."""
        shutil.rmtree(Path(self.run.sandbox_ref["sandbox"]["root"]))  # type: ignore[index]

    def first_agents_alive(self) -> list[int]:
        alive = []
        for pid in self.first_agents:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                continue
        return alive

    def kill_held(self) -> None:
        for proc in _held(self.first) + _held(self.second):
            proc.kill()


def _assert_continued_alone(fleet: Fleet, held: HeldRun, tmp_path: Path) -> None:
    """While the continuation's agent runs the first is dead; the run then completes
    with one interruption, in a new sandbox, as a continuation does."""
    wait_held(held.second)
    assert held.first_agents_alive() == [], "two agents for one run"
    release_held(held.second)
    run = held.run
    done = fleet.wait_settled(run.run_id, timeout=180)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    journals = [(j.handle.paths.process, j.lost) for j in Placement.of(done).journals]
    assert journals == [(1, "sandbox-lost"), (1, None)]
    oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / run.run_id)
    chunks = _assert_consistent(fleet.log_of(run.run_id), oracle)
    _assert_every_call_answered_once(chunks)
    assert chunks[-1] == oracle[-1]


def _ended_before_continuing(fleet: Fleet, run: Run) -> list[str]:
    """The successor's steps from the loss on: the given-up process's sandbox ended
    before the give-up (and the continuation's journal) is recorded."""
    names = ("journal.lost", "sandbox.lost_ended", "journal.given_up", "run.continuing")
    return [e["event"] for e in fleet.events(*names, run_id=run.run_id)]


@pytest.mark.slow
def test_the_agent_of_a_sandbox_removed_before_the_attach_is_dead_before_its_continuation(
    settings: Settings, provider: dict[str, Any], tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="classified=pause", **provider)
    held: HeldRun | None = None
    try:
        fleet.start_pair()
        fleet.wait_ready()
        held = HeldRun(fleet, "removed-at-attach")
        fleet.signal_worker_of(held.run, signal.SIGKILL)
        fleet.wait_failpoint("classified")
        held.remove_sandbox()
        release(fleet.settings, "classified")
        _assert_continued_alone(fleet, held, tmp_path)
        classified = fleet.events("takeover.classified", run_id=held.run.run_id)
        assert [e["action"] for e in classified] == ["attach"]
        assert _ended_before_continuing(fleet, held.run) == [
            "journal.lost",
            "sandbox.lost_ended",
            "journal.given_up",
            "run.continuing",
        ]
    finally:
        if held is not None:
            held.kill_held()
        fleet.stop()


@pytest.mark.slow
def test_the_agent_of_a_sandbox_removed_before_the_takeover_is_dead_before_its_continuation(
    settings: Settings, provider: dict[str, Any], tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", **provider)
    held: HeldRun | None = None
    try:
        fleet.start_pair()
        fleet.wait_ready()
        held = HeldRun(fleet, "removed-before-takeover")
        # Frozen first, so that the owner cannot see its sandbox go.
        fleet.signal_worker_of(held.run, signal.SIGSTOP)
        held.remove_sandbox()
        fleet.signal_worker_of(held.run, signal.SIGKILL)
        _assert_continued_alone(fleet, held, tmp_path)
        classified = fleet.events("takeover.classified", run_id=held.run.run_id)
        assert [e["action"] for e in classified] == ["lost"]
        assert _ended_before_continuing(fleet, held.run) == [
            "journal.lost",
            "sandbox.lost_ended",
            "journal.given_up",
            "run.continuing",
        ]
    finally:
        if held is not None:
            held.kill_held()
        fleet.stop()
