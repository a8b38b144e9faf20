"""Attacks on the start slots (``workers/starts.py``, ``Attempt._take_start_slot``), with
real worker processes on one slot (``start_concurrency=1``): a slot that is never given
back starts nothing more in its process, so every later run there hangs.

Every ending a turn can reach after taking its slot is followed by a run that must
still start; turns that wait for the slot are SIGKILLed, drained and frozen past their
lease with it, and each is then run exactly once by a successor: whole logs against
the oracle, attempts, journals and agent starts counted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import Fleet, expected_log, host_fleet, log_of_output
from tests.driver.test_crash_takeover import attempts
from tests.driver.test_sandbox_loss import _assert_consistent, _destroy_sandbox, _wait_for_chunks
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.placement import NEVER_STARTED, Placement
from turnkeeper.sandbox.codec import encode_run_id
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.store.session import store_session_name
from turnkeeper.workers.failpoints import marker, release

SCRIPTED: dict[str, Any] = {"preset": "scripted", "turns": 2, "pace": 0.02, "seed": 7}
SLOW: dict[str, Any] = {
    "command": [
        "sh",
        "-c",
        "i=1; while [ $i -le 300 ]; do echo line $i; i=$((i+1)); sleep 0.2; done",
    ],
    "format": "text",
}
"""A text agent that outlives any test's cancel or deadline: a line every 0.2 s."""
FAILING: dict[str, Any] = {"command": ["sh", "-c", "echo broken; exit 3"], "format": "text"}
LOSABLE: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.1, "seed": 13}
"""79 lines, 0.1 s apart: its sandbox is destroyed mid-run, and it continues."""
STALL = 3.0
HANG = 180.0  # a hang guard: a leaked slot keeps every later run of its process waiting


def _wait_for(fleet: Fleet, what: str, predicate: Any, timeout: float = HANG) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}\n{fleet.dump_logs()}"
        time.sleep(0.05)


def _chunks(fleet: Fleet, run_id: str) -> list[Chunk]:
    """The run's whole log, its seqs checked contiguous from 1."""
    stored = fleet.log_of(run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    return [chunk for _, chunk in stored]


def _spawns(fleet: Fleet, run_id: str, files: str = "worker-*.log") -> int:
    """How many agent processes the workers started for the run."""
    return len(fleet.events("journal.spawned", run_id=run_id, files=files))


def _journals(run: Run) -> list[tuple[int, str | None]]:
    return [(j.handle.paths.process, j.lost) for j in Placement.of(run).journals]


def _segment_keys(fleet: Fleet, run_id: str) -> list[str]:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT DISTINCT journal_key FROM segments WHERE run_id = %s", (run_id,)
        ).fetchall()
    return [row[0] for row in rows]


def _outcomes(fleet: Fleet, run_id: str) -> list[tuple[int, str | None]]:
    """Each attempt's epoch and outcome (a crash or a lease handover alike)."""
    return [(epoch, outcome) for epoch, outcome, _ in attempts(fleet, run_id)]


def _waiting(fleet: Fleet, run_id: str) -> Run:
    """The run once its owner recorded the journal it waits to spawn in: the last step
    before the slot (``Attempt._start``)."""
    return fleet.wait(
        run_id,
        lambda r: r.status is RunStatus.RUNNING and len(Placement.of(r).journals) == 1,
        what="its journal recorded",
    )


def _too_long_key(tmp_path: Path) -> str:
    """A key file longer than any key (``worker_env.MAX_FILE_BYTES``)."""
    path = tmp_path / "big.key"
    path.write_text("v" * (128 * 1024))
    return str(path)


def _settled(fleet: Fleet, run_id: str) -> Run:
    return fleet.wait_settled(run_id, timeout=HANG)


# --- every ending gives the slot back -----------------------------------------------


