"""The window between an owner's last heartbeat and its settle (``Attempt._settle``).

The owner stops its heartbeat before it settles, so from there on its lease only
runs out. Each test stops the owner right there (the ``settling`` failpoint): killed
(SIGKILL), slow past its lease, frozen (SIGSTOP) and woken after a takeover, or
meeting a Postgres outage with no heartbeat to notice it. Whoever settles the run,
it ends with the agent's own status and error, its final chunk lands once, and the
whole log is the one a crash-free run makes, element by element.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import Fleet, expected_log
from tests.driver.test_log_loss import lose_logs
from tests.driver.test_takeover import (
    AGENT,
    PROMPT,
    _assert_log_is_oracle,
    _assert_segments_whole,
    _assert_transcript_once,
    _attempts,
)
from turnkeeper.agents.formats import translator_for
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.workers.failpoints import release

# An agent that fails on its own: its error carries its exit code and its stderr.
FAILING: dict[str, Any] = {
    "command": ["/bin/sh", "-c", "echo one; echo two; echo oops >&2; exit 3"],
    "format": "text",
}
FAILING_ERROR = {
    "reason": "agent-exit",
    "message": "the agent exited with code 3",
    "exit_code": 3,
    "stderr": "oops\n",
}
OUTAGE = 6.0  # seconds: three leases of the test fleet (``FAST``)


def _failing_oracle(run: Run, workdir: Path) -> list[Chunk]:
    workdir.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        FAILING["command"], cwd=workdir, capture_output=True, check=False, timeout=60
    ).stdout
    translator = translator_for("text", run.run_id)
    chunks: list[Chunk] = [lifecycle.run_started(run.run_id, run.session_id)]
    for line in out.splitlines(keepends=True):
        chunks.extend(translator.feed(line))
    chunks.extend(translator.finish())
    chunks.append(lifecycle.run_error(FAILING_ERROR["message"], FAILING_ERROR["reason"]))
    return chunks


def test_a_failing_agent_settles_with_its_own_error_without_a_crash(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The baseline the takeovers below must match."""
    fleet.start_worker()
    run = fleet.client.submit(FAILING, PROMPT)
    done = fleet.wait_settled(run.run_id)
    assert (done.status, done.error) == (RunStatus.FAILED, FAILING_ERROR), fleet.dump_logs()
    stored = fleet.log_of(run.run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    assert [chunk for _, chunk in stored] == _failing_oracle(done, tmp_path / "o")


@pytest.mark.parametrize("agent", ["completes", "fails"])
def test_an_owner_killed_after_its_heartbeat_stopped_is_finished_once(
    settings: Settings, database_url: str, tmp_path: Path, agent: str
) -> None:
    """SIGKILL between ``keeper.stop()`` and the settle statement: the successor
    finishes from the segments, with the status and error the agent's own exit gives."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="settling")
    try:
        fleet.start_pair()
        spec = AGENT if agent == "completes" else FAILING
        run = fleet.client.submit(spec, PROMPT)
        fleet.wait_failpoint("settling")
        owned = fleet.client.require(run.run_id)
        assert (owned.status, owned.epoch) == (RunStatus.RUNNING, 1)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        done = fleet.wait_settled(run.run_id)
        assert (done.epoch, done.attempt_count) == (2, 2), fleet.dump_logs()
        if agent == "completes":
            assert (done.status, done.error) == (RunStatus.COMPLETED, None), fleet.dump_logs()
            assert _attempts(database_url, run.run_id) == [(1, "superseded"), (2, "completed")]
            _assert_log_is_oracle(fleet, done, tmp_path)
            _assert_transcript_once(fleet, done)
            _assert_segments_whole(fleet, done)
        else:
            assert (done.status, done.error) == (RunStatus.FAILED, FAILING_ERROR)
            assert _attempts(database_url, run.run_id) == [(1, "superseded"), (2, "failed")]
            stored = fleet.log_of(run.run_id)
            assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
            assert [chunk for _, chunk in stored] == _failing_oracle(done, tmp_path / "o")
    finally:
        fleet.stop()


@pytest.mark.parametrize("frozen", [False, True], ids=["slow", "sigstop"])
def test_an_owner_stalled_past_its_lease_before_its_settle_is_refused(
    settings: Settings, database_url: str, tmp_path: Path, frozen: bool
) -> None:
    """The owner stops its heartbeat, then stays (slow, or SIGSTOPped) until its lease
    ran out, a successor adopted the run and settled it. Let go, its settle is refused
    (``store-fenced``) and it writes nothing: the log stays the successor's."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="settling=pause")
    pgid: int | None = None
    try:
        fleet.start_pair()
        run = fleet.client.submit(AGENT, PROMPT)
        fleet.wait_failpoint("settling")
        owned = fleet.client.require(run.run_id)
        if frozen:
            pgid = fleet.signal_worker_of(owned, signal.SIGSTOP)
        done = fleet.wait_settled(run.run_id)  # by the successor, on the other worker
        assert (done.status, done.epoch, done.attempt_count) == (RunStatus.COMPLETED, 2, 2)
        settled = fleet.log_of(run.run_id)
        release(fleet.settings, "settling")
        if pgid is not None:
            os.killpg(pgid, signal.SIGCONT)
            pgid = None
        (event,) = fleet.wait_events(
            "attempt.stopped", needle=owned.attempt_id or "", files="worker-*.log"
        )
        assert (event["epoch"], event["reason"]) == (1, "store-fenced")
        assert fleet.log_of(run.run_id) == settled
        assert _attempts(database_url, run.run_id) == [(1, "superseded"), (2, "completed")]
        after = fleet.client.require(run.run_id)
        assert (after.status, after.epoch, after.attempt_count) == (RunStatus.COMPLETED, 2, 2)
        _assert_log_is_oracle(fleet, after, tmp_path)
        _assert_transcript_once(fleet, after)
        _assert_segments_whole(fleet, after)
    finally:
        if pgid is not None:
            os.killpg(pgid, signal.SIGCONT)
        fleet.stop()


def _database_outage(admin_database_url: str, database_url: str, allow: bool) -> None:
    """Refuse (or allow again) every connection to the test's database, and end the
    ones it has: for this database, Postgres is down."""
    name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(admin_database_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )


def test_a_postgres_outage_during_the_settle_ends_the_run_once(
    settings: Settings, admin_database_url: str, database_url: str, tmp_path: Path
) -> None:
    """Postgres goes down as the owner settles, with its heartbeat already stopped, for
    three leases. The owner retries its settle meanwhile; once Postgres is back either
    it settles first, or the reconciler hands the run over and the owner's settle is
    refused. Either way the run completes once, its final chunk lands once."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="settling=pause")
    try:
        fleet.start_pair()
        run = fleet.client.submit(AGENT, PROMPT)
        fleet.wait_failpoint("settling")
        _database_outage(admin_database_url, database_url, allow=False)
        try:
            release(fleet.settings, "settling")
            time.sleep(OUTAGE)
        finally:
            _database_outage(admin_database_url, database_url, allow=True)
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        history = _attempts(database_url, run.run_id)
        assert history in ([(1, "completed")], [(1, "superseded"), (2, "completed")]), history
        assert (done.epoch, done.attempt_count) == (len(history), len(history))
        _assert_log_is_oracle(fleet, done, tmp_path)
        _assert_transcript_once(fleet, done)
        _assert_segments_whole(fleet, done)
    finally:
        fleet.stop()


def test_an_agent_killed_past_its_memory_limit_keeps_that_reason_after_a_takeover(
    settings: Settings, tmp_path: Path
) -> None:
    """The owner dies before it settles an agent the memory limit killed: the successor
    reads the limit from the sandbox as the owner would have, not a bare exit 137."""
    fleet = Fleet.create(
        settings, tmp_path / "logs", sandbox_memory=64 * 1024 * 1024, failpoints="settling"
    )
    try:
        fleet.start_pair()
        hog = "echo start; exec python3 -c 'x = b\"m\" * (512 * 1024 * 1024)'"
        run = fleet.client.submit({"command": ["/bin/sh", "-c", hog], "format": "text"}, "p")
        fleet.wait_failpoint("settling")
        fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
        done = fleet.wait_settled(run.run_id)
        assert (done.status, done.epoch) == (RunStatus.FAILED, 2), fleet.dump_logs()
        assert done.error == {
            "reason": "memory-limit",
            "message": "the agent passed its memory limit and was killed",
            "exit_code": 137,
            "stderr": "",
            "limits": {"memory_kills": 1, "pid_limit_hits": 0},
        }
        assert fleet.log_of(run.run_id)[-1] == (
            len(fleet.log_of(run.run_id)),
            lifecycle.run_error("the agent passed its memory limit and was killed", "memory-limit"),
        )
    finally:
        fleet.stop()


# A turn long enough to hold its worker's slot while the victim's takeover waits.
BLOCKER: dict[str, Any] = {
    "command": ["/bin/sh", "-c", "for i in $(seq 1 40); do echo line $i; sleep 0.5; done"],
    "format": "text",
}


@pytest.mark.slow
def test_a_stalled_settle_on_a_saturated_fleet_costs_one_adoption(
    settings: Settings, database_url: str, tmp_path: Path
) -> None:
    """Two one-slot workers: one busy with a long turn, the other's owner stalled before
    its settle past its lease. The handover comes, the takeover waits for a slot (the
    stalled owner still holds its own), and Redis loses both logs meanwhile. Let go, the
    stalled owner's settle is refused, its slot frees, the takeover is adopted there:
    one claim and one adoption, two attempts, both logs the oracle."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="settling=pause")
    try:
        fleet.start_pair()
        fleet.wait_ready()
        busy = fleet.client.submit(BLOCKER, PROMPT)
        fleet.wait(busy.run_id, lambda r: r.owner is not None, what="an owner")
        victim = fleet.client.submit(AGENT, PROMPT)
        fleet.wait_failpoint("settling")
        stalled = fleet.client.require(victim.run_id)
        handed = fleet.wait(victim.run_id, lambda r: r.awaiting_adoption, what="a handover")
        assert (handed.epoch, handed.attempt_count, handed.owner) == (2, 1, None)
        assert lose_logs(fleet) == 4  # two runs, a stream and a meta each
        time.sleep(2 * fleet.settings.requeue_after)  # redispatched, still no slot free
        waiting = fleet.client.require(victim.run_id)
        assert (waiting.epoch, waiting.attempt_count, waiting.owner) == (2, 1, None)
        assert fleet.client.require(busy.run_id).status is RunStatus.RUNNING
        release(fleet.settings, "settling")
        done = fleet.wait_settled(victim.run_id, timeout=180)
        assert (done.status, done.epoch, done.attempt_count) == (RunStatus.COMPLETED, 2, 2), (
            done.error,
            fleet.dump_logs(),
        )
        assert _attempts(database_url, victim.run_id) == [(1, "superseded"), (2, "completed")]
        (event,) = fleet.wait_events(
            "attempt.stopped", needle=stalled.attempt_id or "", files="worker-*.log"
        )
        assert (event["epoch"], event["reason"]) == (1, "store-fenced")
        _assert_log_is_oracle(fleet, done, tmp_path)
        _assert_transcript_once(fleet, done)
        _assert_segments_whole(fleet, done)
        busy_done = fleet.wait_settled(busy.run_id, timeout=180)
        assert (busy_done.status, busy_done.attempt_count) == (RunStatus.COMPLETED, 1)
        stored = fleet.log_of(busy.run_id)
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
        assert [chunk for _, chunk in stored] == expected_log(
            busy.run_id, busy.session_id, BLOCKER, PROMPT, tmp_path / "oracle-busy"
        )
    finally:
        fleet.stop()
