"""A takeover waits for a free slot and costs no attempt while it waits.

The reconciler hands an expired run over at once (the dead owner is fenced), but
the new attempt counts only when a worker adopts it. These tests run real workers
on a fleet whose every slot is busy, send takeover messages twice, and queue new
runs behind a takeover, on both brokers.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kombu import Connection

from tests.driver.fleet import Fleet, expected_log
from tests.driver.test_outages import RABBITMQ
from turnkeeper import reconciler
from turnkeeper.config import Settings
from turnkeeper.driver.replay import StoredLog
from turnkeeper.queues import control_queue, enqueue_takeover, turns_queue
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.tasks import create_app
from turnkeeper.workers.runtime import WorkerRuntime

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.1, "seed": 12}
LONG: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.2, "seed": 13}
PROMPT = "wait for a slot"


def attempts(database_url: str, run_id: str) -> list[tuple[int, str | None]]:
    with psycopg.connect(database_url) as conn:
        return [
            (row[0], row[1])
            for row in conn.execute(
                "SELECT epoch, outcome FROM attempts WHERE run_id = %s ORDER BY epoch", (run_id,)
            )
        ]


def assert_log_is_oracle(fleet: Fleet, run: Run, agent: dict[str, Any], workdir: Path) -> None:
    stored = fleet.log_of(run.run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    oracle = expected_log(run.run_id, run.session_id, agent, PROMPT, workdir)
    assert [chunk for _, chunk in stored] == oracle


@pytest.mark.slow
def test_a_takeover_waits_for_a_slot_on_a_saturated_fleet(
    settings: Settings, database_url: str, tmp_path: Path
) -> None:
    """Two workers with one slot each, lease 3 s: the owner of one run is SIGKILLed while
    both slots run long turns. The run waits, many reconciles long, for the other slot,
    then completes; it used exactly one attempt per adoption."""
    fleet = Fleet.create(settings, tmp_path / "logs", lease_ttl=3.0)
    try:
        fleet.start_pair()
        fleet.wait_ready()
        victim = fleet.client.submit(AGENT, PROMPT)
        busy = fleet.client.submit(LONG, PROMPT)
        for run in (victim, busy):
            fleet.wait(run.run_id, lambda r: r.owner is not None, what="an owner")
        while len(fleet.log_of(victim.run_id)) < 6:
            time.sleep(0.02)
        fleet.signal_worker_of(fleet.client.require(victim.run_id), signal.SIGKILL)
        handed = fleet.wait(victim.run_id, lambda r: r.awaiting_adoption, what="a handover")
        assert (handed.epoch, handed.attempt_count, handed.owner) == (2, 1, None)
        done = fleet.wait_settled(victim.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        long_done = fleet.wait_settled(busy.run_id, timeout=180)
        assert long_done.status is RunStatus.COMPLETED
        # The takeover waited behind the long run: sent again while it waited, and only
        # adopted once that slot was free.
        sent = fleet.events("takeover.enqueued", run_id=victim.run_id) + fleet.events(
            "takeover.redispatched", run_id=victim.run_id
        )
        assert len(fleet.events("takeover.enqueued", run_id=victim.run_id)) == 1
        assert len(fleet.events("takeover.redispatched", run_id=victim.run_id)) >= 1
        adopted = fleet.events("attempt.adopted", run_id=victim.run_id)
        assert [(a["epoch"], a["attempt_id"]) for a in adopted] == [(2, done.attempt_id)]
        assert (done.epoch, done.attempt_count) == (2, 2), "one claim, one adoption"
        assert attempts(database_url, victim.run_id) == [(1, "superseded"), (2, "completed")]
        assert_log_is_oracle(fleet, done, AGENT, tmp_path / "oracle-victim")
        assert_log_is_oracle(fleet, long_done, LONG, tmp_path / "oracle-busy")
        # Every duplicate the reconciler sent while the run waited is consumed in the
        # end, and none of them adopted anything.
        deadline = time.monotonic() + 120  # a hang guard
        while len(fleet.events("takeover.not_adopted", run_id=victim.run_id)) < len(sent) - 1:
            assert time.monotonic() < deadline, fleet.dump_logs()
            time.sleep(0.2)
        assert len(fleet.events("attempt.adopted", run_id=victim.run_id)) == 1
        assert fleet.client.require(victim.run_id).attempt_count == 2
    finally:
        fleet.stop()


def _hand_over_a_dead_run(fleet: Fleet, agent: dict[str, Any]) -> tuple[Run, str, int]:
    """A run whose owner 'died' at once (a lease of 50 ms, nothing started), handed over
    by one reconcile whose takeover message is kept, not sent."""
    rt = WorkerRuntime.open(fleet.settings, StoredLog)
    try:
        run, _ = rt.store.admit_run(
            "handed", "handed", {"agent": agent, "prompt": PROMPT}, max_attempts=5, deadline=None
        )
        assert rt.store.claim_run(run.run_id, "owner-that-died", 0.05) is not None
        time.sleep(0.1)
        kept: list[tuple[str, str, int]] = []
        reconciler.reconcile(
            rt, enqueue_takeover=lambda *a: kept.append(a), enqueue_run=lambda run_id: None
        )
    finally:
        rt.close()
    assert [k[0] for k in kept] == [run.run_id]
    return run, kept[0][1], kept[0][2]


def test_duplicate_takeover_messages_adopt_once(
    fleet: Fleet, database_url: str, tmp_path: Path
) -> None:
    run, attempt_id, epoch = _hand_over_a_dead_run(fleet, AGENT)
    app = create_app(fleet.settings)
    for _ in range(3):
        enqueue_takeover(
            app, fleet.settings, run.run_id, attempt_id, epoch, store=fleet.client.store
        )
    fleet.start_worker(concurrency=3)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    deadline = time.monotonic() + 60  # a hang guard
    while len(fleet.events("takeover.not_adopted", run_id=run.run_id)) < 2:
        assert time.monotonic() < deadline, fleet.dump_logs()
        time.sleep(0.1)
    adopted = fleet.events("attempt.adopted", run_id=run.run_id)
    assert [(a["attempt_id"], a["epoch"]) for a in adopted] == [(attempt_id, epoch)]
    assert [
        (n["attempt_id"], n["epoch"])
        for n in fleet.events("takeover.not_adopted", run_id=run.run_id)
    ] == [(attempt_id, epoch)] * 2
    assert (done.epoch, done.attempt_count) == (2, 2)
    assert attempts(database_url, run.run_id) == [(1, "superseded"), (2, "completed")]
    assert_log_is_oracle(fleet, done, AGENT, tmp_path / "oracle")


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_takeover_is_served_before_queued_new_runs(
    settings: Settings, database_url: str, tmp_path: Path, broker: str
) -> None:
    """New runs queued first, the takeover last, then one worker with one slot: the
    takeover is adopted first, then the new runs in their order."""
    overrides = {"broker_url": RABBITMQ} if broker == "rabbitmq" else {}
    # No beat: nothing but these messages triggers anything.
    fleet = Fleet.create(settings, tmp_path / "logs", requeue_after=600.0, **overrides)
    quick = {**AGENT, "turns": 1, "pace": 0.0}
    try:
        handed, attempt_id, epoch = _hand_over_a_dead_run(fleet, quick)
        fresh = [fleet.client.submit(quick, PROMPT).run_id for _ in range(3)]
        app = create_app(fleet.settings)
        enqueue_takeover(
            app, fleet.settings, handed.run_id, attempt_id, epoch, store=fleet.client.store
        )
        fleet.start_worker(concurrency=1)
        for run_id in [handed.run_id, *fresh]:
            assert fleet.wait_settled(run_id).status is RunStatus.COMPLETED, fleet.dump_logs()
        with psycopg.connect(database_url) as conn:
            order = [
                row[0]
                for row in conn.execute(
                    "SELECT run_id FROM attempts WHERE owner <> 'owner-that-died'"
                    " ORDER BY started_at"
                )
            ]
        assert order == [handed.run_id, *fresh]
    finally:
        fleet.stop()
        if broker == "rabbitmq":
            with Connection(RABBITMQ) as conn:
                channel = conn.default_channel
                for queue in (turns_queue(fleet.settings), control_queue(fleet.settings)):
                    channel.queue_delete(queue)


@pytest.mark.slow
def test_a_run_whose_owners_die_twice_on_a_saturated_fleet_completes(
    settings: Settings, database_url: str, tmp_path: Path
) -> None:
    """Three one-slot workers, all busy with long turns. The victim's owner is SIGKILLed;
    it waits for a slot, is adopted when the shortest turn ends, and that owner is
    SIGKILLed too; it waits again, for the last slot. It completes at the default
    max_attempts: three attempts, one claim and two adoptions, however long it queued."""
    fleet = Fleet.create(settings, tmp_path / "logs", lease_ttl=3.0)
    victim_agent = {"preset": "scripted", "turns": 3, "pace": 0.3, "seed": 21}
    short_agent = {"preset": "scripted", "turns": 3, "pace": 0.1, "seed": 22}
    long_agent = {"preset": "scripted", "turns": 4, "pace": 0.3, "seed": 23}
    try:
        for _ in range(3):
            fleet.start_worker()
        fleet.start_beat()
        fleet.wait_ready()
        victim = fleet.client.submit(victim_agent, PROMPT)
        short = fleet.client.submit(short_agent, PROMPT)
        long = fleet.client.submit(long_agent, PROMPT)
        for run in (victim, short, long):
            fleet.wait(run.run_id, lambda r: r.owner is not None, what="an owner")
        while len(fleet.log_of(victim.run_id)) < 6:
            time.sleep(0.02)
        fleet.signal_worker_of(fleet.client.require(victim.run_id), signal.SIGKILL)
        adopted = fleet.wait(
            victim.run_id, lambda r: r.epoch == 2 and r.owner is not None, 120, "an adoption"
        )
        assert fleet.client.require(short.run_id).status is RunStatus.COMPLETED
        seen = len(fleet.log_of(victim.run_id))
        while len(fleet.log_of(victim.run_id)) < seen + 2:  # the adopter is writing
            time.sleep(0.02)
        fleet.signal_worker_of(adopted, signal.SIGKILL)
        done = fleet.wait_settled(victim.run_id, timeout=240)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (3, 3)
        assert done.attempt_count <= Settings().max_attempts
        adoptions = sorted(
            fleet.events("attempt.adopted", run_id=victim.run_id), key=lambda a: a["epoch"]
        )
        assert [(a["epoch"], a["attempt_id"]) for a in adoptions][-1] == (3, done.attempt_id)
        assert [a["epoch"] for a in adoptions] == [2, 3]  # one adoption per attempt after the claim
        assert attempts(database_url, victim.run_id) == [
            (1, "superseded"),
            (2, "superseded"),
            (3, "completed"),
        ]
        assert_log_is_oracle(fleet, done, victim_agent, tmp_path / "oracle-victim")
        for run, agent in ((short, short_agent), (long, long_agent)):
            other = fleet.wait_settled(run.run_id, timeout=240)
            assert (other.status, other.attempt_count) == (RunStatus.COMPLETED, 1)
            assert_log_is_oracle(fleet, other, agent, tmp_path / f"oracle-{run.run_id}")
    finally:
        fleet.stop()
