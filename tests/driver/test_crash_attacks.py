"""Crash detection under attack: blips that meet a slow owner, restarts, collisions.

Each test here is one way a live owner could be mistaken for a dead one (a false
takeover) or a dead one missed, against real Postgres, Redis and worker processes.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import DEFAULT_TIMING, Fleet, expected_log
from tests.driver.test_crash_takeover import attempts, handed_over_at, mid_run
from tests.driver.test_crash_watcher import _running, _terminate, _wait
from tests.driver.test_takeover import AGENT, PROMPT, _assert_log_is_oracle, _assert_transcript_once
from turnkeeper.config import Settings
from turnkeeper.driver.replay import StoredLog
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.postgres import EmbeddedPostgres
from turnkeeper.errors import StoreUnavailableError
from turnkeeper.owner import owner_pid, session_name
from turnkeeper.store import migration
from turnkeeper.store.records import Claim, RunStatus
from turnkeeper.store.session import OwnerLockSession, WatchSession
from turnkeeper.store.sql.statement import LOCKS_SESSION_PREFIX, OWNER_LOCK_SPACE
from turnkeeper.watcher import CrashWatcher
from turnkeeper.workers.failpoints import marker
from turnkeeper.workers.owner_locks import OwnerLocks
from turnkeeper.workers.runtime import WorkerRuntime


def _terminate_lock_session(fleet: Fleet, owner: str) -> int:
    with psycopg.connect(fleet.settings.require_database_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            (session_name(LOCKS_SESSION_PREFIX, owner),),
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
    pgid = os.getpgid(owner_pid(owned.owner))
    os.killpg(pgid, signal.SIGSTOP)
    try:
        assert _terminate_lock_session(fleet, owned.owner) == 1
        # Frozen until the watcher saw the lock free, waited its grace and looked twice.
        fleet.wait_events(
            "crash.owner_alive", needle=owned.attempt_id or "", files="beat-*.log", count=2
        )
    finally:
        os.killpg(pgid, signal.SIGCONT)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert attempts(fleet, run.run_id) == [(1, "completed", None)], fleet.dump_logs()
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[tuple[EmbeddedPostgres, int]]:
    """A PostgreSQL server of this test's own, which it may restart."""
    (tmp_path / "pg").mkdir()
    server = EmbeddedPostgres(tmp_path / "pg")
    port = free_port()
    server.start(port)
    try:
        migration.upgrade(server.url(port))
        yield server, port
    finally:
        server.stop()


LONG: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.15, "seed": 12}


@pytest.mark.slow
def test_a_postgres_restart_hands_nothing_over_and_detection_resumes(
    settings: Settings, tmp_path: Path, private_postgres: tuple[EmbeddedPostgres, int]
) -> None:
    """Every session ends at once, the watcher's too, and every lock with them: nothing
    is handed over because of that. Once the owner took its lock back on the new
    server and the watcher saw it held there, the owner's SIGKILL is a crash takeover."""
    server, port = private_postgres
    fleet = Fleet.create(
        settings.model_copy(update={"database_url": server.url(port)}),
        tmp_path / "logs",
        **DEFAULT_TIMING,
    )
    try:
        fleet.start_pair()
        fleet.wait_ready()
        run = fleet.client.submit(LONG, PROMPT)
        owned = mid_run(fleet, run.run_id, chunks=4)
        server.stop()  # fast shutdown: every session is ended
        server.start(port)
        probe = WatchSession(server.url(port))
        try:  # the owner took its lock back on the new server
            _wait_for(lambda: [o.held for o in probe.watched(10)] == [True], fleet)
        finally:
            probe.close()
        # ... and the watcher saw it held in its new session (it logs nothing for
        # that, so let two of its sweeps pass, by the database clock).
        before_kill = _db_now(fleet)
        _wait_for(lambda: (_db_now(fleet) - before_kill).total_seconds() > 1.5, fleet)
        killed_at = _db_now(fleet)
        assert fleet.events("crash.suspected", files="beat-*.log") == []  # not even once
        with psycopg.connect(fleet.settings.require_database_url()) as conn:
            row = conn.execute(
                "SELECT lease_expires_at FROM runs WHERE run_id = %s", (run.run_id,)
            ).fetchone()
        assert row is not None
        assert row[0] is not None
        lease = row[0]
        fleet.signal_worker_of(owned, signal.SIGKILL)
        fleet.client.store.close()  # its pool's sessions ended with the old server
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert attempts(fleet, run.run_id) == [
            (1, "superseded", "crash"),
            (2, "completed", None),
        ], fleet.dump_logs()
        assert killed_at < handed_over_at(fleet, run.run_id, 1) < lease
        oracle = expected_log(run.run_id, run.session_id, LONG, PROMPT, tmp_path / "oracle")
        assert [chunk for _, chunk in fleet.log_of(run.run_id)] == oracle
    finally:
        fleet.stop()


