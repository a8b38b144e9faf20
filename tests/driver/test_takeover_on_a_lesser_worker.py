"""A takeover on a worker that could not start the run's agent, where nothing is started.

An agent's env value can come from its worker (``env_from``, ``env_files``), and a run
can name its sandbox provider. A worker without that value, or configured with a
stronger provider than the one the run named, cannot start the agent; but a takeover
that attaches to the agent still running in its sandbox, or finishes the run from its
stored segments, starts nothing, and must not fail the run for what that worker lacks
(docs/architecture.md, "What a takeover needs of its worker").

Real workers of two kinds on one host: the owner has what the run needs, the successor
lacks it. The owner is SIGKILLed with the agent alive (held after a line, so the run is
mid-run however slow the machine) or after the sentinel is stored; the successor
completes the run, and its whole log is the oracle's.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import (
    Fleet,
    chunks_while_held,
    expected_log,
    held_agent,
    release_held,
    wait_held,
)
from tests.driver.test_crash_takeover import attempts
from tests.driver.test_takeover import AGENT, PROMPT
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus

OWNER_ONLY = "TK_OWNER_ONLY_KEY"
"""A variable the owner's worker has and the successor's has not."""
HELD_LINES = 20


def _fleets(settings: Settings, tmp_path: Path, lacks: str, ending: str) -> tuple[Fleet, Fleet]:
    """The owner's worker and the successor's, on one host (one data directory)."""
    owner_options: dict[str, Any] = {}
    if ending == "finish":  # the owner dies after storing the sentinel, before its settle
        owner_options["failpoints"] = "sentinel-stored"
    if lacks == "provider":  # the run names ``local``; the successor's worker is bwrap
        owner_options["sandbox_provider"] = "local"
    owner = Fleet.create(settings, tmp_path / "owner", **owner_options)
    owner.env[OWNER_ONLY] = "the owner's own value"
    successor = Fleet.create(settings, tmp_path / "successor", sandbox_provider="bwrap")
    assert OWNER_ONLY not in successor.env
    return owner, successor


@pytest.mark.parametrize("ending", ["attach", "finish"])
@pytest.mark.parametrize("lacks", ["env", "provider"])
def test_a_takeover_that_starts_nothing_needs_nothing_to_start_with(
    settings: Settings, tmp_path: Path, lacks: str, ending: str
) -> None:
    owner, successor = _fleets(settings, tmp_path, lacks, ending)
    token = uuid.uuid4().hex
    agent = held_agent(AGENT, token, HELD_LINES) if ending == "attach" else dict(AGENT)
    if lacks == "env":
        agent["env_from"] = [OWNER_ONLY]
    try:
        owner.start_worker()
        run = owner.client.submit(agent, PROMPT, provider="local" if lacks == "provider" else None)
        if ending == "attach":
            wait_held(token)
            held = chunks_while_held(run.run_id, AGENT, PROMPT, HELD_LINES, tmp_path / "held")
            owner.wait_chunks(run.run_id, held)
        else:
            owner.wait_failpoint("sentinel-stored")
        owned = owner.client.require(run.run_id)
        assert not owned.status.is_terminal
        successor.start_worker()
        successor.start_beat()
        owner.signal_worker_of(owned, signal.SIGKILL)
        release_held(token)
        done = successor.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (
            done.error,
            owner.dump_logs(),
            successor.dump_logs(),
        )
        assert (done.epoch, done.attempt_count) == (2, 2)
        assert [(e, o) for e, o, _ in attempts(successor, run.run_id)] == [
            (1, "superseded"),
            (2, "completed"),
        ]
        classified = successor.events("takeover.classified", run_id=run.run_id)
        action = "attach" if ending == "attach" else "finish-from-segments"
        assert [e["action"] for e in classified] == [action]
        assert successor.events("journal.spawned", run_id=run.run_id) == []  # nothing started
        stored = successor.log_of(run.run_id)
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
        oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "oracle")
        assert [chunk for _, chunk in stored] == oracle
    finally:
        successor.stop()
        owner.stop()
