"""A worker process starts a few agents at a time: the rest wait for a start slot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.store.records import RunStatus, TurnPhase
from turnkeeper.workers.failpoints import release
from turnkeeper.workers.starts import StartSlot

SIZE = 3  # a size no other test of this process uses: the slots are per size


def test_a_fourth_start_waits_until_a_starting_agent_speaks() -> None:
    holders = [StartSlot(SIZE, settle=3600.0) for _ in range(SIZE)]
    for slot in holders:
        slot.take()
    waiting = StartSlot(SIZE, settle=3600.0)
    taken = threading.Event()

    def start() -> None:
        waiting.take()
        taken.set()

    thread = threading.Thread(target=start)
    thread.start()
    try:
        assert not taken.wait(0.3)  # all slots held: it waits
        holders[0].settled(spoke=False)  # silent, and settle not reached: still held
        assert not taken.wait(0.3)
        holders[0].settled(spoke=True)  # the agent spoke: its slot is free
        assert taken.wait(30)  # a hang guard
        assert [slot.held for slot in holders] == [False, True, True]
    finally:
        thread.join(30)
        for slot in [*holders, waiting]:
            slot.release()


def test_release_is_idempotent_and_take_is_reentrant() -> None:
    slot = StartSlot(SIZE, settle=3600.0)
    slot.take()
    slot.take()  # a restart of the same turn: no second slot
    slot.release()
    slot.release()
    others = [StartSlot(SIZE, settle=3600.0) for _ in range(SIZE)]
    for other in others:  # every slot is free again: all three take one at once
        other.take()
    assert all(other.held for other in others)
    for other in others:
        other.release()


def test_a_silent_agent_gives_its_slot_back_after_settle() -> None:
    slot = StartSlot(SIZE, settle=0.2)
    slot.take()
    slot.settled(spoke=False)
    assert slot.held
    time.sleep(0.25)
    slot.settled(spoke=False)
    assert not slot.held


# --- a turn that waits for a slot still hears its cancel and its deadline -------------

AGENT = {"preset": "scripted", "turns": 1, "pace": 0.0, "seed": 3}
DEADLINE = "the run passed its deadline"


@pytest.mark.parametrize("ending", ["cancel", "deadline"])
def test_a_turn_waiting_for_a_start_slot_ends_there_without_an_agent(
    settings: Settings, tmp_path: Path, ending: str
) -> None:
    """One slot, held by a run paused before its spawn: the next run of the process
    waits for it. Its cancel (or its deadline) ends it there, while the slot is still
    held: settled with the cancel's (the deadline's) final chunk, no agent started. The
    held run then starts and completes."""
    fleet = Fleet.create(
        settings, tmp_path / "logs", start_concurrency=1, failpoints="before-spawn=pause"
    )
    try:
        fleet.start_worker(2, pool="threads")
        fleet.wait_ready()
        holder = fleet.client.submit(AGENT, "hold the slot")
        fleet.wait_failpoint("before-spawn")
        timeout = 2.0 if ending == "deadline" else None
        waiting = fleet.client.submit(AGENT, "wait for it", timeout=timeout)
        fleet.wait(waiting.run_id, lambda r: r.status is RunStatus.RUNNING, what="claimed")
        if ending == "cancel":
            fleet.client.cancel(waiting.run_id)
        done = fleet.wait_settled(waiting.run_id)
        assert fleet.client.require(holder.run_id).status is RunStatus.RUNNING  # still held
        if ending == "cancel":
            final, status = lifecycle.cancelled(), RunStatus.ABORTED
        else:
            final, status = lifecycle.run_error(DEADLINE, "deadline-exceeded"), RunStatus.FAILED
        assert done.status is status, fleet.dump_logs()
        assert [c for _, c in fleet.log_of(done.run_id)] == [
            lifecycle.run_started(done.run_id, done.session_id),
            final,
        ]
        slot = fleet.client.store.get_turn_slot(done.run_id)
        assert slot is not None
        assert slot.phase is not TurnPhase.PROVIDER_STARTED  # no agent was started
        assert fleet.wait_events("start_slot.left", run_id=done.run_id)
        release(fleet.settings, "before-spawn")
        assert fleet.wait_settled(holder.run_id).status is RunStatus.COMPLETED, fleet.dump_logs()
    finally:
        fleet.stop()