@pytest.mark.parametrize("restart", ["after-prepare=unreachable", "after-prepare=lost"])
@pytest.mark.slow
def test_runs_in_a_row_through_one_slot_each_start_after_every_ending(
    settings: Settings, tmp_path: Path, restart: str
) -> None:
    """One slot, runs one after another, each ending its own way after it took the slot:
    a journal that never started (restarted holding the slot, or after a stall that gave
    it back), a spawn refused after the take, an agent failing, a cancel, a deadline, a
    sandbox lost mid-run (taken again for the continuation). Each next run still starts,
    and the last completes: no ending kept the slot."""
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        start_concurrency=1,
        failpoints=restart,
        journal_stall_timeout=STALL,
    )
    try:
        fleet.start_worker(2, pool="threads")
        fleet.start_beat()
        fleet.wait_ready()

        first = fleet.client.submit(SCRIPTED, "restart me")
        done = _settled(fleet, first.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert _chunks(fleet, done.run_id) == expected_log(
            done.run_id, done.session_id, SCRIPTED, "restart me", tmp_path / "o1"
        )
        assert _journals(done) == [(1, NEVER_STARTED), (2, None)]

        # Refused as it starts: admission refuses a prompt or an env value no exec can
        # take, not a key file the worker reads then (``env_files``) that is too long.
        refused = fleet.client.submit(
            {**SCRIPTED, "env_files": {"BIG": _too_long_key(tmp_path)}}, "refuse me"
        )
        done = _settled(fleet, refused.run_id)
        assert done.status is RunStatus.FAILED, fleet.dump_logs()
        assert done.error["reason"] == "env-file"
        assert _chunks(fleet, done.run_id) == [
            lifecycle.run_started(done.run_id, done.session_id),
            lifecycle.final_chunk(done),
        ]
        assert _spawns(fleet, done.run_id) == 0

        failing = fleet.client.submit(FAILING, "fail")
        done = _settled(fleet, failing.run_id)
        assert done.status is RunStatus.FAILED, fleet.dump_logs()
        oracle = log_of_output(done.run_id, done.session_id, "text", b"broken\n")
        assert _chunks(fleet, done.run_id) == [
            *oracle[:-1],
            lifecycle.run_error("the agent exited with code 3", "agent-exit"),
        ]

        cancelled = fleet.client.submit(SLOW, "cancel me")
        fleet.wait_chunks(cancelled.run_id, 4)
        fleet.client.cancel(cancelled.run_id)
        done = _settled(fleet, cancelled.run_id)
        assert done.status is RunStatus.ABORTED, fleet.dump_logs()
        _assert_cut_short(fleet, done, lifecycle.cancelled())

        late = fleet.client.submit(SLOW, "pass my deadline", timeout=3.0)
        done = _settled(fleet, late.run_id)
        assert done.status is RunStatus.FAILED, fleet.dump_logs()
        deadline = "the run passed its deadline"
        _assert_cut_short(fleet, done, lifecycle.run_error(deadline, "deadline-exceeded"))

        lost = fleet.client.submit(LOSABLE, "lose my sandbox")
        _destroy_sandbox(_wait_for_chunks(fleet, lost.run_id, 10))
        done = _settled(fleet, lost.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        oracle = expected_log(
            done.run_id, done.session_id, LOSABLE, "lose my sandbox", tmp_path / "o3"
        )
        chunks = _assert_consistent(fleet.log_of(done.run_id), oracle)
        assert chunks[-1] == oracle[-1]
        assert _journals(done) == [(1, "sandbox-lost"), (1, None)]  # the continuation's sandbox
        assert _spawns(fleet, done.run_id) == 2

        last = fleet.client.submit(SCRIPTED, "still one slot")
        done = _settled(fleet, last.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert _chunks(fleet, done.run_id) == expected_log(
            done.run_id, done.session_id, SCRIPTED, "still one slot", tmp_path / "o2"
        )
        assert fleet.events("start_slot.left") == []  # none waited: each found the slot free
    finally:
        fleet.stop()


def _assert_cut_short(fleet: Fleet, done: Run, final: Chunk) -> None:
    """The log is the agent's output so far, exactly as a crash-free run streams it, then
    ``final``: a prefix of the oracle without its closing chunks."""
    chunks = _chunks(fleet, done.run_id)
    lines = b"".join(b"line %d\n" % n for n in range(1, 301))
    oracle = log_of_output(done.run_id, done.session_id, "text", lines)
    assert len(chunks) >= 3
    assert chunks[:-1] == oracle[: len(chunks) - 1]
    assert chunks[-1] == final


# --- a worker SIGKILLed while turns wait for its slot ----------------------------------


def test_turns_waiting_for_the_slot_of_a_killed_worker_each_run_once(
    settings: Settings, tmp_path: Path
) -> None:
    """One slot, held by a run whose worker is SIGKILLed between making its journal and
    starting its writer; three more runs of that process wait behind it, their journals
    recorded. The successor (one slot too) takes all four over: the first finds its
    journal never started and restarts it, the others start in the journal their owner
    recorded. Every log is its oracle, every agent started once, by the successor."""
    fleet = Fleet.create(
        settings, tmp_path / "logs", start_concurrency=1, failpoints="after-prepare"
    )
    try:
        fleet.start_worker(4, pool="threads")
        fleet.start_beat()
        fleet.wait_ready()
        prompts = [f"wait in line {n}" for n in range(4)]
        holder = fleet.client.submit(SCRIPTED, prompts[0])
        _wait_for(fleet, "at after-prepare", marker(fleet.settings, "after-prepare").exists)
        waiters = [fleet.client.submit(SCRIPTED, prompt) for prompt in prompts[1:]]
        runs = [holder, *waiters]
        for run in waiters:
            _waiting(fleet, run.run_id)
        fleet.signal_worker_of(fleet.client.require(holder.run_id), signal.SIGKILL)
        fleet.start_worker(4, pool="threads")

        for run, prompt in zip(runs, prompts, strict=True):
            done = _settled(fleet, run.run_id)
            assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
            assert _outcomes(fleet, run.run_id) == [(1, "superseded"), (2, "completed")]
            assert _chunks(fleet, run.run_id) == expected_log(
                run.run_id, done.session_id, SCRIPTED, prompt, tmp_path / f"o-{run.run_id}"
            )
            assert _spawns(fleet, run.run_id, "worker-0.log") == 0  # none by the killed owner
            assert _spawns(fleet, run.run_id) == 1
            journals = Placement.of(done).journals
            expected = [(1, NEVER_STARTED), (2, None)] if run is holder else [(1, None)]
            assert _journals(done) == expected
            assert _segment_keys(fleet, run.run_id) == [journals[-1].journal_key]
    finally:
        fleet.stop()


# --- a drain while a turn waits for the slot -------------------------------------------


def test_a_drain_hands_over_a_turn_waiting_for_the_slot_and_it_runs_once(
    settings: Settings, tmp_path: Path
) -> None:
    """One slot, held by a run paused before its spawn; the run behind it waits. A drain
    (``worker --drain --hand-over-after 0``) hands the waiting run over from the wait,
    before any agent started; the holder, let go, starts its agent and is handed over
    from its follow. The redeployed worker runs both to the end: each log its oracle,
    one journal each, each agent started once (the waiter's by the new worker)."""
    host = host_fleet(
        settings,
        tmp_path / "hosts",
        "host-a",
        start_concurrency=1,
        failpoints="before-spawn=pause",
    )
    drain: subprocess.Popen[bytes] | None = None
    try:
        host.start_worker(2, pool="threads")
        host.start_beat()
        host.wait_ready()
        holder = host.client.submit(SCRIPTED, "hold the slot")
        _wait_for(host, "at before-spawn", marker(host.settings, "before-spawn").exists)
        waiter = host.client.submit(SCRIPTED, "wait behind it")
        _waiting(host, waiter.run_id)

        drain = subprocess.Popen(
            [sys.executable, "-m", "turnkeeper", "worker", "--drain", "--hand-over-after", "0"],
            env=host.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        host.wait_events("start_slot.left", run_id=waiter.run_id, timeout=HANG)
        host.wait_events("attempt.released", run_id=waiter.run_id, timeout=HANG)
        assert _spawns(host, waiter.run_id) == 0
        release(host.settings, "before-spawn")
        assert drain.wait(timeout=HANG) == 0, host.dump_logs()
        host.start_worker(2, pool="threads")  # the redeploy

        for run, prompt in [(holder, "hold the slot"), (waiter, "wait behind it")]:
            done = _settled(host, run.run_id)
            assert done.status is RunStatus.COMPLETED, (done.error, host.dump_logs())
            assert _outcomes(host, run.run_id) == [(1, "superseded"), (2, "completed")]
            assert _chunks(host, run.run_id) == expected_log(
                run.run_id, done.session_id, SCRIPTED, prompt, tmp_path / f"o-{run.run_id}"
            )
            assert _journals(done) == [(1, None)]
            assert _spawns(host, run.run_id) == 1
            drained_spawns = _spawns(host, run.run_id, "worker-0.log")
            assert drained_spawns == (1 if run is holder else 0)
        assert len(host.events("attempt.released", files="worker-0.log")) == 2
    finally:
        if drain is not None and drain.poll() is None:
            drain.kill()
            drain.wait(30)
        host.stop()


# --- a turn frozen in the wait past its lease ------------------------------------------


def _blocked_behind(fleet: Fleet, backend: int, owner: str) -> int:
    """How many store sessions of the worker process ``owner`` wait for a lock that
    session ``backend`` holds."""
    with psycopg.connect(fleet.settings.require_database_url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND %s = ANY(pg_blocking_pids(pid))",
            (store_session_name(owner), backend),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_turn_frozen_while_waiting_for_the_slot_starts_no_agent_when_it_wakes(
    settings: Settings, tmp_path: Path
) -> None:
    """One slot, held by a run paused before its spawn; a run of a named session waits
    for it. The worker is frozen (SIGSTOP) past both leases and a successor runs both to
    the end; the session's workspace stays, its journal files removed. The worker is
    woken with the holder let go while no run row can be written (the test locks the
    table), so no heartbeat of the woken process can learn its lease is gone: a turn
    that takes the slot must ask the store whether its lease outlasted the wait before
    it starts anything. No agent is started again in the workspace, and the logs,
    attempts and journals are the successor's alone."""
    fleet = Fleet.create(
        settings, tmp_path / "logs", start_concurrency=1, failpoints="before-spawn=pause"
    )
    frozen: int | None = None
    try:
        fleet.start_worker(2, pool="threads")
        fleet.start_beat()
        fleet.wait_ready()
        holder = fleet.client.submit(SCRIPTED, "hold the slot")
        _wait_for(fleet, "at before-spawn", marker(fleet.settings, "before-spawn").exists)
        waiter = fleet.client.submit(SCRIPTED, "wait behind it", session_id="kept-workspace")
        _waiting(fleet, waiter.run_id)
        frozen = fleet.signal_worker_of(fleet.client.require(waiter.run_id), signal.SIGSTOP)
        fleet.start_worker(2, pool="threads")
        prompts = {holder.run_id: "hold the slot", waiter.run_id: "wait behind it"}
        settled = {run_id: _settled(fleet, run_id) for run_id in prompts}
        logs = {run_id: _chunks(fleet, run_id) for run_id in prompts}
        workspace = Placement.of(settled[waiter.run_id]).journals[0].handle.paths.directory
        # Its owner removes them once it settled the run and closed its log: after the
        # settle a client sees, so waited for, not asserted at once.
        _wait_for(
            fleet,
            "the settled run's journals removed",
            lambda: not _run_files(workspace, waiter.run_id),
        )

        (_, _, stale_owner), _ = fleet.attempts(waiter.run_id)
        with psycopg.connect(fleet.settings.require_database_url()) as lock:
            # No run row can be written while it is held; the runs can be read.
            lock.execute("LOCK TABLE runs IN SHARE MODE")
            release(fleet.settings, "before-spawn")
            os.killpg(frozen, signal.SIGCONT)
            frozen = None
            # The woken turns' heartbeats wait on the lock, and so does whatever each turn
            # writes next: the holder's (its confirmation, or after its failed spawn its
            # lease check), then the waiter's, unless it spawned without asking.
            _wait_for(
                fleet,
                "the woken owner's writes waiting on the lock, or a spawn",
                lambda: (
                    _spawns(fleet, waiter.run_id, "worker-0.log") > 0
                    or _blocked_behind(fleet, lock.info.backend_pid, stale_owner) >= 3
                ),
            )
            time.sleep(1.0)  # room for a spawn that asked nobody to show; no timing asserted
            lock.rollback()
        for run_id in prompts:
            stopped = fleet.wait_events("attempt.stopped", run_id=run_id, timeout=HANG)
            assert [e["epoch"] for e in stopped] == [1]
        assert _spawns(fleet, waiter.run_id, "worker-0.log") == 0, "the woken owner started one"
        assert _run_files(workspace, waiter.run_id) == []
        for run_id, prompt in prompts.items():
            done = fleet.client.require(run_id)
            assert (done.status, done.epoch, done.attempt_id) == (
                RunStatus.COMPLETED,
                2,
                settled[run_id].attempt_id,
            )
            assert _outcomes(fleet, run_id) == [(1, "superseded"), (2, "completed")]
            assert _chunks(fleet, run_id) == logs[run_id]
            assert logs[run_id] == expected_log(
                run_id, done.session_id, SCRIPTED, prompt, tmp_path / f"o-{run_id}"
            )
            assert _spawns(fleet, run_id) == 1
            assert _journals(done) == [(1, None)]
    finally:
        if frozen is not None:
            os.killpg(frozen, signal.SIGCONT)
        fleet.stop()


def _run_files(directory: str, run_id: str) -> list[str]:
    """The files of ``run_id``'s agent processes in a journal directory."""
    return sorted(p.name for p in Path(directory).iterdir() if encode_run_id(run_id) in p.name)
