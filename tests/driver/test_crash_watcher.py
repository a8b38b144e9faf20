"""Crash detection against real Postgres and Redis: owner locks, the watcher, its races.

The owners here are sessions of this test process, ended by closing them or with
``pg_terminate_backend``; the tests with real worker processes killed by signals are
in ``test_crash_takeover.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TypeVar

import psycopg
import pytest

from tests.driver.test_takeover import AGENT, PROMPT
from turnkeeper import reconciler
from turnkeeper.config import Settings
from turnkeeper.driver.replay import StoredLog
from turnkeeper.errors import StoreUnavailableError
from turnkeeper.store.records import Claim
from turnkeeper.store.session import LockSession, OwnerLockSession, WatchSession
from turnkeeper.watcher import CrashWatcher
from turnkeeper.workers.owner_locks import OwnerLocks
from turnkeeper.workers.runtime import WorkerRuntime

LEASE = 30.0


_opened: list[LockSession | CrashWatcher] = []
T = TypeVar("T", LockSession, CrashWatcher)


@pytest.fixture
def runtime(settings: Settings) -> Iterator[WorkerRuntime]:
    rt = WorkerRuntime.open(settings.model_copy(update={"lease_ttl": LEASE}), StoredLog)
    yield rt
    while _opened:
        _opened.pop().close()
    rt.close()


def _closed_after(opened: T) -> T:
    _opened.append(opened)
    return opened


class Sent:
    """The takeover messages a watcher or reconciler sent."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, int]] = []

    def __call__(self, run_id: str, attempt_id: str, epoch: int) -> None:
        self.messages.append((run_id, attempt_id, epoch))


def _running(rt: WorkerRuntime, run_id: str) -> Claim:
    rt.store.admit_run(
        run_id, run_id, {"agent": AGENT, "prompt": PROMPT}, max_attempts=5, deadline=None
    )
    claim = rt.store.claim_run(run_id, "owner", LEASE)
    assert claim is not None
    return claim


def _owner_session(rt: WorkerRuntime) -> OwnerLockSession:
    return _closed_after(
        OwnerLockSession(rt.settings.require_database_url(), owner="test", lease_ttl=LEASE)
    )


def _locked(rt: WorkerRuntime, session: OwnerLockSession, claim: Claim) -> None:
    assert session.take([claim]) == {claim.run_id}
    rt.store.mark_owner_locked(claim)


def _watcher(rt: WorkerRuntime, sent: Sent, grace: float = 0.0) -> CrashWatcher:
    return _closed_after(
        CrashWatcher(
            rt,
            WatchSession(rt.settings.require_database_url()),
            enqueue_takeover=sent,
            grace=grace,
        )
    )


def _causes(rt: WorkerRuntime, run_id: str) -> list[tuple[int, str | None, str | None]]:
    with psycopg.connect(rt.settings.require_database_url()) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT epoch, outcome, handover_cause FROM attempts WHERE run_id = %s ORDER BY epoch",
            [run_id],
        ).fetchall()


def _terminate(rt: WorkerRuntime, application_name: str) -> int:
    with psycopg.connect(rt.settings.require_database_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [application_name],
        ).fetchall()
    return len(rows)


def test_a_dead_owner_is_handed_over_once_with_cause_crash(runtime: WorkerRuntime) -> None:
    claim = _running(runtime, "crash-1")
    owner = _owner_session(runtime)
    _locked(runtime, owner, claim)
    sent = Sent()
    watcher = _watcher(runtime, sent)
    assert watcher.sweep() == []
    assert watcher.armed == {"crash-1": claim.attempt_id}
    owner.close()  # the process died: the server drops its session and its locks
    _until_free(runtime, "crash-1")
    handed = watcher.sweep()
    assert [(c.run_id, c.epoch) for c in handed] == [("crash-1", 2)]
    assert sent.messages == [("crash-1", handed[0].attempt_id, 2)]
    run = runtime.store.get_run("crash-1")
    assert run is not None
    assert (run.attempt_id, run.epoch, run.lease_expires_at, run.attempt_count) == (
        handed[0].attempt_id,
        2,
        None,
        1,
    )
    assert run.handed_over_at is not None
    assert _causes(runtime, "crash-1") == [(1, "superseded", "crash")]
    assert runtime.log.state("crash-1").epoch == 2  # the log is fenced at the new epoch
    assert watcher.sweep() == []  # the new attempt is not watched until its owner locks
    assert sent.messages == [("crash-1", handed[0].attempt_id, 2)]


