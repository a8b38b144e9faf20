"""Many live turns in one worker process (the threads pool), and its death.

One worker process holds 200 live turns at once; it is SIGKILLed while every agent
waits, and a successor process takes each run over exactly once (the crash watcher
sees the one lock session of the dead process gone) and drives it to its end. Each
agent blocks on a FIFO in its own workspace until the test opens it, so every turn
is live at the kill and at the takeover whatever the machine's load: no timing is
assumed anywhere, the waits are hang guards.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.driver.fleet import CELERY_QUIET, DEFAULT_TIMING, Fleet, log_of_output
from turnkeeper.config import Settings
from turnkeeper.driver.placement import Placement
from turnkeeper.owner import owner_pid
from turnkeeper.store.records import Run, RunStatus

TURNS = int(os.environ.get("TK_TEST_TURNS", "200"))
GATE = "gate"
GATED: dict[str, Any] = {
    "command": [
        "sh",
        "-c",
        f"echo begin; mkfifo {GATE} && read word < {GATE}; echo $word; echo end",
    ],
    "format": "text",
}
"""Prints a line, then waits (no CPU, no clock) until its FIFO is opened and written."""
WORD = "released"
OUTPUT = f"begin\n{WORD}\nend\n".encode()


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    # The settings' own lease and heartbeat: 200 leases at the tests' fast heartbeat
    # would be a load test of the database, not of the worker.
    fleet = Fleet.create(settings, tmp_path / "logs", **DEFAULT_TIMING)
    try:
        yield fleet
    finally:
        fleet.stop()


def _wait_all(what: str, check: Any, items: list[Any], timeout: float = 900.0) -> None:
    """Until ``check(item)`` holds for every item (a hang guard, not a timing bound)."""
    deadline = time.monotonic() + timeout
    pending = list(items)
    while pending:
        pending = [item for item in pending if not check(item)]
        if pending:
            assert time.monotonic() < deadline, f"{len(pending)} runs never {what}"
            time.sleep(0.2)


def _owned(fleet: Fleet, conn: psycopg.Connection[Any], epoch: int) -> Any:
    """Whether a run's attempt of ``epoch`` is running, watched (its owner lock marked),
    and has appended the chunks of the agent's first line (it is live, not starting)."""
    # The chunks of the first line: its message ends, and the run, only with the agent.
    first_line = len(log_of_output("r", "s", "text", b"begin\n")) - 2

    def check(run: Run) -> bool:
        row = conn.execute(
            "SELECT epoch, status, lock_attempt_id = attempt_id FROM runs WHERE run_id = %s",
            (run.run_id,),
        ).fetchone()
        if row is None or tuple(row) != (epoch, "running", True):
            return False
        return len(fleet.log_of(run.run_id)) >= first_line

    return check


def _gate(fleet: Fleet, run: Run) -> Path:
    sandbox = Placement.of(fleet.client.require(run.run_id)).sandbox
    assert sandbox is not None
    return Path(sandbox.workspace) / GATE


def _release(gate: Path) -> bool:
    """Open the agent's FIFO (it waits reading it) and write its word; False until the
    agent made it and opened it."""
    try:
        fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENXIO):  # not made yet, or no reader yet
            return False
        raise
    try:
        os.write(fd, f"{WORD}\n".encode())
    finally:
        os.close(fd)
    return True


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_worker_process_holding_200_live_turns_is_killed_and_each_is_taken_over_once(
    fleet: Fleet,
) -> None:
    owner = fleet.start_worker(concurrency=TURNS, pool="threads")
    fleet.start_beat()
    fleet.wait_ready()
    runs = [fleet.client.submit(GATED, f"turn {i}") for i in range(TURNS)]
    database_url = fleet.settings.require_database_url()
    with psycopg.connect(database_url, autocommit=True) as conn:
        _wait_all("went live in the first worker", _owned(fleet, conn, 1), runs)
        owners = {owner_pid(str(fleet.client.require(run.run_id).owner)) for run in runs}
        assert owners == {owner.pid}, "every turn lives in the one worker process"

        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        fleet.start_worker(concurrency=TURNS, pool="threads")
        _wait_all("were taken over", _owned(fleet, conn, 2), runs)

    gates = [_gate(fleet, run) for run in runs]
    _wait_all("were released", _release, gates)
    for run in runs:
        done = fleet.wait_settled(run.run_id, timeout=600)
        assert done.status is RunStatus.COMPLETED, (run.run_id, done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (2, 2), run.run_id
        assert fleet.client.store.takeovers_of(run.run_id) == {"crash": 1}, run.run_id
        stored = fleet.log_of(run.run_id)
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1)), run.run_id
        oracle = log_of_output(run.run_id, run.session_id, "text", OUTPUT)
        assert [chunk for _, chunk in stored] == oracle, run.run_id
    with psycopg.connect(database_url) as conn:
        outcomes = conn.execute(
            "SELECT epoch, outcome, handover_cause, count(*) FROM attempts"
            " WHERE run_id = ANY(%s) GROUP BY 1, 2, 3 ORDER BY 1",
            ([run.run_id for run in runs],),
        ).fetchall()
    assert [tuple(row) for row in outcomes] == [
        (1, "superseded", "crash", TURNS),
        (2, "completed", None, TURNS),
    ]


def test_a_worker_raises_its_open_files_limit_to_the_hard_limit(fleet: Fleet) -> None:
    """Each live turn holds a few descriptors (its journal's follow pipe, its stop
    pipe, probes): 200 turns need more than the usual soft limit of 1024. A worker
    started under a low soft limit raises it to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)
    with (fleet.logs / "worker-limits.log").open("ab") as out:
        proc = subprocess.Popen(
            [
                *("prlimit", f"--nofile={low}:{hard}", "--"),
                *(sys.executable, "-m", "turnkeeper", "worker", "-P", "threads", "-c", "2"),
                *CELERY_QUIET,
            ],
            env=fleet.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    fleet.procs.append(proc)
    fleet.wait_ready()
    assert psutil.Process(proc.pid).rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)
