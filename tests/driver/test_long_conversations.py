"""A long conversation never makes its next message fail (docs/architecture.md,
"Follow-ups"): the scripted agent takes its prompt as one argument, so the earlier
turns it recalls are cut, oldest first, to what that argument can hold, and the cut is
said in the prompt. The message itself was checked at admission."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import Fleet, expected_log, follow_up_prompt
from turnkeeper.chunks import Chunk
from turnkeeper.sandbox.command import MAX_ARGUMENT_BYTES
from turnkeeper.store.records import RunStatus

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 1, "pace": 0.0, "seed": 3}
LONG = "a" * 130_500  # fits alone, not with what a follow-up recalls after it


def _log(fleet: Fleet, run_id: str) -> list[Chunk]:
    return [chunk for _, chunk in fleet.log_of(run_id)]


def test_every_message_of_a_long_conversation_runs(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    said: list[tuple[str, list[Chunk]]] = []
    cut = []
    for index, prompt in enumerate([LONG, "hi", "hello again", "ok"], start=1):
        run = fleet.client.submit(AGENT, prompt, session_id="long", run_id=f"long-{index}")
        done = fleet.wait_settled(run.run_id)
        assert (done.status, done.error) == (RunStatus.COMPLETED, None), done.error
        given = follow_up_prompt(prompt, said, MAX_ARGUMENT_BYTES) if said else prompt
        cut.append("left out: too long to recall" in given)
        oracle = expected_log(run.run_id, "long", AGENT, given, tmp_path / "oracle")
        assert _log(fleet, run.run_id) == oracle
        said.append((prompt, oracle))
    assert cut == [False, False, True, True]  # once the recalled turns outgrew the argument


@pytest.mark.slow
def test_a_cut_follow_up_taken_over_mid_run_is_handed_the_same_prompt(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The owner of a follow-up whose recall was cut is SIGKILLed mid-output: its
    successor replays and goes on with the same prompt, and the whole log is the
    oracle's, once."""
    fleet.start_pair()
    slow: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.2, "seed": 7}
    said: list[tuple[str, list[Chunk]]] = []
    for index, prompt in enumerate([LONG, "hi", "hello again"], start=1):
        run = fleet.client.submit(AGENT, prompt, session_id="kill", run_id=f"kill-{index}")
        assert fleet.wait_settled(run.run_id).status is RunStatus.COMPLETED
        given = follow_up_prompt(prompt, said, MAX_ARGUMENT_BYTES) if said else prompt
        said.append((prompt, expected_log(run.run_id, "kill", AGENT, given, tmp_path / "o")))
    given = follow_up_prompt("go on", said, MAX_ARGUMENT_BYTES)
    assert "left out: too long to recall" in given
    run = fleet.client.submit(slow, "go on", session_id="kill", run_id="kill-4")
    fleet.wait_chunks(run.run_id, 4)
    fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
    done = fleet.wait_settled(run.run_id, timeout=180)
    assert (done.status, done.error, done.epoch) == (RunStatus.COMPLETED, None, 2)
    assert _log(fleet, run.run_id) == expected_log(run.run_id, "kill", slow, given, tmp_path / "k")
