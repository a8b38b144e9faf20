"""Contract tests: the fleet page's reads (store/fleet.py), on the database clock: the
worker processes with the runs they own, and the fleet's activity minute by minute."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import psycopg
import pytest

from tests.store.conftest import LONG_LEASE, admit, expire_lease
from turnkeeper.errors import InvalidInputError
from turnkeeper.owner import session_name
from turnkeeper.store import RunStatus, Store, Verdict
from turnkeeper.store.fleet import LATENCY_BOUNDS
from turnkeeper.store.records import FleetMinute, LatencyHistogram, OwnedRun
from turnkeeper.store.session import store_session_name
from turnkeeper.store.sql.statement import LOCKS_SESSION_PREFIX as LOCKS

DEAD_AFTER = 30.0
BEAT_EVERY = 2.0
_STARTED_MINUTES_AGO = """UPDATE runs SET started_at = date_trunc('minute', now())
    - make_interval(mins => %s) + interval '10 s' WHERE run_id = %s"""
_SETTLED_TWO_MINUTES_AGO = """UPDATE runs SET started_at = now() - interval '2 days',
    finished_at = CASE WHEN finished_at IS NULL THEN NULL
        ELSE date_trunc('minute', now()) - interval '2 min' END
    WHERE run_id = %s"""


def _execute(database_url: str, statement: str, *params: object) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(statement, params)


def _minute_now(database_url: str) -> datetime:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT date_trunc('minute', now())").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_worker_slots_show_live_and_lately_stopped_processes_with_the_runs_they_own(
    store: Store, database_url: str
) -> None:
    store.start_worker("h1:11:aa", "h1", 11, 10)
    store.start_worker("h1:12:bb", "h1", 12, 10)
    store.start_worker("h2:21:cc", "h2", 21, 20)
    store.start_worker("h2:31:dd", "h2", 31, 30)
    admit(store, "r1", "s1")
    admit(store, "r2", "s2")
    claim = store.claim_run("r1", "h1:12:bb", LONG_LEASE)
    assert claim is not None
    assert store.claim_run("r2", "h1:12:bb", LONG_LEASE) is not None
    done = store.claim_run(admit(store, "r3", "s3").run_id, "h1:11:aa", LONG_LEASE)
    assert done is not None
    assert store.settle_run(done, RunStatus.COMPLETED) is Verdict.DONE  # settled: not owned
    _execute(database_url, "UPDATE workers SET last_seen = now() - interval '40 s' "
             "WHERE worker_id = 'h2:21:cc'")  # fmt: skip
    _execute(database_url, "UPDATE workers SET last_seen = now() - interval '2 h' "
             "WHERE worker_id = 'h2:31:dd'")  # fmt: skip
    _execute(database_url, "UPDATE attempts SET started_at = now() - interval '12 s' "
             "WHERE run_id = 'r1'")  # fmt: skip

    slots = store.worker_slots(DEAD_AFTER, BEAT_EVERY, shown_for=600)
    assert [(s.worker_id, s.host_id, s.pid, s.main_pid, s.alive) for s in slots] == [
        ("h1:11:aa", "h1", 11, 10, True),
        ("h1:12:bb", "h1", 12, 10, True),
        ("h2:21:cc", "h2", 21, 20, False),  # stopped 40 s ago; the one of 2 h ago is not shown
    ]
    assert slots[0].runs == ()
    assert [run.run_id for run in slots[1].runs] == ["r1", "r2"]
    r1 = slots[1].runs[0]
    assert r1 == OwnedRun("r1", 1, r1.held_seconds, r1.lease_seconds_left)
    assert r1.held_seconds is not None
    assert 12 <= r1.held_seconds < 12 + DEAD_AFTER
    assert r1.lease_seconds_left is not None
    assert 0 < r1.lease_seconds_left <= LONG_LEASE
    assert 40 <= slots[2].silent_seconds < 40 + DEAD_AFTER
    assert store.worker_slots(DEAD_AFTER, BEAT_EVERY, 600, limit=1)[0].worker_id == "h1:11:aa"

    expire_lease(store, claim)
    (handed,) = store.hand_over_expired(10)  # r1 leaves its owner, awaiting adoption
    assert [run.run_id for run in store.worker_slots(DEAD_AFTER, BEAT_EVERY, 600)[1].runs] == ["r2"]
    ((run_id, epoch, waited),) = store.awaiting_adoption()
    assert (run_id, epoch) == ("r1", 2)
    assert waited >= 0
    assert store.adopt_attempt(handed.run_id, handed.attempt_id, "h1:11:aa", LONG_LEASE)
    assert store.awaiting_adoption() == []
    assert [run.run_id for run in store.worker_slots(DEAD_AFTER, BEAT_EVERY, 600)[0].runs] == ["r1"]


def _wait_sessions_gone(database_url: str, application_name: str) -> None:
    """Until the server lists no session of that name (a closed connection's backend
    ends a moment after the client closed it); a hang guard, not a timing assertion."""
    deadline = time.monotonic() + 60
    with psycopg.connect(database_url, autocommit=True) as conn:
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone() != (0,):
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_slot_silent_past_a_beat_and_a_half_is_alive_only_while_it_has_a_session(
    store: Store, database_url: str
) -> None:
    """A killed process's sessions end with it: it stops counting once it missed a beat,
    long before ``dead_after``; one whose beat is late but whose sessions live (a slow
    database, a frozen process) still counts until ``dead_after``."""
    for worker_id, pid in (("h1:11:aa11", 11), ("h1:12:bb22", 12), ("h1:13:cc33", 13)):
        store.start_worker(worker_id, "h1", pid, 10)
    _execute(database_url, "UPDATE workers SET last_seen = now() - interval '5 s' "
             "WHERE worker_id IN ('h1:12:bb22', 'h1:13:cc33')")  # fmt: skip
    with (
        psycopg.connect(database_url, application_name=store_session_name("h1:13:cc33")),
        psycopg.connect(database_url, application_name=session_name(LOCKS, "h1:11:aa11")),
    ):
        slots = store.worker_slots(DEAD_AFTER, BEAT_EVERY, shown_for=600)
        assert [(s.worker_id, s.alive) for s in slots] == [
            ("h1:11:aa11", True),  # beat just now
            ("h1:12:bb22", False),  # 5 s silent, no session: killed
            ("h1:13:cc33", True),  # 5 s silent, its store's session still open
        ]
        # Past dead_after, a session no longer keeps a process counted.
        assert [s.alive for s in store.worker_slots(4.0, BEAT_EVERY, 600)] == [
            True,
            False,
            False,
        ]
    # Its sessions gone (once the server has ended their backends), the silent process
    # stops counting as well.
    _wait_sessions_gone(database_url, store_session_name("h1:13:cc33"))
    assert [s.alive for s in store.worker_slots(DEAD_AFTER, BEAT_EVERY, 600)] == [
        True,
        False,
        False,
    ]


def test_sweeps_say_when_each_last_finished(store: Store, database_url: str) -> None:
    assert store.sweeps() == []
    store.record_sweep("reconcile")
    store.record_sweep("prune")
    _execute(database_url, "UPDATE sweeps SET finished_at = now() - interval '90 s' "
             "WHERE name = 'prune'")  # fmt: skip
    store.record_sweep("reconcile")  # again: one row per sweep, the latest time
    sweeps = store.sweeps()
    assert [sweep.name for sweep in sweeps] == ["prune", "reconcile"]
    assert 90 <= sweeps[0].seconds_ago < 90 + DEAD_AFTER
    assert 0 <= sweeps[1].seconds_ago < DEAD_AFTER
    with pytest.raises(InvalidInputError):
        store.record_sweep("")


def test_fleet_activity_counts_starts_settles_and_takeovers_per_minute(
    store: Store, database_url: str
) -> None:
    for n in range(1, 6):
        admit(store, f"r{n}", f"s{n}")
        assert store.claim_run(f"r{n}", "w", LONG_LEASE) is not None
    ok = store.claim_run(admit(store, "ok", "s-ok").run_id, "w", LONG_LEASE)
    assert ok is not None
    assert store.settle_run(ok, RunStatus.COMPLETED) is Verdict.DONE
    bad = store.claim_run(admit(store, "bad", "s-bad").run_id, "w", LONG_LEASE)
    assert bad is not None
    assert store.settle_run(bad, RunStatus.FAILED) is Verdict.DONE
    stale = store.claim_run(admit(store, "stale", "s-stale").run_id, "w", LONG_LEASE)
    assert stale is not None
    expire_lease(store, stale)
    (handed,) = store.hand_over_expired(10)
    assert store.adopt_attempt(handed.run_id, handed.attempt_id, "w2", LONG_LEASE)
    # Spread over the window: r1..r5 started 1..5 minutes ago, "ok" and "bad" settled
    # 2 minutes ago, the takeover 3 minutes ago; "r5" started before the window.
    for n in range(1, 6):
        _execute(database_url, _STARTED_MINUTES_AGO, n, f"r{n}")
    for run_id in ("ok", "bad", "stale"):
        _execute(database_url, _SETTLED_TWO_MINUTES_AGO, run_id)
    _execute(database_url, "UPDATE attempts SET ended_at = date_trunc('minute', now()) "
             "- interval '3 min' WHERE run_id = 'stale' AND outcome = 'superseded'")  # fmt: skip
    now = _minute_now(database_url)

    minutes = store.fleet_activity(5)
    # The window ends at the database's current minute (which may have moved on since).
    last = minutes[-1].minute
    assert last in (now, now + timedelta(minutes=1))
    assert [m.minute for m in minutes] == [last - timedelta(minutes=k) for k in range(4, -1, -1)]
    busy = {m.minute: m for m in minutes if m.started or m.settled or m.takeovers}
    expected = {
        now - timedelta(minutes=4): FleetMinute(now - timedelta(minutes=4), 1, {}, {}),
        now - timedelta(minutes=3): FleetMinute(now - timedelta(minutes=3), 1, {}, {"lease": 1}),
        now - timedelta(minutes=2): FleetMinute(
            now - timedelta(minutes=2), 1, {"completed": 1, "failed": 1}, {}
        ),
        now - timedelta(minutes=1): FleetMinute(now - timedelta(minutes=1), 1, {}, {}),
    }
    if last != now:  # the minute turned: r4 (4 minutes ago) left the window
        del expected[now - timedelta(minutes=4)]
    assert busy == expected
    assert len(store.fleet_activity(1)) == 1
    for wrong in (0, 1441, 2.5, True, "5"):
        with pytest.raises(InvalidInputError):
            store.fleet_activity(wrong)  # type: ignore[arg-type]


def _stored_at(database_url: str, run_id: str, *times: datetime) -> None:
    """Journal bytes of ``run_id`` stored at each of ``times``."""
    with psycopg.connect(database_url) as conn:
        for n, at in enumerate(times):
            conn.execute(
                "INSERT INTO segments (journal_key, byte_start, byte_end, body, run_id,"
                " created_at) VALUES (%s, %s, %s, 'x', %s, %s)",
                (f"{run_id}/journal", n, n + 1, run_id, at),
            )


def test_takeover_latency_is_the_pause_the_run_page_shows(store: Store, database_url: str) -> None:
    """The pause in the stored output where both attempts stored some; else the wait from
    the hand-over to the adoption (what the run page's takeover mark says too)."""
    assert store.takeover_latency(60) == LatencyHistogram(
        LATENCY_BOUNDS, (0,) * (len(LATENCY_BOUNDS) + 1), 0, None, None, None
    )
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT now() - interval '30 s'").fetchone()
    assert row is not None
    base: datetime = row[0]
    # run: (seconds from hand-over to adoption; old attempt's stored bytes, new one's,
    # in seconds after base; the old attempt is handed over at base + 10)
    cases: dict[str, tuple[float, list[float], list[float]]] = {
        "a": (0.05, [], []),
        "b": (0.3, [], []),
        "c": (0.3, [3.0], []),  # the successor stored nothing (yet): the wait
        "d": (2.0, [], [13.0]),  # the predecessor stored nothing: the wait
        "e": (75.0, [], []),
        "f": (0.05, [2.0, 7.0], [10.05, 11.0]),  # paused from base + 7 to base + 10.05
    }
    for run_id, (wait, old, new) in cases.items():
        claim = store.claim_run(admit(store, run_id, f"s-{run_id}").run_id, "w", LONG_LEASE)
        assert claim is not None
        expire_lease(store, claim)
        (handed,) = store.hand_over_expired(10)
        assert store.adopt_attempt(handed.run_id, handed.attempt_id, "w2", LONG_LEASE)
        handed_over = base + timedelta(seconds=10)
        _execute(database_url, "UPDATE attempts SET started_at = %s, ended_at = %s "
                 "WHERE run_id = %s AND epoch = 1", base, handed_over, run_id)  # fmt: skip
        _execute(database_url, "UPDATE attempts SET started_at = %s WHERE run_id = %s "
                 "AND epoch = 2", handed_over + timedelta(seconds=wait), run_id)  # fmt: skip
        _stored_at(database_url, run_id, *(base + timedelta(seconds=t) for t in old + new))
    histogram = store.takeover_latency(60)
    # below 0.1: a; [0.25, 0.5): b, c; [1, 2.5): d; [2.5, 5): f (3.05); at or past 60: e
    assert histogram.counts == (1, 0, 2, 0, 1, 1, 0, 0, 0, 1)
    assert histogram.count == 6
    assert histogram.p50 == pytest.approx((0.3 + 2.0) / 2)
    assert histogram.max == pytest.approx(75.0)
    assert histogram.p95 is not None
    assert 3.05 < histogram.p95 < 75.0
