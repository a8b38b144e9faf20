"""A worker SIGKILLed between creating a journal and starting its writer: the journal
exists and no writer ever ran. The successor disarms it, finds no lock file, and starts
the agent afresh in the next journal: the agent runs once, the log is the crash-free
one element by element, no interruption mark, no continuation counted."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import Fleet, expected_log
from turnkeeper.driver.placement import NEVER_STARTED, PlacedJournal, Placement, process_index
from turnkeeper.driver.replay import stored_chunks
from turnkeeper.sandbox import JournalHandle, JournalPaths, SandboxRef
from turnkeeper.sandbox.journal import new_nonce
from turnkeeper.store.records import RunStatus
from turnkeeper.workers.failpoints import marker

SCRIPTED: dict[str, Any] = {"preset": "scripted", "turns": 2, "pace": 0.05, "seed": 5}
# Cannot continue; prints how often it ran in this workspace, so a second run shows.
COMMAND: dict[str, Any] = {
    "command": ["/bin/sh", "-c", "echo ran >> ran.txt; echo runs; wc -l < ran.txt"],
    "format": "text",
}
PROMPT = "start me once"


@pytest.mark.parametrize("agent", [SCRIPTED, COMMAND], ids=["scripted", "command"])
def test_sigkill_between_prepare_and_start(
    settings: Any, database_url: str, tmp_path: Path, agent: dict[str, Any]
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="after-prepare")
    try:
        fleet.start_pair()
        run = fleet.client.submit(agent, PROMPT)
        reached = marker(fleet.settings, "after-prepare")
        while not reached.exists():
            time.sleep(0.05)
        owned = fleet.wait(run.run_id, lambda r: r.owner is not None, what="an owner")
        fleet.signal_worker_of(owned, signal.SIGKILL)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (2, 2)

        oracle = expected_log(run.run_id, run.session_id, agent, PROMPT, tmp_path / "oracle")
        stored = fleet.log_of(run.run_id)
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
        assert [chunk for _, chunk in stored] == oracle
        assert list(stored_chunks(fleet.client.store, done)) == oracle

        journals = Placement.of(done).journals
        assert [(j.handle.paths.process, j.lost) for j in journals] == [
            (1, NEVER_STARTED),
            (2, None),
        ]
        assert Placement.of(done).continuations == 0
        with psycopg.connect(database_url) as conn:
            keys = conn.execute(
                "SELECT DISTINCT journal_key FROM segments WHERE run_id = %s", (run.run_id,)
            ).fetchall()
        assert keys == [(journals[1].journal_key,)], "one agent process wrote, the second"
    finally:
        fleet.stop()


def _journal(process: int, lost: str | None) -> PlacedJournal:
    ref = SandboxRef("local", "box", "/srv/box")
    paths = JournalPaths(ref.journal_dir, "run-1", process)
    return PlacedJournal(JournalHandle(ref, paths, new_nonce()), lost)


def test_a_journal_that_never_started_is_no_process() -> None:
    """It counts no continuation and shifts no later mark's number; a real loss does both."""
    journals = [
        _journal(1, NEVER_STARTED),
        _journal(2, "agent-vanished"),
        _journal(3, NEVER_STARTED),
        _journal(4, None),
    ]
    placement = Placement(journals[0].handle.ref, journals)
    assert [j.given_up for j in journals] == [False, True, False, False]
    assert [process_index(journals, i) for i in range(4)] == [0, 0, 1, 1]
    assert placement.continuations == 1