def test_a_lock_free_in_a_new_watcher_session_is_not_a_crash(runtime: WorkerRuntime) -> None:
    """After a restart or a failover every lock is free: the watcher must see a lock
    held in its current session before its coming free means anything."""
    claim = _running(runtime, "crash-2")
    owner = _owner_session(runtime)
    _locked(runtime, owner, claim)
    sent = Sent()
    watcher = _watcher(runtime, sent)
    watcher.sweep()
    owner.close()
    _until_free(runtime, "crash-2")
    _terminate(runtime, "turnkeeper-crash-watcher")  # the watcher's session ends too
    with pytest.raises(StoreUnavailableError):  # the sweep that finds it ended
        watcher.sweep()
    assert watcher.sweep() == []  # a new session: nothing armed
    assert watcher.sweep() == []
    assert sent.messages == []
    assert _causes(runtime, "crash-2") == [(1, None, None)]


def test_an_owner_that_takes_its_lock_back_before_the_handover_keeps_its_run(
    runtime: WorkerRuntime,
) -> None:
    """The watcher saw the lock free (a blip ended the owner's session), then the owner
    took it back: the handover checks the lock again, and refuses."""
    claim = _running(runtime, "crash-3")
    owner = _owner_session(runtime)
    _locked(runtime, owner, claim)
    sent = Sent()
    watcher = _watcher(runtime, sent)
    watcher.sweep()
    assert _terminate(runtime, "turnkeeper-locks test") == 1  # a blip: the owner lives
    _until_free(runtime, "crash-3")
    watch = _closed_after(WatchSession(runtime.settings.require_database_url()))
    [seen] = watch.watched(10)
    assert not seen.held
    with pytest.raises(StoreUnavailableError):
        owner.take([claim])  # the owner learns its session ended...
    assert owner.take([claim]) == {"crash-3"}  # ... and takes its lock back in a new one
    assert watch.hand_over_absent([seen]) == []
    assert watcher.sweep() == []
    assert watcher.armed == {"crash-3": claim.attempt_id}
    run = runtime.store.get_run("crash-3")
    assert run is not None
    assert (run.attempt_id, run.epoch) == (claim.attempt_id, 1)
    assert _causes(runtime, "crash-3") == [(1, None, None)]
    watch.close()
    owner.close()


def test_the_handover_is_a_compare_and_set_on_the_attempt(runtime: WorkerRuntime) -> None:
    """A run handed over by its lease between the sweep and the crash handover is not
    handed over a second time."""
    claim = _running(runtime, "crash-4")
    owner = _owner_session(runtime)
    _locked(runtime, owner, claim)
    watch = _closed_after(WatchSession(runtime.settings.require_database_url()))
    owner.close()
    _until_free(runtime, "crash-4")
    [seen] = watch.watched(100)
    assert (seen.run_id, seen.attempt_id, seen.held) == ("crash-4", claim.attempt_id, False)
    runtime.store.renew_lease(claim, 0.001)
    time.sleep(0.02)
    lease_handed = runtime.store.hand_over_expired(10)
    assert [c.run_id for c in lease_handed] == ["crash-4"]
    assert watch.hand_over_absent([seen]) == []
    assert _causes(runtime, "crash-4") == [(1, "superseded", "lease")]
    watch.close()


def test_an_unmarked_attempt_is_never_watched(runtime: WorkerRuntime) -> None:
    """An owner that never took its lock (another run shares the key, a predecessor
    holds it) is left to its lease."""
    _running(runtime, "crash-5")
    watch = _closed_after(WatchSession(runtime.settings.require_database_url()))
    assert watch.watched(100) == []
    watch.close()


