"""A takeover that starts the agent anew leaves no way for the old owner's agent to run.

The owner records an agent process's journal before it starts the process, and asks
the store (a renewal) right before the start. A successor that finds the journal
never started (classified START) starts the agent itself. In the same sandbox the
shared journal keeps the two to one agent (the exclusive create of its prepare). Two
cases start it elsewhere, and there the successor must first make sure that nothing
of the old journal runs or will run (docs/architecture.md, "Journals that never
started", "A loss seen late"):

- the successor's worker starts runs in a stronger jail than the owner's sandbox
  (``bwrap`` for a ``local`` sandbox), so it makes a new sandbox, while the owner is
  paused past its lease between its renewal and its prepare (the failpoint
  ``lease-confirmed``): woken, the owner must find its journal claimed and start
  nothing;
- the owner's sandbox directory is removed after its agent started and before the
  start was recorded (the failpoint ``spawned``): the successor, which cannot see the
  agent, must end it before its own starts.

Real workers, real agents; every log is compared with the oracle element by element.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import psutil

from tests.driver.fleet import (
    Fleet,
    _held,
    agents_under,
    expected_log,
    held_agent,
    release_held,
)
from tests.driver.test_takeover import AGENT, PROMPT
from turnkeeper.config import Settings
from turnkeeper.driver.placement import NEVER_STARTED, Placement
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.workers.failpoints import release

HELD_LINES = 3


def _root(run: Run) -> Path:
    assert run.sandbox_ref is not None
    return Path(run.sandbox_ref["sandbox"]["root"])


def _journals(run: Run) -> list[tuple[str, int, str | None]]:
    return [
        (j.handle.ref.provider, j.handle.paths.process, j.lost) for j in Placement.of(run).journals
    ]


def _live(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_an_owner_paused_past_its_lease_before_its_prepare_starts_no_agent(
    settings: Settings, tmp_path: Path
) -> None:
    owner = Fleet.create(
        settings, tmp_path / "owner", sandbox_provider="local", failpoints="lease-confirmed=pause"
    )
    successor = Fleet.create(settings, tmp_path / "successor", sandbox_provider="bwrap")
    token = uuid.uuid4().hex
    pgid: int | None = None
    try:
        owner.start_worker()
        run = owner.client.submit(held_agent(AGENT, token, HELD_LINES), PROMPT)
        owner.wait_failpoint("lease-confirmed")
        owned = owner.client.require(run.run_id)
        old_root = _root(owned)
        assert _journals(owned) == [("local", 1, None)]
        # Frozen: its heartbeat stops too, and its lease runs out on the database's clock.
        pgid = owner.signal_worker_of(owned, signal.SIGSTOP)
        successor.start_worker()
        successor.start_beat()
        # The successor's agent runs (held), in a sandbox of its own: the run is not
        # settled, so nothing reaps the owner's sandbox yet.
        successors = _wait_held_pids(token, exclude=[])
        classified = successor.events("takeover.classified", run_id=run.run_id)
        assert [e["action"] for e in classified] == ["start"]
        assert agents_under(old_root) == []
        # Woken and let go on: it prepares its journal in its own sandbox.
        os.killpg(pgid, signal.SIGCONT)
        release(owner.settings, "lease-confirmed")
        owner.wait_events("attempt.stopped", run_id=run.run_id, timeout=120)
        assert owner.events("journal.spawned", run_id=run.run_id) == [], owner.dump_logs()
        assert agents_under(old_root) == []
        assert sorted(p.pid for p in _held(token)) == sorted(successors)
        release_held(token)
        done = successor.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, successor.dump_logs())
        assert len(successor.events("journal.spawned", run_id=run.run_id)) == 1
        assert [(e, o) for e, o, _ in successor.attempts(run.run_id)] == [
            (1, "superseded"),
            (2, "completed"),
        ]
        assert _journals(done) == [("local", 1, NEVER_STARTED), ("bwrap", 1, None)]
        stored = successor.log_of(run.run_id)
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
        oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "oracle")
        assert [chunk for _, chunk in stored] == oracle
    finally:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
        for proc in _held(token):
            proc.kill()
        successor.stop()
        owner.stop()


def test_an_agent_started_unrecorded_in_a_removed_sandbox_is_dead_before_the_restart(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="spawned")
    token = uuid.uuid4().hex
    try:
        fleet.start_pair()
        fleet.wait_ready()
        run = fleet.client.submit(held_agent(AGENT, token, HELD_LINES), PROMPT)
        fleet.wait_failpoint("spawned")
        owned = fleet.client.require(run.run_id)
        first = _wait_held_pids(token, exclude=[])
        # Its lines are in its journal, none stored: nothing says it started.
        shutil.rmtree(_root(owned))
        fleet.signal_worker_of(owned, signal.SIGKILL)
        second = _wait_held_pids(token, exclude=first)
        assert _live(first) == [], "two agents for one run"
        release_held(token)
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert second
        classified = fleet.events("takeover.classified", run_id=run.run_id)
        assert [e["action"] for e in classified] == ["start"]
        assert [(e, o) for e, o, _ in fleet.attempts(run.run_id)] == [
            (1, "superseded"),
            (2, "completed"),
        ]
        stored = fleet.log_of(run.run_id)
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
        oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "oracle")
        assert [chunk for _, chunk in stored] == oracle
    finally:
        for proc in _held(token):
            proc.kill()
        fleet.stop()


def _wait_held_pids(token: str, exclude: list[int], timeout: float = 120.0) -> list[int]:
    """The pids of the held agents named ``token`` that are not in ``exclude``, once one
    of them has stopped itself (a hang guard)."""
    deadline = time.monotonic() + timeout
    while True:
        procs = [p for p in _held(token) if p.pid not in exclude]
        if any(p.info["status"] == psutil.STATUS_STOPPED for p in procs):
            return [p.pid for p in procs]
        assert time.monotonic() < deadline, f"agent {token} never held"
        time.sleep(0.05)
