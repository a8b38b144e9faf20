"""A sandbox that goes between the takeover's classification and its attach.

The classifier (``driver/recovery.py``) reads what survived once: the sandbox and the
journal alive, so ATTACH. If the sandbox goes right after that look, the attach finds it
gone; the run must then go on exactly as it does when the same loss is seen one step
earlier, at the classification (a continuation of the agent from what Postgres holds),
not fail. The failpoint ``classified`` (mode ``pause``) holds the successor between the
two steps while the test removes the sandbox.

Both runs are held after the same line of the same agent, so their logs are the same
once each run's own ids are written alike; each is also checked against the oracle
(every chunk before the loss is the crash-free run's, one interruption, the same end).
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet, chunks_while_held, expected_log, held_agent, wait_held
from tests.driver.test_sandbox_loss import (
    _assert_consistent,
    _assert_every_call_answered_once,
    _destroy_sandbox,
    _lose_owner_and_sandbox,
)
from tests.driver.test_takeover import AGENT, PROMPT
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver.placement import Placement
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.workers.failpoints import release

HELD_LINES = 20
"""The agent holds itself after this many lines: the owner dies mid-run, never after."""


def _held_run(fleet: Fleet, run_id: str) -> Run:
    """A run of AGENT held after ``HELD_LINES`` lines, all of them in its log."""
    token = uuid.uuid4().hex
    fleet.client.submit(held_agent(AGENT, token, HELD_LINES), PROMPT, run_id=run_id)
    wait_held(token)
    held = chunks_while_held(run_id, AGENT, PROMPT, HELD_LINES, fleet.logs / f"held-{run_id}")
    fleet.wait_chunks(run_id, held)
    return fleet.client.require(run_id)


def _written_alike(run: Run, chunks: list[Chunk]) -> str:
    """The log with the run's own ids written alike, to compare two runs' logs."""
    return json.dumps(chunks).replace(run.run_id, "<run>").replace(run.session_id, "<session>")


def _finished(fleet: Fleet, run: Run, tmp_path: Path) -> list[Chunk]:
    done = fleet.wait_settled(run.run_id, timeout=180)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (2, 2)
    journals = [(j.handle.paths.process, j.lost) for j in Placement.of(done).journals]
    assert journals == [(1, "sandbox-lost"), (1, None)]  # the continuation's new sandbox
    oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / run.run_id)
    chunks = _assert_consistent(fleet.log_of(run.run_id), oracle)
    _assert_every_call_answered_once(chunks)
    assert chunks[-1] == oracle[-1], "it finished like a crash-free run"
    return chunks


@pytest.mark.slow
def test_a_sandbox_gone_after_the_classification_continues_as_one_gone_before(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="classified=pause")
    try:
        fleet.start_pair()
        fleet.wait_ready()

        # Gone at the attach: the owner dies with the agent alive, the successor
        # classifies ATTACH and is held there while the sandbox goes.
        late = _held_run(fleet, "gone-at-attach")
        fleet.signal_worker_of(late, signal.SIGKILL)
        fleet.wait_failpoint("classified")
        classified = fleet.events("takeover.classified", run_id=late.run_id)
        assert [e["action"] for e in classified] == ["attach"], fleet.dump_logs()
        _destroy_sandbox(late)
        release(fleet.settings, "classified")
        at_attach = _finished(fleet, late, tmp_path)

        # Gone at the classification: the owner and the sandbox go together.
        fleet.start_worker()
        early = _held_run(fleet, "gone-at-classify")
        _lose_owner_and_sandbox(fleet, early)
        at_classify = _finished(fleet, early, tmp_path)
        classified = fleet.events("takeover.classified", run_id=early.run_id)
        assert [e["action"] for e in classified] == ["lost"]

        assert _written_alike(late, at_attach) == _written_alike(early, at_classify)
    finally:
        fleet.stop()