def test_watched_runs_are_read_in_pages(runtime: WorkerRuntime) -> None:
    owner = _owner_session(runtime)
    claims = [_running(runtime, f"page-{i}") for i in range(7)]
    assert owner.take(claims) == {c.run_id for c in claims}
    for claim in claims:
        runtime.store.mark_owner_locked(claim)
    owner.release("page-3")
    watch = _closed_after(WatchSession(runtime.settings.require_database_url()))
    seen = watch.watched(3)
    assert [(o.run_id, o.held) for o in seen] == [(f"page-{i}", i != 3) for i in range(7)]
    # The watcher's looking took and gave back the free one: the owner can take it again.
    assert owner.take([claims[3]]) == {"page-3"}
    watch.close()
    owner.close()


def test_owner_locks_come_back_after_the_server_ends_their_session(
    runtime: WorkerRuntime,
) -> None:
    claim = _running(runtime, "blip-1")
    locks = OwnerLocks(runtime.store, _owner_session(runtime))
    try:
        locks.hold(claim)
        _wait(lambda: locks.held() == {"blip-1"})
        watch = _closed_after(WatchSession(runtime.settings.require_database_url()))
        _wait(lambda: [o.held for o in watch.watched(10)] == [True])  # marked, and held
        sessions_before = _sessions(runtime, "turnkeeper-locks test")
        assert _terminate(runtime, "turnkeeper-locks test") == 1
        _wait(lambda: _sessions(runtime, "turnkeeper-locks test") not in ([], sessions_before))
        _wait(lambda: [o.held for o in watch.watched(10)] == [True])
        locks.release(claim)
        _wait(lambda: [o.held for o in watch.watched(10)] == [False])
        watch.close()
    finally:
        locks.close()


def test_the_lease_handover_records_its_cause(runtime: WorkerRuntime) -> None:
    claim = _running(runtime, "lease-1")
    runtime.store.renew_lease(claim, 0.001)
    time.sleep(0.02)
    sent = Sent()
    report = reconciler.reconcile(runtime, enqueue_takeover=sent, enqueue_run=lambda _: None)
    assert report.taken_over == 1
    assert _causes(runtime, "lease-1") == [(1, "superseded", "lease")]
    assert runtime.store.takeovers_of("lease-1") == {"lease": 1}


def _until_free(rt: WorkerRuntime, run_id: str) -> None:
    """Until the server released the run's owner lock (a session ends asynchronously
    after its client closed it)."""
    probe = WatchSession(rt.settings.require_database_url())
    try:
        _wait(lambda: [o.held for o in probe.watched(100) if o.run_id == run_id] == [False])
    finally:
        probe.close()


def _sessions(rt: WorkerRuntime, application_name: str) -> list[int]:
    with psycopg.connect(rt.settings.require_database_url()) as conn:
        return [
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                [application_name],
            ).fetchall()
        ]


def _wait(predicate: object, timeout: float = 30.0) -> None:
    """A hang guard, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def test_a_cancelled_run_of_a_dead_owner_is_left_to_its_lease(runtime: WorkerRuntime) -> None:
    """Like the lease's handover, the crash handover leaves a cancelled run (or one out of
    attempts, or past its deadline) to ``expire_exhausted``, which settles it."""
    claim = _running(runtime, "cancelled-1")
    owner = _owner_session(runtime)
    _locked(runtime, owner, claim)
    sent = Sent()
    watcher = _watcher(runtime, sent)
    watcher.sweep()
    runtime.store.request_cancel("cancelled-1")
    owner.close()
    _until_free(runtime, "cancelled-1")
    assert watcher.sweep() == []
    assert watcher.sweep() == []  # not armed again: nothing more to look at
    assert watcher.armed == {}
    assert sent.messages == []
    run = runtime.store.get_run("cancelled-1")
    assert run is not None
    assert (run.status.value, run.attempt_id) == ("running", claim.attempt_id)
