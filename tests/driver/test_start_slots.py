"""A worker process starts a few agents at a time: the rest wait for a start slot."""

from __future__ import annotations

import threading
import time

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
