"""Crash detection with real workers: a dead owner is replaced without its lease running out.

The fleets here run the default lease (30 s, heartbeat 10 s, reconcile 5 s) unless a
test says otherwise, so a takeover that waited for the lease shows in the stored
times: every assertion is on states and events (the attempts' outcomes and causes,
the handover's time against the lease the dead owner held), never on wall time.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.driver.fleet import Fleet, expected_log
from tests.driver.test_takeover import AGENT, PROMPT, _assert_log_is_oracle, _assert_transcript_once
from turnkeeper.config import Settings
from turnkeeper.owner import owner_pid
from turnkeeper.store.records import Run, RunStatus


def attempts(fleet: Fleet, run_id: str) -> list[tuple[int, str | None, str | None]]:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        return [
            (row[0], row[1], row[2])
            for row in conn.execute(
                "SELECT epoch, outcome, handover_cause FROM attempts WHERE run_id = %s"
                " ORDER BY epoch",
                (run_id,),
            )
        ]


def handed_over_at(fleet: Fleet, run_id: str, epoch: int) -> dt.datetime:
    """When the attempt of ``epoch`` was superseded, on the database clock."""
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        row = conn.execute(
            "SELECT ended_at FROM attempts WHERE run_id = %s AND epoch = %s", (run_id, epoch)
        ).fetchone()
    assert row is not None
    assert row[0] is not None
    return row[0]  # type: ignore[no-any-return]


def mid_run(fleet: Fleet, run_id: str, chunks: int = 8) -> Run:
    """The run once its owner appended ``chunks`` chunks and marked its owner lock."""
    fleet.wait_chunks(run_id, chunks)
    return fleet.wait(run_id, lambda r: watched(fleet, r), what="its owner lock marked")


def watched(fleet: Fleet, run: Run) -> bool:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        row = conn.execute(
            "SELECT lock_attempt_id = attempt_id FROM runs WHERE run_id = %s", (run.run_id,)
        ).fetchone()
    return bool(row and row[0])


def test_sigkill_at_the_default_lease_is_a_crash_takeover(
    default_fleet: Fleet, tmp_path: Path
) -> None:
    fleet = default_fleet
    fleet.start_pair()
    fleet.wait_ready()
    run = fleet.client.submit(AGENT, PROMPT)
    owned = mid_run(fleet, run.run_id)
    assert owned.lease_expires_at is not None
    fleet.signal_worker_of(owned, signal.SIGKILL)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (2, 2)
    assert attempts(fleet, run.run_id) == [(1, "superseded", "crash"), (2, "completed", None)]
    # No lease ran out: the dead owner was handed over while the lease it held was
    # still good (the lease read before the kill ends no later than the real one).
    assert handed_over_at(fleet, run.run_id, 1) < owned.lease_expires_at
    assert fleet.client.store.takeovers_of(run.run_id) == {"crash": 1}
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)


def test_sigstop_waits_for_the_lease(settings: Settings, tmp_path: Path) -> None:
    """A frozen owner's session is open, so its lock is held: only its lease hands the
    run over, never before the lease it held ran out."""
    fleet = Fleet.create(
        settings, tmp_path / "logs", lease_ttl=6.0, heartbeat_interval=2.0, reconcile_interval=1.0
    )
    try:
        fleet.start_pair()
        fleet.wait_ready()
        run = fleet.client.submit(AGENT, PROMPT)
        mid_run(fleet, run.run_id)
        pgid = fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGSTOP)
        try:
            # The last lease the frozen owner renewed (it can renew no more).
            frozen = fleet.client.require(run.run_id)
            done = fleet.wait_settled(run.run_id)
        finally:
            os.killpg(pgid, signal.SIGCONT)
        assert frozen.epoch == 1
        assert frozen.lease_expires_at is not None
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert attempts(fleet, run.run_id) == [(1, "superseded", "lease"), (2, "completed", None)]
        assert handed_over_at(fleet, run.run_id, 1) >= frozen.lease_expires_at
        _assert_log_is_oracle(fleet, done, tmp_path)
        _assert_transcript_once(fleet, done)
    finally:
        fleet.stop()


def _terminate_connections_of(fleet: Fleet, pid: int) -> int:
    """``pg_terminate_backend`` of every database connection the process ``pid`` has."""
    port = int(
        psycopg.conninfo.conninfo_to_dict(fleet.settings.require_database_url()).get("port", 5432)
    )
    ports = [
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port
    ]
    with psycopg.connect(fleet.settings.require_database_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND client_port = ANY(%s)",
            (ports,),
        ).fetchall()
    return len(rows)


@pytest.mark.slow
def test_dropping_the_owners_connections_loses_and_doubles_nothing(
    default_fleet: Fleet, tmp_path: Path
) -> None:
    """Every database connection of the owner's process, its owner lock session
    included, is ended three times mid-run: the owner takes its lock back within the
    watcher's grace and carries on, or the watcher won the race and the owner is fenced;
    either way the log is the oracle's, exactly."""
    fleet = default_fleet
    fleet.start_pair()
    fleet.wait_ready()
    slow = {**AGENT, "pace": 0.1}
    run = fleet.client.submit(slow, PROMPT)
    owned = mid_run(fleet, run.run_id, chunks=6)
    pid = owner_pid(str(owned.owner))
    for round_ in range(3):
        while len(fleet.log_of(run.run_id)) < 6 + 8 * round_:
            time.sleep(0.02)
        current = fleet.client.require(run.run_id)
        if current.epoch != 1:
            break
        assert _terminate_connections_of(fleet, pid) >= 1, "the owner held connections"
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    causes = attempts(fleet, run.run_id)
    assert causes == [(e, "superseded", "crash") for e in range(1, done.epoch)] + [
        (done.epoch, "completed", None)
    ]
    if done.epoch > 1:
        # The watcher won a race: the owner that lost it stopped when it was refused.
        stopped = fleet.wait_events(
            "attempt.stopped", needle=owned.attempt_id or "", files="worker-*.log"
        )
        assert [e["epoch"] for e in stopped] == [1], fleet.dump_logs()
    print(f"connections dropped: the run ended at epoch {done.epoch} ({causes})")
    oracle = expected_log(run.run_id, run.session_id, slow, PROMPT, tmp_path / "oracle")
    stored = fleet.log_of(run.run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    assert [chunk for _, chunk in stored] == oracle


RUNS_AT_ONCE = 20
# About 26 s of output: every run is still going when the twentieth is seen mid-run,
# however slowly a loaded machine starts twenty sandboxes.
LONG: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.3, "seed": 12}


