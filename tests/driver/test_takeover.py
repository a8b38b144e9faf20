"""Runs survive worker death: real workers, SIGKILLed at each phase boundary.

Every test compares the whole log, element by element, with the oracle: the
same agent run directly and translated, wrapped in the run's first and last chunk.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import (
    Fleet,
    chunks_while_held,
    expected_log,
    held_agent,
    output_lines,
    release_held,
    transcript_of_tool_turns,
    wait_held,
)
from turnkeeper.agents.formats import translator_for
from turnkeeper.store.records import Run, RunStatus, TurnPhase

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.05, "seed": 11}
PROMPT = "survive the crash"


def _oracle(run: Run, tmp_path: Path) -> list[dict[str, Any]]:
    return expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "oracle")


def _assert_log_is_oracle(fleet: Fleet, run: Run, tmp_path: Path) -> None:
    stored = fleet.log_of(run.run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    assert [chunk for _, chunk in stored] == _oracle(run, tmp_path)


def _attempts(database_url: str, run_id: str) -> list[tuple[int, str | None]]:
    with psycopg.connect(database_url) as conn:
        return [
            (row[0], row[1])
            for row in conn.execute(
                "SELECT epoch, outcome FROM attempts WHERE run_id = %s ORDER BY epoch", (run_id,)
            )
        ]


def _assert_transcript_once(fleet: Fleet, run: Run) -> None:
    """Input, then each tool turn (assistant, tools), then the closing answer: once each."""
    ids = [entry.entry_id for entry in fleet.client.transcript(run.session_id)]
    assert ids == transcript_of_tool_turns(run, AGENT["turns"])


def test_a_run_without_crash_matches_the_oracle(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    run = fleet.client.submit(AGENT, PROMPT)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, fleet.dump_logs()
    assert (done.epoch, done.attempt_count) == (1, 1)
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)


def _kill_and_finish(
    fleet: Fleet,
    run: Run,
    database_url: str,
    tmp_path: Path,
    *,
    then: Callable[[], None] | None = None,
) -> None:
    """SIGKILL the owner (then do ``then``: let a held agent go on), and check that the
    successor finishes the run as a run without crash would have."""
    fleet.signal_worker_of(run, signal.SIGKILL)
    if then is not None:
        then()
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert done.epoch == 2
    assert done.attempt_count == 2
    assert _attempts(database_url, run.run_id) == [(1, "superseded"), (2, "completed")]
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)
    _assert_segments_whole(fleet, done)


def _assert_segments_whole(fleet: Fleet, run: Run) -> None:
    """The journal's bytes are stored once: contiguous, one sentinel, at the very end."""
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT journal_key, byte_start, byte_end, body FROM segments"
            " WHERE run_id = %s ORDER BY journal_key, byte_start",
            (run.run_id,),
        ).fetchall()
    assert len({r[0] for r in rows}) == 1, "one agent process, one stream"
    stored = b"".join(bytes(r[3]) for r in rows)
    ends = [r[2] for r in rows]
    assert [r[1] for r in rows] == [0, *ends[:-1]], "contiguous from byte 0"
    lines = stored.splitlines()
    assert [i for i, line in enumerate(lines) if line.startswith(b'{"__exit":')] == [len(lines) - 1]


@pytest.mark.parametrize("point", ["before-spawn", "after-sentinel", "sentinel-stored"])
def test_sigkill_at_a_failpoint(
    settings: Any, database_url: str, tmp_path: Path, point: str
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints=point)
    try:
        fleet.start_pair()
        run = fleet.client.submit(AGENT, PROMPT)
        fleet.wait_failpoint(point)  # a hang guard: fails with the workers' logs
        owned = fleet.wait(run.run_id, lambda r: r.owner is not None, what="an owner")
        _kill_and_finish(fleet, owned, database_url, tmp_path)
    finally:
        fleet.stop()


def test_sigkill_mid_stream(fleet: Fleet, database_url: str, tmp_path: Path) -> None:
    fleet.start_pair()
    run = fleet.client.submit(AGENT, PROMPT)
    fleet.wait_chunks(run.run_id, 8)
    _kill_and_finish(fleet, fleet.client.require(run.run_id), database_url, tmp_path)


def _first_tool_call(workdir: Path) -> tuple[int, int]:
    """The numbers (from 1) of the agent's line that ends its first tool call and of the
    line that brings that call's result, from the agent run directly."""
    translator = translator_for("claude-code", "oracle")
    ended = None
    for number, line in enumerate(output_lines(AGENT, PROMPT, workdir), start=1):
        types = {chunk["type"] for chunk in translator.feed(line)}
        if ended is None and "TOOL_CALL_END" in types:
            ended = number
        if "TOOL_CALL_RESULT" in types:
            assert ended is not None
            return ended, number
    raise AssertionError("the agent never called a tool")


def test_sigkill_during_a_tool_call(fleet: Fleet, database_url: str, tmp_path: Path) -> None:
    """The owner dies while the agent runs its first tool: the slot holds the tool
    request and no result. The agent is held twice, so that a fast turn cannot go by
    unseen: after the line that ends the call (once the driver consumed it, the request
    waits for the turn's next write), then after the lines that follow it (stored with
    the request, ``tool_request_recorded``) and before the result."""
    ended, result = _first_tool_call(tmp_path / "lines")
    assert ended < result - 1, "a line between the call's end and its result"
    token = f"tool-call-{tmp_path.name}"
    fleet.start_pair()
    run = fleet.client.submit(held_agent(AGENT, token, (ended, result - 1)), PROMPT)
    wait_held(token)
    consumed = chunks_while_held(run.run_id, AGENT, PROMPT, ended, tmp_path / "held")
    fleet.wait_chunks(run.run_id, consumed)
    release_held(token)
    store = fleet.client.store
    deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
    while (slot := store.get_turn_slot(run.run_id)) is None or (
        slot.phase is not TurnPhase.TOOL_REQUEST_RECORDED
    ):
        assert time.monotonic() < deadline, (
            f"the turn slot never showed the tool request (last: {slot})\n" + fleet.dump_logs()
        )
        time.sleep(0.01)
    wait_held(token)  # before the result: the request is the slot's last word
    slot = store.get_turn_slot(run.run_id)
    assert slot is not None
    assert (slot.turn_index, slot.phase) == (0, TurnPhase.TOOL_REQUEST_RECORDED)
    owned = fleet.client.require(run.run_id)
    _kill_and_finish(fleet, owned, database_url, tmp_path, then=lambda: release_held(token))
