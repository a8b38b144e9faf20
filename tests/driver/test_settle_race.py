"""An owner's lease renewal racing its own settle: the renewal is refused (the run is
no longer running) a moment before or after the settle commits. That is no lost lease:
the owner settled the run, so it still appends the final chunk and closes the log.

There is no beat here, so no reaper closes a log its owner left open: a log that
never closes is this bug. Renewals every few milliseconds make the race likely on
every run; the fix (the keeper stops before the settle) makes it impossible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from tests.driver.fleet import Fleet, expected_log
from turnkeeper.store.records import RunStatus

AGENT: dict[str, Any] = {"command": ["/bin/sh", "-c", "echo one; echo two"], "format": "text"}
RUNS = 40
PROMPT = "settle me"


def test_a_renewal_racing_the_settle_leaves_the_owner_its_final_chunk(
    settings: Any, database_url: str, tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", heartbeat_interval=0.005)
    try:
        fleet.start_worker(concurrency=2)
        fleet.wait_ready()
        runs = [fleet.client.submit(AGENT, PROMPT) for _ in range(RUNS)]
        for run in runs:
            done = fleet.wait(run.run_id, lambda r: r.status.is_terminal, what="settled")
            assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
            fleet.wait_log_closed(run.run_id, timeout=60.0)  # by its owner: there is no beat
            oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "o")
            stored = fleet.log_of(run.run_id)
            assert [seq for seq, _ in stored] == list(range(1, len(oracle) + 1))
            assert [chunk for _, chunk in stored] == oracle
        with psycopg.connect(database_url) as conn:
            counts = conn.execute(
                "SELECT attempt_count FROM runs WHERE run_id = ANY(%s)",
                ([run.run_id for run in runs],),
            ).fetchall()
        assert counts == [(1,)] * RUNS
    finally:
        fleet.stop()