@pytest.mark.slow
def test_twenty_owners_killed_at_once_are_each_taken_over_once(
    default_fleet: Fleet, tmp_path: Path
) -> None:
    """Two worker processes with ten threads each, one lock session each for its ten
    runs; both killed at once."""
    fleet = default_fleet

    def threaded_worker() -> Any:
        return fleet._start(
            "worker",
            "worker",
            "-P",
            "threads",
            "-c",
            "10",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        )

    first = [threaded_worker(), threaded_worker()]
    fleet.start_beat()
    fleet.wait_ready()
    runs = [fleet.client.submit(LONG, f"{PROMPT} {i}") for i in range(RUNS_AT_ONCE)]
    with ThreadPoolExecutor(RUNS_AT_ONCE) as pool:  # each watched side by side
        owned = list(pool.map(lambda run: mid_run(fleet, run.run_id, chunks=4), runs))
    owners = {owner_pid(str(r.owner)) for r in owned}
    assert owners == {p.pid for p in first}, "ten runs in each of the two processes"
    # The leases as they stand at the kill (a heartbeat renewed them since each was seen).
    owned = [fleet.client.require(run.run_id) for run in runs]
    for proc in first:
        os.killpg(proc.pid, signal.SIGKILL)
    for proc in first:
        proc.wait()
    threaded_worker()
    threaded_worker()
    # The oracles, each the agent run directly: side by side, while the successors run.
    with ThreadPoolExecutor(RUNS_AT_ONCE) as pool:
        oracles = list(
            pool.map(
                lambda i: expected_log(
                    runs[i].run_id,
                    runs[i].session_id,
                    LONG,
                    f"{PROMPT} {i}",
                    tmp_path / "oracle" / runs[i].run_id,
                ),
                range(RUNS_AT_ONCE),
            )
        )
    for run, before, oracle in zip(runs, owned, oracles, strict=True):
        done = fleet.wait_settled(run.run_id, timeout=240)
        assert done.status is RunStatus.COMPLETED, (run.run_id, done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (2, 2), run.run_id
        assert attempts(fleet, run.run_id) == [
            (1, "superseded", "crash"),
            (2, "completed", None),
        ], run.run_id
        assert before.lease_expires_at is not None
        assert handed_over_at(fleet, run.run_id, 1) < before.lease_expires_at
        assert [chunk for _, chunk in fleet.log_of(run.run_id)] == oracle, run.run_id
