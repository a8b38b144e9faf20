"""A frozen owner (SIGSTOP past its lease) wakes up after a takeover and changes nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.driver.fleet import Fleet
from tests.driver.test_takeover import AGENT, PROMPT, _assert_log_is_oracle, _assert_transcript_once
from turnkeeper.store.records import RunStatus


def test_a_zombie_owner_is_refused_everywhere(
    fleet: Fleet, database_url: str, tmp_path: Path
) -> None:
    fleet.start_pair()
    run = fleet.client.submit(AGENT, PROMPT)
    fleet.wait_chunks(run.run_id, 8)
    frozen = fleet.client.require(run.run_id)
    pgid = fleet.signal_worker_of(frozen, signal.SIGSTOP)
    try:
        done = fleet.wait_settled(run.run_id)
    finally:
        before_log = fleet.log_of(run.run_id)
        before_transcript = fleet.client.transcript(run.session_id)
        os.killpg(pgid, signal.SIGCONT)

    assert done.status is RunStatus.COMPLETED
    assert done.epoch == 2
    # The zombie notices at its next write or heartbeat and leaves its turn.
    (event,) = fleet.wait_events(
        "attempt.stopped", needle=frozen.attempt_id or "", files="worker-*.log"
    )
    assert event["epoch"] == 1

    assert fleet.log_of(run.run_id) == before_log
    assert fleet.client.transcript(run.session_id) == before_transcript
    after = fleet.client.require(run.run_id)
    assert (after.status, after.epoch, after.attempt_id) == (
        RunStatus.COMPLETED,
        2,
        done.attempt_id,
    )
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)
    assert os.getpgid(pgid) == pgid, "the zombie worker survived its turn and runs on"
