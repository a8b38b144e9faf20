"""Cancelling a run: heard by its owner at once, settled at once when nobody drives it.

The fleets here beat their leases every 300 s (a lease lasts 900 s): a cancel that
waited for the owner's next heartbeat would outlast every hang guard, so a run that
settles here was stopped by the cancel's wake-up (``workers/cancel_listener.py``).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.driver.fleet import Fleet, agents_under
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.store.records import RunStatus
from turnkeeper.store.sql.owner_locks import LISTEN_CANCELS, PROBE_LISTENER

SLOW = {"preset": "scripted", "turns": 1000, "pace": 0.05}
"""An agent that talks for about a minute unless it is stopped."""
CANCELLED: Chunk = {"type": "RUN_ERROR", "message": "the run was cancelled", "code": "cancelled"}
GUARD = 60.0  # a hang guard, far below the 300 s a heartbeat would take


def _assert_cancelled(fleet: Fleet, run_id: str) -> None:
    done = fleet.wait_settled(run_id, timeout=GUARD)
    assert done.status is RunStatus.ABORTED, (done.error, fleet.dump_logs())
    assert done.error == {"reason": "cancelled", "message": "the run was cancelled"}
    log = fleet.log_of(run_id)
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    kinds = [chunk["type"] for _, chunk in log]
    assert (kinds.count("RUN_FINISHED"), kinds.count("RUN_ERROR")) == (0, 1)
    assert log[-1][1] == CANCELLED
    assert fleet.client.log.state(run_id).closed


def _talking(fleet: Fleet) -> str:
    """A worker, and a run of the slow talker that has begun to talk: its id."""
    fleet.start_worker()
    run_id = fleet.client.submit(SLOW, "talk").run_id
    fleet.wait_chunks(run_id, 5)
    return run_id


def test_a_cancel_from_the_cli_is_heard_at_once_and_ends_every_agent_process(
    slow_beat_fleet: Fleet,
) -> None:
    fleet = slow_beat_fleet
    run_id = _talking(fleet)
    assert agents_under(fleet.settings.sandboxes_dir), "the agent runs"
    cancel = fleet.run_cli("cancel", run_id)
    assert cancel.returncode == 0, cancel.stderr
    _assert_cancelled(fleet, run_id)
    deadline = time.monotonic() + GUARD  # killed before the settle; gone a moment later
    while agents_under(fleet.settings.sandboxes_dir):
        assert time.monotonic() < deadline, "the agent lives on"
        time.sleep(0.02)
    heard = fleet.events("run.cancel_heard")
    assert [event["run_id"] for event in heard] == [run_id]


def test_a_cancel_while_the_listener_is_cut_off_is_heard_when_it_connects_again(
    slow_beat_fleet: Fleet,
) -> None:
    fleet = slow_beat_fleet
    run_id = _talking(fleet)
    cut = _sql(
        fleet,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE query IN (%s, %s) AND datname = current_database()",
        LISTEN_CANCELS,
        PROBE_LISTENER,
    )
    assert cut == [(True,)], "the worker's one listening connection"
    fleet.client.cancel(run_id)  # perhaps before it listens again: then it pokes all
    _assert_cancelled(fleet, run_id)
    assert len(fleet.events("cancel_listener.disconnected")) >= 1


def test_a_cancel_of_a_run_behind_its_session_settles_it_at_once(slow_beat_fleet: Fleet) -> None:
    fleet = slow_beat_fleet
    fleet.start_worker()
    first = fleet.client.submit({**SLOW, "turns": 6}, "first", session_id="chat")
    fleet.wait_chunks(first.run_id, 3)
    second = fleet.client.submit(SLOW, "second", session_id="chat")
    cancelled = fleet.client.cancel(second.run_id)
    assert cancelled.status is RunStatus.ABORTED
    assert [chunk for _, chunk in fleet.log_of(second.run_id)] == [
        {"type": "RUN_ERROR", "message": "cancelled before it started", "code": "cancelled"}
    ]
    assert fleet.wait_settled(first.run_id, timeout=GUARD).status is RunStatus.COMPLETED


def test_a_cancel_of_a_run_whose_owner_is_gone_settles_it_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    """Its owner froze: its lease ran out, nobody drives it until a takeover adopts it."""
    fleet = Fleet.create(settings, tmp_path / "logs", lease_ttl=2.0, heartbeat_interval=0.5)
    try:
        fleet.start_worker()
        run = fleet.client.submit(SLOW, "talk")
        fleet.wait_chunks(run.run_id, 3)
        fleet.signal_worker_of(fleet.client.require(run.run_id), 19)  # SIGSTOP
        fleet.wait(run.run_id, lambda r: r.lease_expires_at < _sql(fleet, "SELECT now()")[0][0])
        cancelled = fleet.client.cancel(run.run_id)
        assert cancelled.status is RunStatus.ABORTED
        assert cancelled.error == {
            "reason": "cancelled",
            "message": "the run was cancelled and its owner is gone",
        }
        chunks = [chunk for _, chunk in fleet.log_of(run.run_id)]
        assert chunks[-1] == {
            "type": "RUN_ERROR",
            "message": "the run was cancelled and its owner is gone",
            "code": "cancelled",
        }
        assert fleet.client.log.state(run.run_id).closed
    finally:
        fleet.stop()


def _sql(fleet: Fleet, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(plain_postgres_url(fleet.settings.require_database_url())) as conn:
        return conn.execute(statement, params or None).fetchall()


def test_a_cancel_racing_the_agents_end_settles_one_way_and_the_log_says_which(
    fleet: Fleet,
) -> None:
    fleet.start_worker(concurrency=2)
    fleet.wait_ready()
    rng = random.Random(25)
    outcomes = []
    for index in range(12):
        run = fleet.client.submit({"preset": "scripted", "turns": 1, "pace": 0.02}, f"r{index}")
        fleet.wait(run.run_id, lambda r: r.status is not RunStatus.QUEUED, GUARD)
        time.sleep(rng.uniform(0.0, 0.4))  # lands before, during or after the agent's end
        fleet.client.cancel(run.run_id)
        done = fleet.wait_settled(run.run_id, timeout=GUARD)
        log = fleet.log_of(run.run_id)
        assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
        kinds = [chunk["type"] for _, chunk in log]
        assert kinds.count("RUN_FINISHED") + kinds.count("RUN_ERROR") == 1
        if done.status is RunStatus.COMPLETED:
            assert kinds[-1] == "RUN_FINISHED"
        else:
            assert (done.status, log[-1][1]) == (RunStatus.ABORTED, CANCELLED)
        outcomes.append(done.status)
    assert set(outcomes) <= {RunStatus.COMPLETED, RunStatus.ABORTED}
