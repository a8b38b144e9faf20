"""Crash detection under attack: blips that meet a slow owner, restarts, collisions.

Each test here is one way a live owner could be mistaken for a dead one (a false
takeover) or a dead one missed, against real Postgres, Redis and worker processes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_crash_takeover import DEFAULT_TIMING, attempts, mid_run
from tests.driver.test_takeover import AGENT, PROMPT, _assert_log_is_oracle, _assert_transcript_once
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus


@pytest.fixture
def default_fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet.create(settings, tmp_path / "logs", **DEFAULT_TIMING)
    try:
        yield fleet
    finally:
        fleet.stop()


def _terminate_lock_session(fleet: Fleet, owner: str) -> int:
    with psycopg.connect(fleet.settings.require_database_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = left(%s, 63)",
            (f"turnkeeper-locks {owner}",),
        ).fetchall()
    return len(rows)


def test_a_lock_session_ended_while_its_owner_is_frozen_is_no_crash(
    default_fleet: Fleet, tmp_path: Path
) -> None:
    """The server ends the owner's lock session (an operator, ``idle_session_timeout``)
    and the owner cannot take its lock back for 1.5 s (CPU-starved, a long GC pause,
    here SIGSTOP): its lease is fresh and it lives, so the run stays with it."""
    fleet = default_fleet
    fleet.start_pair()
    fleet.wait_ready()
    slow = {**AGENT, "pace": 0.1}
    run = fleet.client.submit(slow, PROMPT)
    owned = mid_run(fleet, run.run_id, chunks=6)
    assert owned.owner is not None
    pgid = os.getpgid(int(owned.owner.rsplit(":", 1)[1]))
    os.killpg(pgid, signal.SIGSTOP)
    try:
        assert _terminate_lock_session(fleet, owned.owner) == 1
        # Frozen until the watcher saw the lock free, waited its grace and looked twice.
        _wait_logged(fleet, "beat-*.log", "crash.owner_alive", owned.attempt_id, count=2)
    finally:
        os.killpg(pgid, signal.SIGCONT)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert attempts(fleet, run.run_id) == [(1, "completed", None)], fleet.dump_logs()
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)


def _logged(fleet: Fleet, pattern: str, event: str, needle: str | None) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in fleet.logs.glob(pattern)
        for line in path.read_text(errors="replace").splitlines()
        if line.startswith("{") and f'"{event}"' in line and (needle or "") in line
    ]


def _wait_logged(
    fleet: Fleet, pattern: str, event: str, needle: str | None, count: int = 1
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
    while len(found := _logged(fleet, pattern, event, needle)) < count:
        assert time.monotonic() < deadline, fleet.dump_logs()
        time.sleep(0.05)
    return found