def _db_now(fleet: Fleet) -> dt.datetime:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _wait_for(predicate: Any, fleet: Fleet) -> None:
    deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
    while not predicate():
        assert time.monotonic() < deadline, fleet.dump_logs()
        time.sleep(0.05)


# --- one process, many runs: the counts of session-level locks --------------------------


@pytest.fixture
def runtime(settings: Settings) -> Iterator[WorkerRuntime]:
    rt = WorkerRuntime.open(settings.model_copy(update={"lease_ttl": 30.0}), StoredLog)
    yield rt
    rt.close()


def _held_flags(rt: WorkerRuntime) -> dict[str, bool]:
    probe = WatchSession(rt.settings.require_database_url())
    try:
        return {o.run_id: o.held for o in probe.watched(100)}
    finally:
        probe.close()


def _lock_attempt(rt: WorkerRuntime, run_id: str) -> tuple[str, str | None]:
    with psycopg.connect(rt.settings.require_database_url()) as conn:
        row = conn.execute(
            "SELECT attempt_id, lock_attempt_id FROM runs WHERE run_id = %s", (run_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _owner_locks(rt: WorkerRuntime) -> OwnerLocks:
    session = OwnerLockSession(rt.settings.require_database_url(), owner=rt.owner, lease_ttl=30.0)
    return OwnerLocks(rt.store, session)


def test_one_run_ending_leaves_the_locks_of_the_others_held(runtime: WorkerRuntime) -> None:
    """Five runs in one process, one session: each lock is taken once, so one release
    frees exactly its run's lock (a lock taken twice would stay held after it)."""
    claims = [_running(runtime, f"many-{i}") for i in range(5)]
    locks = _owner_locks(runtime)
    try:
        for claim in claims:
            locks.hold(claim)
        everyone = {c.run_id: True for c in claims}
        _wait(lambda: _held_flags(runtime) == everyone)
        locks.release(claims[2])
        _wait(lambda: _held_flags(runtime) == {**everyone, "many-2": False})
        # The others stay held through a reconnect too, taken back once each.
        assert _terminate(runtime, session_name(LOCKS_SESSION_PREFIX, runtime.owner)) == 1
        _wait(lambda: locks.held() == {c.run_id for c in claims} - {"many-2"})
        _wait(lambda: _held_flags(runtime) == {**everyone, "many-2": False})
        for claim in claims[:2]:
            locks.release(claim)
        _wait(
            lambda: (
                _held_flags(runtime)
                == {
                    "many-0": False,
                    "many-1": False,
                    "many-2": False,
                    "many-3": True,
                    "many-4": True,
                }
            )
        )
    finally:
        locks.close()
    _wait(lambda: set(_held_flags(runtime).values()) == {False})


@pytest.mark.parametrize("order", ["hold-first", "release-first"])
def test_a_run_readopted_by_the_same_process_holds_its_lock_once(
    runtime: WorkerRuntime, order: str
) -> None:
    """The run's lease ran out while its owner lived (frozen) and the takeover came back
    to the same process: the old attempt's release and the new one's hold meet in one
    session, in either order. The lock is held once, marked for the new attempt, and
    free after the new attempt's release."""
    old = _running(runtime, "readopt-1")
    locks = _owner_locks(runtime)
    try:
        locks.hold(old)
        _wait(lambda: _held_flags(runtime) == {"readopt-1": True})
        runtime.store.renew_lease(old, 0.001)
        time.sleep(0.02)
        [handed] = runtime.store.hand_over_expired(10)
        new = runtime.store.adopt_attempt("readopt-1", handed.attempt_id, runtime.owner, 30.0)
        assert new is not None
        if order == "hold-first":
            locks.hold(new)
            locks.release(old)
        else:
            locks.release(old)
            locks.hold(new)
        _wait(lambda: _lock_attempt(runtime, "readopt-1") == (new.attempt_id, new.attempt_id))
        _wait(lambda: _held_flags(runtime) == {"readopt-1": True})
        assert locks.held() == {"readopt-1"}
        locks.release(new)
        _wait(lambda: locks.held() == frozenset())
        with psycopg.connect(runtime.settings.require_database_url(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (OWNER_LOCK_SPACE, "readopt-1")
            ).fetchone()
        assert row == (True,), "the lock was held twice: one release left it held"
    finally:
        locks.close()


# --- the watcher killed mid-handover; two watchers at once ------------------------------


@pytest.mark.slow
def test_a_watcher_killed_between_handover_and_message_loses_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    """The watcher's beat dies right after its handover committed, before it sent the
    takeover message; two beats come in its place. The handed-over attempt waits for
    its message, which a reconciler sends again (``redispatch_takeovers``): the run is
    handed over once, adopted once."""
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        **{**DEFAULT_TIMING, "requeue_after": 2.0},
        failpoints="crash-handed",
    )
    try:
        fleet.start_worker()
        fleet.start_worker()
        beat = fleet.start_beat()
        fleet.wait_ready()
        run = fleet.client.submit(LONG, PROMPT)
        owned = mid_run(fleet, run.run_id, chunks=4)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        fired = marker(fleet.settings, "crash-handed")
        _wait_for(fired.exists, fleet)
        os.killpg(beat.pid, signal.SIGKILL)
        beat.wait()
        fleet.start_beat()
        fleet.start_beat()
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert attempts(fleet, run.run_id) == [
            (1, "superseded", "crash"),
            (2, "completed", None),
        ], fleet.dump_logs()
        assert (
            len(fleet.events("takeover.redispatched", needle=run.run_id, files="beat-*.log")) >= 1
        )
        adopted = fleet.events("attempt.adopted", needle=run.run_id, files="worker-*.log")
        assert [e["epoch"] for e in adopted] == [2]
        oracle = expected_log(run.run_id, run.session_id, LONG, PROMPT, tmp_path / "oracle")
        assert [chunk for _, chunk in fleet.log_of(run.run_id)] == oracle
    finally:
        fleet.stop()


def test_two_watchers_hand_each_dead_owner_over_once(runtime: WorkerRuntime) -> None:
    """Two beats, two watchers: both see the same twenty locks free and hand over at
    the same instant; the compare-and-set gives each run to exactly one of them."""
    claims = [_running(runtime, f"twice-{i:02}") for i in range(20)]
    owner = OwnerLockSession(runtime.settings.require_database_url(), owner="gone", lease_ttl=30)
    assert owner.take(claims) == {c.run_id for c in claims}
    for claim in claims:
        runtime.store.mark_owner_locked(claim)
    sent: list[list[tuple[str, str, int]]] = [[], []]
    watchers = [
        CrashWatcher(
            runtime,
            WatchSession(runtime.settings.require_database_url()),
            enqueue_takeover=lambda *m, i=i: sent[i].append(m),
            grace=0.0,
        )
        for i in range(2)
    ]
    try:
        for watcher in watchers:
            assert watcher.sweep() == []
        owner.close()
        _wait(lambda: set(_held_flags(runtime).values()) == {False})
        start = threading.Barrier(2)

        def sweep(watcher: CrashWatcher) -> list[str]:
            start.wait()
            return [c.run_id for c in watcher.sweep()]

        with ThreadPoolExecutor(2) as pool:
            handed = list(pool.map(sweep, watchers))
        assert sorted(handed[0] + handed[1]) == sorted(c.run_id for c in claims)
        assert sorted(m[0] for m in sent[0] + sent[1]) == sorted(c.run_id for c in claims)
        for claim in claims:
            assert runtime.store.takeovers_of(claim.run_id) == {"crash": 1}, claim.run_id
        for watcher in watchers:
            assert watcher.sweep() == []
    finally:
        for watcher in watchers:
            watcher.close()
        owner.close()


# --- two running runs whose owner locks share a key ------------------------------------


def _colliding_run_ids(rt: WorkerRuntime) -> tuple[str, str]:
    """Two run ids with the same ``hashtext``, so the same owner lock key: found by a
    birthday search on the server (a 32-bit hash collides within a few 100,000 ids)."""
    with psycopg.connect(rt.settings.require_database_url()) as conn:
        row = conn.execute(
            "SELECT min(id), max(id) FROM ("
            "  SELECT 'collide-' || i AS id FROM generate_series(1, 300000) AS i) AS ids"
            " GROUP BY hashtext(id) HAVING count(*) = 2 ORDER BY min(id) LIMIT 1"
        ).fetchone()
    assert row is not None
    first, second = row
    assert first != second
    return first, second


def _running_as(rt: WorkerRuntime, run_id: str, owner: str) -> Claim:
    rt.store.admit_run(
        run_id, run_id, {"agent": AGENT, "prompt": PROMPT}, max_attempts=5, deadline=None
    )
    claim = rt.store.claim_run(run_id, owner, 30.0)
    assert claim is not None
    return claim


def test_runs_sharing_a_lock_key_fall_back_to_their_lease(runtime: WorkerRuntime) -> None:
    """Run A's owner (process p1) holds the shared key; B's (p2) cannot take it, so B is
    never watched. Then p1's session blips and p2 takes the key for B while p1 is
    connecting again: the lock the watcher saw held for A is p2's now. When B ends and
    p2 lets the key go, A's lock is free while its owner lives: A must not be handed
    over. Once p1 holds it again and then dies, A is a crash takeover."""
    run_a, run_b = _colliding_run_ids(runtime)
    url = runtime.settings.require_database_url()
    claim_a, claim_b = _running_as(runtime, run_a, "p1"), _running_as(runtime, run_b, "p2")
    p1 = OwnerLockSession(url, owner="p1", lease_ttl=30.0)
    p2 = OwnerLockSession(url, owner="p2", lease_ttl=30.0)
    sent: list[tuple[str, str, int]] = []
    watcher = CrashWatcher(
        runtime, WatchSession(url), enqueue_takeover=lambda *m: sent.append(m), grace=0.0
    )
    try:
        assert p1.take([claim_a]) == {run_a}
        runtime.store.mark_owner_locked(claim_a)
        assert p2.take([claim_b]) == set()  # the key is p1's: B stays unmarked
        assert watcher.sweep() == []
        assert watcher.armed == {run_a: claim_a.attempt_id}  # B is not watched
        assert _terminate(runtime, "turnkeeper-locks p1") == 1
        _wait(lambda: p2.take([claim_b]) == {run_b})
        runtime.store.mark_owner_locked(claim_b)
        with pytest.raises(StoreUnavailableError):
            p1.take([claim_a])  # p1 learns that its session ended...
        assert p1.take([claim_a]) == set()  # ... and finds the key taken, by p2
        assert watcher.sweep() == []  # A "held" (by p2), B held
        assert watcher.armed == {run_a: claim_a.attempt_id, run_b: claim_b.attempt_id}
        runtime.store.settle_run(claim_b, RunStatus.COMPLETED)
        p2.release(run_b)
        assert watcher.sweep() == []  # A's lock is free, but p1 is connected: alive
        assert watcher.sweep() == []
        assert sent == []
        assert runtime.store.takeovers_of(run_a) == {}
        assert p1.take([claim_a]) == {run_a}
        assert watcher.sweep() == []
        p1.close()  # p1 dies
        _wait(lambda: _held_flags(runtime) == {run_a: False})
        [handed] = watcher.sweep()
        assert (handed.run_id, handed.epoch) == (run_a, 2)
        assert sent == [(run_a, handed.attempt_id, 2)]
        assert runtime.store.takeovers_of(run_a) == {"crash": 1}
        assert runtime.store.takeovers_of(run_b) == {}
    finally:
        watcher.close()
        p1.close()
        p2.close()
