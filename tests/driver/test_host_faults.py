"""Faults of a fleet on many hosts, simulated on this machine as in ``test_hosts``: a
host whose one live worker is busy, and a host cut off for longer than
``host_dead_after`` that comes back.

A partition is a worker stopped with SIGSTOP: it neither beats nor renews its lease,
while its agent (a session of its own) lives on, as behind a cut cable.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.driver.test_hosts import (
    HOST_DEAD_AFTER,
    LONG,
    PROMPT,
    MakeHost,
    _assert_one_agent_process,
    _assert_oracle,
    _host_of,
    make_host,
)
from tests.driver.test_sandbox_loss import _wait_for_chunks
from turnkeeper.owner import owner_pid
from turnkeeper.queues import turns_queue
from turnkeeper.store.records import RunStatus

__all__ = ["make_host"]  # the fixture, used by name

ENDLESS: dict[str, Any] = {**LONG, "turns": 40}
"""About a thousand lines, 0.3 s apart: it outlives the whole test on its own."""


def _agents_under(root: Path) -> list[int]:
    """The processes working in ``root`` (a sandbox's agents)."""
    pids = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if Path(proc.cwd()).is_relative_to(root):
                pids.append(proc.pid)
        except (psutil.Error, OSError, ValueError):
            continue
    return pids


@pytest.mark.slow
def test_a_takeover_waits_for_the_busy_worker_of_its_host_and_spends_nothing(
    make_host: MakeHost, tmp_path: Path
) -> None:
    """Host A has two one-slot workers; the victim's is SIGKILLed for good, the other is
    busy with a long run. A is alive (its busy worker beats), so the victim's takeover
    waits in A's queue, however often it is sent again, while B's worker sits idle:
    B cannot follow an agent on A's disk. When the busy run ends, A's worker adopts the
    victim and follows its agent: the exact output, one attempt spent."""
    a, b = make_host("host-a"), make_host("host-b")
    a.start_worker()
    a.start_worker()
    a.wait_ready()
    busy_agent = {**LONG, "seed": 31}
    victim_agent = {**LONG, "seed": 32}
    busy = a.client.submit(busy_agent, PROMPT)
    busy_owned = _wait_for_chunks(a, busy.run_id, 10)
    victim = a.client.submit(victim_agent, PROMPT)
    owned = _wait_for_chunks(a, victim.run_id, 10)
    assert owned.owner is not None
    assert busy_owned.owner is not None
    assert owned.owner != busy_owned.owner
    b.start_worker()
    b.start_beat()
    b.wait_ready()

    a.signal_worker_of(owned, signal.SIGKILL)  # never restarted
    done = a.wait_settled(victim.run_id, timeout=240)
    busy_done = a.wait_settled(busy.run_id, timeout=240)

    assert done.status is RunStatus.COMPLETED, (done.error, a.dump_logs(), b.dump_logs())
    assert busy_done.status is RunStatus.COMPLETED
    attempts = a.attempts(victim.run_id)
    assert [(epoch, outcome) for epoch, outcome, _ in attempts] == [
        (1, "superseded"),
        (2, "completed"),
    ], "waiting for a slot on A spent no attempt"
    assert attempts[1][2] == busy_owned.owner, "the busy worker adopted it once free"
    _assert_oracle(a, done, victim_agent, PROMPT, tmp_path / "oracle-victim")
    _assert_oracle(a, busy_done, busy_agent, PROMPT, tmp_path / "oracle-busy")
    _assert_one_agent_process(a, done)
    assert done.sandbox_host == "host-a"


@pytest.mark.slow
def test_a_worker_that_serves_no_host_queue_does_not_keep_its_host_alive(
    make_host: MakeHost, tmp_path: Path
) -> None:
    """Host A runs a worker given ``-Q <turns queue>`` only (an older unit file, say)
    and a normal one that owns the run, SIGKILLed for good. The first consumes nothing
    of A's queue, so it must not make A look alive: A is dead after
    ``host_dead_after``, the takeover goes to the turns queue, and that same worker,
    on A's disk, follows the agent exactly. Were A kept alive by it, the takeover
    would wait in A's queue for good."""
    a = make_host("host-a", host_dead_after=HOST_DEAD_AFTER)
    b = make_host("host-b", host_dead_after=HOST_DEAD_AFTER)
    owner = a.start_worker()
    a.wait_ready()
    run = a.client.submit(LONG, PROMPT)
    owned = _wait_for_chunks(a, run.run_id, 10)
    assert owned.owner is not None
    turns_only = a.start_worker(queues=turns_queue(a.settings))
    b.start_beat()
    a.wait_ready()
    b.wait_ready()

    a.signal_worker_of(owned, signal.SIGKILL)
    assert owner.wait() != 0
    done = a.wait_settled(run.run_id, timeout=240)

    assert done.status is RunStatus.COMPLETED, (done.error, a.dump_logs(), b.dump_logs())
    attempts = a.attempts(run.run_id)
    assert [(epoch, outcome) for epoch, outcome, _ in attempts] == [
        (1, "superseded"),
        (2, "completed"),
    ]
    assert owner_pid(attempts[1][2]) in {
        child.pid for child in psutil.Process(turns_only.pid).children()
    } | {turns_only.pid}
    _assert_oracle(a, done, LONG, PROMPT, tmp_path / "oracle")
    _assert_one_agent_process(a, done)


@pytest.mark.slow
def test_a_host_back_from_a_partition_ends_the_agent_its_run_left_behind(
    make_host: MakeHost,
) -> None:
    """Host A is cut off (its worker stopped) past ``host_dead_after``: the run goes on
    on B in a sandbox of B's own. When A comes back, its stale attempt is fenced, and
    A ends the agent still working in its superseded sandbox at its next reap, not an
    ``orphan_ttl`` later: two agents must not do the run's work. B's sandbox and the
    run's new state are untouched."""
    a = make_host("host-a", host_dead_after=HOST_DEAD_AFTER)
    b = make_host("host-b", host_dead_after=HOST_DEAD_AFTER)
    a.start_worker(concurrency=2)
    a.wait_ready()
    run = a.client.submit(ENDLESS, PROMPT)
    owned = _wait_for_chunks(a, run.run_id, 10)
    assert owned.sandbox_ref is not None
    old_root = Path(owned.sandbox_ref["sandbox"]["root"])
    b.start_worker()
    b.start_beat()
    b.wait_ready()

    pgid = a.signal_worker_of(owned, signal.SIGSTOP)
    moved = b.wait(
        run.run_id,
        lambda r: r.sandbox_host == "host-b" and r.owner is not None,
        240,
        "continued on host-b",
    )
    assert moved.owner is not None
    assert _host_of(moved.owner) == "host-b"
    assert _agents_under(old_root), "A's agent lived through the partition"
    os.killpg(pgid, signal.SIGCONT)  # the partition heals

    deadline = time.monotonic() + 120  # a hang guard: A reaps every reap_interval (5 s)
    # The agent may end first (the stale attempt, fenced, stops what it started) and its
    # directory go at A's next reap; both well before orphan_ttl (an hour).
    while _agents_under(old_root) or old_root.exists():
        assert time.monotonic() < deadline, (a.dump_logs(), b.dump_logs())
        time.sleep(0.2)

    now = b.client.require(run.run_id)
    assert now.status is RunStatus.RUNNING, (now.error, b.dump_logs())
    assert (now.attempt_id, now.epoch, now.sandbox_host) == (
        moved.attempt_id,
        moved.epoch,
        "host-b",
    )
    assert now.sandbox_ref is not None
    assert [j.get("lost") for j in now.sandbox_ref["journals"]] == ["sandbox-lost", None]
    new_root = Path(now.sandbox_ref["sandbox"]["root"])
    assert new_root.exists()
    assert _agents_under(new_root), "B's continuation runs on"
