"""Attacks on the cancel's wake-up (issue 25, "a cancel lands within a second").

Real Postgres and Redis, real worker processes where a fleet is needed. The fleets beat
their leases every 300 s (a lease lasts 900 s), so a run that settles within a hang
guard was stopped by the cancel's wake-up (``workers/cancel_listener.py``) or settled by
the cancel itself, never by a heartbeat that happened to come round.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.driver.fleet import Fleet, agents_under
from turnkeeper.chunks import Chunk
from turnkeeper.client import Client
from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.driver import lifecycle
from turnkeeper.owner import new_owner
from turnkeeper.store.records import Claim, RunStatus
from turnkeeper.store.sql.owner_locks import CANCEL_CHANNEL, LISTEN_CANCELS, PROBE_LISTENER
from turnkeeper.store.store import Store
from turnkeeper.workers.cancel_listener import CancelListener
from turnkeeper.workers.lease import LeaseKeeper

SLOW = {"preset": "scripted", "turns": 1000, "pace": 0.05}
"""An agent that talks for about a minute unless it is stopped."""
CANCELLED: Chunk = {"type": "RUN_ERROR", "message": "the run was cancelled", "code": "cancelled"}
GONE_MESSAGE = "the run was cancelled and its owner is gone"
GONE: Chunk = {"type": "RUN_ERROR", "message": GONE_MESSAGE, "code": "cancelled"}
GUARD = 60.0  # a hang guard, far below the 300 s a heartbeat would take
LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE query IN (%s, %s) AND datname = current_database()"
)


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    store = Store(settings.require_database_url(), pool_size=4)
    try:
        yield store
    finally:
        store.close()


def _sql(settings: Settings, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(plain_postgres_url(settings.require_database_url())) as conn:
        return conn.execute(statement, params or None).fetchall()


def _wait_for(predicate: Any, what: str, timeout: float = GUARD) -> None:
    """Until ``predicate()`` (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _assert_one_ending(fleet: Fleet, run_id: str, final: Chunk) -> list[tuple[int, Chunk]]:
    """The log: seqs 1..n, RUN_STARTED first, exactly one ending, ``final``, last; closed."""
    log = fleet.log_of(run_id)
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    kinds = [chunk["type"] for _, chunk in log]
    assert kinds[0] == "RUN_STARTED", kinds
    assert (kinds.count("RUN_FINISHED"), kinds.count("RUN_ERROR")) == (0, 1), kinds
    assert log[-1][1] == final
    assert fleet.client.log.state(run_id).closed
    return log


def _submit_claimed(client: Client, store: Store, count: int, lease_ttl: float) -> list[Claim]:
    """``count`` runs claimed by an owner that is no worker (nothing drives them)."""
    owner = new_owner("attacker")
    claims = []
    for index in range(count):
        run = client.submit(SLOW, f"p{index}")
        begun = store.claim_and_begin(run.run_id, owner, lease_ttl)
        assert begun is not None
        claims.append(begun.claim)
    return claims


def _handed_over(client: Client, store: Store, count: int) -> list[Claim]:
    """``count`` runs whose owner's lease ran out, handed over: each awaits adoption."""
    claims = _submit_claimed(client, store, count, lease_ttl=0.2)
    time.sleep(0.4)
    handed = store.hand_over_expired(count)
    assert sorted(c.run_id for c in handed) == sorted(c.run_id for c in claims)
    return handed


# --- 1. the window between a fresh claim and its heartbeat's watch ----------------------


def test_a_cancel_that_commits_between_the_claim_and_the_watch_is_still_heard(
    settings: Settings, store: Store
) -> None:
    """A worker claims a run, then (a moment later) its lease keeper watches it. A cancel
    that commits in between is announced while nobody watches the run, and a fresh
    claim reads its run at the claim, before the cancel: only the next heartbeat (300 s
    here, 10 s by default) would find it. The window is a few instructions wide, wider
    under load (a threads pool's GIL); here it is held open."""
    client = Client.from_settings(settings)
    listener = CancelListener(settings.require_database_url(), application_name="attack")
    canary_heard = threading.Event()
    try:
        [canary, claim] = _submit_claimed(client, store, 2, lease_ttl=900.0)
        listener.watch(canary.run_id, canary_heard.set)
        _wait_for(listener.connected.is_set, "the listener never connected")
        # The claim is made; its keeper does not watch it yet. The cancel commits.
        assert client.cancel(claim.run_id).status is RunStatus.RUNNING
        # Notifications arrive in commit order: once the canary's is heard, the run's
        # was heard (and dropped: nobody watched it).
        client.cancel(canary.run_id)
        _wait_for(canary_heard.is_set, "the canary's cancel was never heard")
        keeper = LeaseKeeper(store, claim, lease_ttl=900.0, interval=300.0, cancels=listener)
        keeper.start()
        try:
            assert keeper.cancelled.wait(GUARD), "the cancel waits for the next heartbeat"
        finally:
            keeper.stop()
    finally:
        listener.close()
        client.close()


# --- 5. a cancel racing an adoption --------------------------------------------------------


def test_a_cancel_racing_an_adoption_has_exactly_one_outcome(
    settings: Settings, store: Store
) -> None:
    """Each run awaits adoption; one thread cancels it as another adopts it. Either the
    adoption wins (the run is running, adopted, its cancel flagged for the adopter to
    hear) or the cancel does (the run is aborted at once, its log ended): never both,
    never neither (a run cancelled, not adopted, left awaiting adoption)."""
    client = Client.from_settings(settings)
    adopter = new_owner("adopter")
    outcomes: dict[str, int] = {"adopted": 0, "aborted": 0}
    try:
        for claim in _handed_over(client, store, 120):
            gate = threading.Barrier(2)
            adopted: list[Any] = []

            def adopt(
                claim: Claim = claim, gate: threading.Barrier = gate, adopted: list[Any] = adopted
            ) -> None:
                gate.wait()
                adopted.append(store.adopt_attempt(claim.run_id, claim.attempt_id, adopter, 900))

            thread = threading.Thread(target=adopt)
            thread.start()
            gate.wait()
            answer = client.cancel(claim.run_id)
            thread.join()
            run = client.require(claim.run_id)
            assert run.cancel_requested_at is not None
            if adopted[0] is not None:
                outcomes["adopted"] += 1
                assert (run.status, run.owner, run.handed_over_at) == (
                    RunStatus.RUNNING,
                    adopter,
                    None,
                )
                assert answer.status is RunStatus.RUNNING
                assert not client.log.state(claim.run_id).closed
            else:
                outcomes["aborted"] += 1
                assert run.status is RunStatus.ABORTED, run
                assert run.error == {"reason": "cancelled", "message": GONE_MESSAGE}
                assert answer.status is RunStatus.ABORTED
                assert [chunk for _, chunk in client.log.snapshot(claim.run_id)] == [
                    lifecycle.run_started(run.run_id, run.session_id),
                    GONE,
                ]
                assert client.log.state(claim.run_id).closed
    finally:
        client.close()
    assert sum(outcomes.values()) == 120, outcomes


# --- 6. a cancel while Redis is unreachable ------------------------------------------------


def test_a_cancel_of_an_unowned_run_with_redis_down_settles_it_and_the_reaper_ends_its_log(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    """The client's Redis is unreachable: the cancel still settles the run in Postgres,
    and the reaper ends its log later. The cancel took: the caller is told so, with the
    run, not with an error that reads as though nothing happened."""
    fleet = Fleet.create(settings, tmp_path / "logs")
    cut_off = Client.from_settings(
        fleet.settings.model_copy(update={"redis_url": "redis://127.0.0.1:9/0"})
    )
    try:
        [claim] = _handed_over(fleet.client, store, 1)
        answer = cut_off.cancel(claim.run_id)
        assert (answer.status, answer.error) == (
            RunStatus.ABORTED,
            {"reason": "cancelled", "message": GONE_MESSAGE},
        )
        assert fleet.client.cancel(claim.run_id).status is RunStatus.ABORTED  # a retry: no-op
        fleet.start_beat()  # its reaper ends the log the cancel could not
        fleet.wait_log_closed(claim.run_id)
        run = fleet.client.require(claim.run_id)
        assert [chunk for _, chunk in fleet.log_of(claim.run_id)] == [
            lifecycle.run_started(run.run_id, run.session_id),
            GONE,
        ]
    finally:
        cut_off.close()
        fleet.stop()


# --- 7. a cancel storm ---------------------------------------------------------------------


def test_a_thousand_cancels_announce_nothing_for_settled_or_unknown_runs(
    settings: Settings, store: Store
) -> None:
    """Only a cancel that flags a running run announces it; a settled run, an unknown id
    and a queued run (aborted in the statement) are announced to nobody."""
    client = Client.from_settings(settings)
    try:
        with psycopg.connect(
            plain_postgres_url(settings.require_database_url()), autocommit=True
        ) as conn:
            conn.execute(f"LISTEN {CANCEL_CHANNEL}")
            queued = client.submit(SLOW, "queued")
            [claim] = _submit_claimed(client, store, 1, lease_ttl=900.0)
            for _ in range(3):
                client.cancel(queued.run_id)
            for _ in range(1000):
                client.cancel(claim.run_id)
            for index in range(5):
                with pytest.raises(Exception, match="no run"):
                    client.cancel(f"nobody-{index}")
            heard = [n.payload for n in conn.notifies(timeout=1.0, stop_after=2000)]
        assert heard == [claim.run_id] * 1000
    finally:
        client.close()


# --- 3. the listener's connection cut, again and again -------------------------------------


def _cut_listeners(settings: Settings) -> int:
    rows = _sql(
        settings,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE query IN (%s, %s) AND datname = current_database()",
        LISTEN_CANCELS,
        PROBE_LISTENER,
    )
    return sum(1 for (cut,) in rows if cut)


def _listeners(settings: Settings) -> int:
    return int(_sql(settings, LISTENERS, LISTEN_CANCELS, PROBE_LISTENER)[0][0])


def test_a_listener_cut_after_it_listened_a_while_reconnects_at_once(
    slow_beat_fleet: Fleet,
) -> None:
    """Five cuts in a row back the reconnects off to 5 s. A connection that then listens
    for a while ended that outage: its loss is a new one, retried at the first wait, not
    at the 5 s an outage long past ran up (a cancel in that gap would wait for it)."""
    fleet = slow_beat_fleet
    fleet.start_worker()
    run = fleet.client.submit(SLOW, "talk")
    fleet.wait_chunks(run.run_id, 3)
    for cuts in range(1, 6):
        _wait_for(lambda: _listeners(fleet.settings) == 1, "the listener never came back")
        assert _cut_listeners(fleet.settings) == 1
        fleet.wait_events("cancel_listener.disconnected", count=cuts)
    waits = [e["retry_in"] for e in fleet.events("cancel_listener.disconnected")]
    assert waits == [0.1, 0.5, 1.0, 2.0, 5.0]
    _wait_for(lambda: _listeners(fleet.settings) == 1, "the listener never came back")
    time.sleep(6.0)  # it listens longer than the longest wait: the outage is over
    assert _cut_listeners(fleet.settings) == 1
    fleet.wait_events("cancel_listener.disconnected", count=6)
    assert fleet.events("cancel_listener.disconnected")[-1]["retry_in"] == 0.1
    fleet.client.cancel(run.run_id)
    done = fleet.wait_settled(run.run_id, timeout=GUARD)
    assert done.status is RunStatus.ABORTED
    _assert_one_ending(fleet, run.run_id, CANCELLED)


def test_cancels_while_the_listener_is_cut_again_and_again_all_land(
    slow_beat_fleet: Fleet,
) -> None:
    """A thread cuts the listening connection every 0.2 s while runs are cancelled at
    random moments: each cancel is heard live or by the poke after the reconnect."""
    fleet = slow_beat_fleet
    fleet.start_worker(concurrency=6, pool="threads")
    runs = [fleet.client.submit(SLOW, f"talk {index}") for index in range(6)]
    for run in runs:
        fleet.wait_chunks(run.run_id, 3)
    stop = threading.Event()

    def cutter() -> None:
        while not stop.wait(0.2):
            _cut_listeners(fleet.settings)

    thread = threading.Thread(target=cutter)
    thread.start()
    rng = random.Random(3)
    try:
        for run in runs:
            time.sleep(rng.uniform(0.0, 0.6))
            fleet.client.cancel(run.run_id)
        for run in runs:
            done = fleet.wait_settled(run.run_id, timeout=GUARD)
            assert done.status is RunStatus.ABORTED, (done.error, fleet.dump_logs())
            assert done.error == {"reason": "cancelled", "message": "the run was cancelled"}
            _assert_one_ending(fleet, run.run_id, CANCELLED)
    finally:
        stop.set()
        thread.join()
    _wait_for(lambda: agents_under(fleet.settings.sandboxes_dir) == [], "agents live on")
    _wait_for(lambda: _listeners(fleet.settings) == 1, "not one listener per process")
    assert _listeners(fleet.settings) == 1


# --- 4. many runs cancelled at once ---------------------------------------------------------


def _worker_threads(proc: Any) -> int:
    return psutil.Process(proc.pid).num_threads()


def _cancel_all_at_once(fleet: Fleet, run_ids: list[str]) -> None:
    gate = threading.Barrier(len(run_ids))

    def cancel(run_id: str) -> None:
        gate.wait()
        fleet.client.cancel(run_id)

    threads = [threading.Thread(target=cancel, args=(run_id,)) for run_id in run_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_twenty_runs_of_a_threads_worker_cancelled_at_once_all_end_aborted(
    slow_beat_fleet: Fleet,
) -> None:
    """Twice: 20 runs on one ``-P threads -c 20`` worker, all cancelled at the same
    moment. All end aborted, their agents gone, one listening connection, and the
    worker has as many threads after the second round as after the first."""
    fleet = slow_beat_fleet
    worker = fleet.start_worker(concurrency=20, pool="threads")
    threads_after = []
    for round_ in range(2):
        runs = [fleet.client.submit(SLOW, f"r{round_}-{index}") for index in range(20)]
        for run in runs:
            fleet.wait_chunks(run.run_id, 3)
        assert _listeners(fleet.settings) == 1
        _cancel_all_at_once(fleet, [run.run_id for run in runs])
        for run in runs:
            done = fleet.wait_settled(run.run_id, timeout=GUARD)
            assert done.status is RunStatus.ABORTED, (done.error, fleet.dump_logs())
            assert done.error == {"reason": "cancelled", "message": "the run was cancelled"}
            _assert_one_ending(fleet, run.run_id, CANCELLED)
        _wait_for(lambda: agents_under(fleet.settings.sandboxes_dir) == [], "agents live on")
        assert _listeners(fleet.settings) == 1
        time.sleep(1.0)  # the lease threads' joins are done
        threads_after.append(_worker_threads(worker))
    assert threads_after[1] == threads_after[0], threads_after


def test_runs_of_a_prefork_worker_cancelled_at_once_all_end_aborted(
    slow_beat_fleet: Fleet,
) -> None:
    """The default pool, two processes: two runs driven, four queued, all cancelled at
    the same moment. The driven ones are stopped by their owners, the queued ones are
    aborted in the statement (and never started after)."""
    fleet = slow_beat_fleet
    fleet.start_worker(concurrency=2)
    runs = [fleet.client.submit(SLOW, f"talk {index}") for index in range(6)]
    _wait_for(
        lambda: sum(fleet.client.require(r.run_id).status is RunStatus.RUNNING for r in runs) == 2,
        "two runs never ran",
    )
    driven = [r for r in runs if fleet.client.require(r.run_id).status is RunStatus.RUNNING]
    for run in driven:
        fleet.wait_chunks(run.run_id, 3)
    _cancel_all_at_once(fleet, [run.run_id for run in runs])
    for run in runs:
        done = fleet.wait_settled(run.run_id, timeout=GUARD)
        assert done.status is RunStatus.ABORTED, (done.error, fleet.dump_logs())
        if run in driven:
            _assert_one_ending(fleet, run.run_id, CANCELLED)
        else:
            assert [chunk for _, chunk in fleet.log_of(run.run_id)] == [
                {"type": "RUN_ERROR", "message": "cancelled before it started", "code": "cancelled"}
            ]
    _wait_for(lambda: agents_under(fleet.settings.sandboxes_dir) == [], "agents live on")
    assert _listeners(fleet.settings) == 2  # one per pool process that drove a run


# --- 2. the owner killed right after it heard the cancel ------------------------------------


def test_an_owner_killed_after_hearing_the_cancel_before_its_settle_leaves_it_aborted(
    settings: Settings, tmp_path: Path
) -> None:
    """The owner heard the cancel, stopped its agent and its heartbeat, and is SIGKILLed
    before its settle is written. A dead owner's cancelled run is not handed over (the
    crash watcher leaves it to its lease, ``test_crash_watcher``): once the lease runs
    out the reconciler settles it aborted, its log ended once. The fleet's lease is
    short (2 s) for that: at 900 s this run would wait 15 minutes."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="settling")
    try:
        fleet.start_pair()
        run = fleet.client.submit(SLOW, "talk")
        fleet.wait_chunks(run.run_id, 3)
        fleet.client.cancel(run.run_id)
        fleet.wait_failpoint("settling")
        fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
        done = fleet.wait_settled(run.run_id, timeout=GUARD)
        assert (done.status, done.error) == (
            RunStatus.ABORTED,
            {"reason": "cancelled", "message": GONE_MESSAGE},
        ), fleet.dump_logs()
        _assert_one_ending(fleet, run.run_id, GONE)
        assert [outcome for _, outcome, _ in fleet.attempts(run.run_id)] == ["expired"]
        assert agents_under(fleet.settings.sandboxes_dir) == []
    finally:
        fleet.stop()


# --- 1. a cancel racing a takeover ----------------------------------------------------------


def test_a_cancel_landing_anywhere_in_a_takeover_ends_the_run_aborted_once(
    settings: Settings, tmp_path: Path
) -> None:
    """The owner is SIGKILLed; its death hands the run over and the other worker adopts
    it. A cancel lands at a random moment of that: before the handover, while the run
    awaits adoption, during the adoption, or once the successor drives it. Each run
    ends aborted, one RUN_ERROR, seqs contiguous, its agents gone."""
    # A 2 s lease: a cancel that lands before the crash handover is left to the lease.
    fleet = Fleet.create(settings, tmp_path / "logs")
    rng = random.Random(25)
    try:
        fleet.start_pair()
        fleet.start_worker()
        for index in range(5):
            run = fleet.client.submit(SLOW, f"talk {index}")
            fleet.wait_chunks(run.run_id, 3)
            fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
            time.sleep(rng.uniform(0.0, 1.5))
            fleet.client.cancel(run.run_id)
            done = fleet.wait_settled(run.run_id, timeout=GUARD)
            assert done.status is RunStatus.ABORTED, (done.error, fleet.dump_logs())
            assert done.error["reason"] == "cancelled"
            final = CANCELLED if done.error["message"] == "the run was cancelled" else GONE
            _assert_one_ending(fleet, run.run_id, final)
            _wait_for(lambda: agents_under(fleet.settings.sandboxes_dir) == [], "agents live on")
            fleet.start_worker()  # the killed one's stand-in
    finally:
        fleet.stop()


# --- 11. a session's run cancelled while its owner is frozen --------------------------------


SHORT_TALK = {"preset": "scripted", "turns": 2, "pace": 0.25}
"""About ten seconds of talk (some forty lines): two reaps or more (every 5 s in a test
fleet)."""


def _cancel_with_the_owner_frozen(fleet: Fleet, session_id: str, *, beat: bool) -> int:
    """A session's run talking, its owner frozen (SIGSTOP), then cancelled: the run
    settles without it, by the reconciler's hand once its lease runs out or, with no
    beat, by the cancel itself once it has. The other worker has a slot to spare for
    the reaper's tasks beside the session's next run. Returns the frozen group."""
    fleet.start_worker()
    fleet.start_worker(concurrency=2)
    if beat:
        fleet.start_beat()
    fleet.wait_ready()
    run = fleet.client.submit(SLOW, "talk on", session_id=session_id)
    fleet.wait_chunks(run.run_id, 3)
    pgid = fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGSTOP)
    if not beat:
        _wait_for(lambda: _lease_ran_out(fleet, run.run_id), "the lease never ran out")
    fleet.client.cancel(run.run_id)
    done = fleet.wait_settled(run.run_id, timeout=GUARD)
    assert (done.status, done.error) == (
        RunStatus.ABORTED,
        {"reason": "cancelled", "message": GONE_MESSAGE},
    )
    return pgid


def _lease_ran_out(fleet: Fleet, run_id: str) -> bool:
    run = fleet.client.require(run_id)
    [(now,)] = _sql(fleet.settings, "SELECT now()")
    return run.lease_expires_at is not None and run.lease_expires_at < now


def test_the_agent_of_a_session_run_cancelled_with_its_owner_frozen_is_stopped(
    fleet: Fleet,
) -> None:
    """The frozen owner cannot stop its agent, and the session keeps its workspace (the
    reaper does not destroy it): the reaper stops what runs there, as no run of the
    session is under way, and keeps the files. Left alone, the agent talked on until
    the session's next run or its workspace's retirement, a day later."""
    root = fleet.settings.sandboxes_dir
    pgid = _cancel_with_the_owner_frozen(fleet, "frozen-chat", beat=True)
    try:
        _wait_for(lambda: agents_under(root) == [], "the cancelled run's agent talks on")
        assert [p.name for p in root.glob("*/workspace")] == ["workspace"]  # kept
    finally:
        os.killpg(pgid, signal.SIGCONT)


def test_the_reaper_stops_no_agent_of_a_session_run_under_way(fleet: Fleet) -> None:
    """The session's next run works in the same workspace (its start ends the leftover
    agent) and is under way when the reaper first looks at the cancelled run (beat
    starts only then): forgetting that run's sandbox, the reaper must leave the new
    run's agent alone."""
    root = fleet.settings.sandboxes_dir
    pgid = _cancel_with_the_owner_frozen(fleet, "busy-chat", beat=False)
    try:
        follow_up = fleet.client.submit(SHORT_TALK, "and now", session_id="busy-chat")
        fleet.wait_chunks(follow_up.run_id, 3)
        fleet.start_beat()
        done = fleet.wait_settled(follow_up.run_id, timeout=GUARD)
        assert done.status is RunStatus.COMPLETED, done.error
        assert [epoch for epoch, _, _ in fleet.attempts(follow_up.run_id)] == [1]
        assert done.sandbox_ref is not None
        assert [journal["process"] for journal in done.sandbox_ref["journals"]] == [1]
        _wait_for(lambda: agents_under(root) == [], "an agent outlived its run")
    finally:
        os.killpg(pgid, signal.SIGCONT)
