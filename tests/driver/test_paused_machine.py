"""Lease time on a machine whose clocks stood still (docs/architecture.md, "Lease time on
a paused machine").

A whole machine can stop: suspended by its kernel (Linux then stops ``CLOCK_MONOTONIC``
and counts the suspend in ``CLOCK_BOOTTIME`` only) or paused by its hypervisor (then
every clock of the guest stands still). Meanwhile the database's clock runs on, the
lease runs out there and the reconciler hands the run to a successor. Woken, the owner
must not start the agent on its own clock's word.

What these tests prove, and what not. A CI machine cannot be suspended, so no test here
suspends one: the kernel's behaviour is clock_gettime(2)'s, taken as documented.
``test_a_spawn_asks_the_store_whatever_this_machines_clock_says`` stands a real worker's
clocks still the only way one can: the lease is made to run out on the database's clock
alone (renewed to a blink through the store's API), so the worker's own clocks say
that a whole lease is left, exactly as after a pause; the worker must still ask the
store before it spawns, and start nothing. The heartbeat's own judgement (how long it
may retry an unreachable store) depends on its clock: the other tests give a real
``LeaseKeeper`` two stand-in clocks across the same suspend, one that counts it and one
that does not, and pin which clock a worker uses.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.driver.fleet import Fleet, expected_log
from tests.driver.test_takeover import AGENT, PROMPT
from tests.store.conftest import claimed
from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.store.records import Claim, RunStatus, Verdict
from turnkeeper.store.store import Store
from turnkeeper.workers import lease
from turnkeeper.workers.failpoints import release
from turnkeeper.workers.lease import LeaseKeeper

LEASE_TTL = 30.0


def test_a_spawn_asks_the_store_whatever_this_machines_clock_says(
    settings: Settings, tmp_path: Path
) -> None:
    """The owner waits to spawn (a failpoint holds it there), its heartbeat far off (every
    300 s, a lease of 900 s): by its clocks the lease has nearly 900 s left. On the
    database's clock it runs out, and the reconciler hands the run over. Let go, the
    owner asks the store, finds the run gone and starts nothing; the successor starts
    the agent once, and the log is the oracle's."""
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        heartbeat_interval=300.0,
        lease_ttl=900.0,
        failpoints="before-spawn=pause",
    )
    try:
        fleet.start_worker()
        run = fleet.client.submit(AGENT, PROMPT)
        fleet.wait_failpoint("before-spawn")
        owned = fleet.client.require(run.run_id)
        assert (owned.status, owned.epoch) == (RunStatus.RUNNING, 1)
        claim = Claim(owned.run_id, str(owned.attempt_id), owned.epoch)
        with Store(settings.require_database_url(), pool_size=1) as store:
            assert store.renew_lease(claim, 0.001) is Verdict.DONE  # out, on its clock only
        fleet.start_beat()
        fleet.wait(run.run_id, lambda r: r.epoch == 2, what="a handover")
        release(fleet.settings, "before-spawn")
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert [(e, o) for e, o, _ in fleet.attempts(run.run_id)] == [
            (1, "superseded"),
            (2, "completed"),
        ]
        seen = [
            (event["event"], event.get("epoch"), event.get("reason") or event.get("action"))
            for event in fleet.events(
                "journal.spawned",
                "attempt.stopped",
                "takeover.classified",
                run_id=run.run_id,
                files="worker-*.log",
            )
        ]
        assert seen == [
            ("attempt.stopped", 1, "lease-lost"),  # asked the store: nothing started
            ("takeover.classified", 2, "start"),
            ("journal.spawned", None, None),
        ], fleet.dump_logs()
        stored = fleet.log_of(run.run_id)
        oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "oracle")
        assert [chunk for _, chunk in stored] == oracle
    finally:
        fleet.stop()


class StandIn:
    """A clock a test moves: ``suspend`` adds the suspended seconds only if it counts them."""

    def __init__(self, *, counts_suspend: bool) -> None:
        self.now = 1000.0
        self.counts_suspend = counts_suspend

    def __call__(self) -> float:
        return self.now

    def suspend(self, seconds: float) -> None:
        if self.counts_suspend:
            self.now += seconds


def _cut_sessions(database_url: str, application_name: str) -> None:
    """End the server sessions of one store (an operator's pg_terminate_backend, a
    failover): its next statement finds its connection dead."""
    with psycopg.connect(plain_postgres_url(database_url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        )
        deadline = time.monotonic() + 30  # a hang guard
        while conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchone():
            assert time.monotonic() < deadline, "the sessions never ended"
            time.sleep(0.02)


@pytest.mark.parametrize(
    ("counts_suspend", "judged_lost"),
    [(True, True), (False, False)],
    ids=["counts-suspend", "stops-in-suspend"],
)
def test_a_heartbeat_woken_past_its_lease_judges_it_by_its_clock(
    database_url: str, counts_suspend: bool, judged_lost: bool
) -> None:
    """A real keeper renews, the machine sleeps longer than the lease, and its first beat
    after finds the store unreachable. With a clock that counts the suspend it knows the
    lease may be gone (``lost``, so the driver stops); with one that stopped, it goes on
    retrying as if the lease were fresh: the misjudgement ``lease_clock`` avoids."""
    name = f"lease-clock-{uuid.uuid4().hex[:12]}"
    clock = StandIn(counts_suspend=counts_suspend)
    with Store(database_url, pool_size=1, application_name=name) as store:
        claim = claimed(store, "r")
        keeper = LeaseKeeper(store, claim, lease_ttl=LEASE_TTL, interval=300.0, clock=clock)
        keeper.beat()
        assert not keeper.lost.is_set()
        clock.suspend(LEASE_TTL + 1)
        _cut_sessions(database_url, name)
        keeper.beat()
        assert keeper.lost.is_set() is judged_lost


@pytest.mark.skipif(sys.platform != "linux", reason="CLOCK_BOOTTIME is Linux's")
def test_a_worker_reads_lease_time_on_the_clock_that_counts_suspend() -> None:
    """On Linux the keeper's default clock is ``CLOCK_BOOTTIME``. Its readings cannot tell
    it from the monotonic clock on a machine that never slept (they are equal there),
    so the choice itself is pinned, and that ``lease_clock`` reads that clock."""
    assert lease.LEASE_CLOCK == time.CLOCK_BOOTTIME
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    now = lease.lease_clock()
    assert before <= now <= time.clock_gettime(time.CLOCK_BOOTTIME)
    assert LeaseKeeper.__init__.__kwdefaults__["clock"] is lease.lease_clock
