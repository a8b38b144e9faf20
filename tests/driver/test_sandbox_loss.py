"""The sandbox lost mid-run (its agent killed, its directory removed).

An agent that can continue goes on in a new process after an interruption mark
(with outcome-unknown answers for its unanswered tool calls); one that cannot
fails with that reason. Either way the log stays consistent: contiguous, every
chunk once, the output before the loss exactly as a crash-free run had it.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.driver.fleet import Fleet, expected_log
from tests.driver.test_takeover import AGENT, PROMPT
from turnkeeper.chunks import Chunk
from turnkeeper.driver.lifecycle import INTERRUPTED, OUTCOME_UNKNOWN, outcome_unknown
from turnkeeper.store.records import Run, RunStatus

TEXT_AGENT: dict[str, Any] = {
    "command": [
        "sh",
        "-c",
        "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; sleep 0.2; done",
    ],
    "format": "text",
}

# An agent lost while it streams a tool call's input: the call is started, never ended.
_CUT_LINES = [
    {"type": "system", "subtype": "init", "session_id": "cut", "model": "m"},
    {
        "type": "stream_event",
        "event": {"type": "message_start", "message": {"id": "msg_cut", "content": []}},
    },
    {
        "type": "stream_event",
        "event": {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_cut", "name": "Bash", "input": {}},
        },
    },
    {
        "type": "stream_event",
        "event": {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"command": "sl'},
        },
    },
]
CUT_AGENT: dict[str, Any] = {
    "command": [
        sys.executable,
        "-c",
        "import sys, time; sys.stdout.write(sys.argv[1]); sys.stdout.flush(); time.sleep(120)",
        "".join(json.dumps(line) + "\n" for line in _CUT_LINES),
    ],
    "format": "claude-code",
    "continue": [
        *[sys.executable, "-m", "turnkeeper.agents.scripted", "--prompt", "{prompt}"],
        *["--turns", "0", "--pace", "0"],
    ],
}


def _destroy_sandbox(run: Run) -> None:
    root = Path(run.sandbox_ref["sandbox"]["root"])  # type: ignore[index]
    for proc in psutil.process_iter():
        try:
            if Path(proc.cwd()).is_relative_to(root):
                proc.send_signal(signal.SIGKILL)
        except (psutil.Error, OSError):
            continue
    shutil.rmtree(root)


def _lose_owner_and_sandbox(fleet: Fleet, run: Run) -> None:
    """The host's death: the owner and the sandbox go together. The owner is frozen
    first, so that it cannot see its sandbox go, and its takeover cannot begin (and find
    the sandbox still there) before the sandbox is gone."""
    fleet.signal_worker_of(run, signal.SIGSTOP)
    _destroy_sandbox(run)
    fleet.signal_worker_of(run, signal.SIGKILL)


def _wait_for_chunks(fleet: Fleet, run_id: str, count: int) -> Run:
    while len(fleet.log_of(run_id)) < count:
        time.sleep(0.02)
    return fleet.client.require(run_id)


def _assert_consistent(log: list[tuple[int, Chunk]], oracle: list[Chunk]) -> list[Chunk]:
    """Contiguous seqs, one interruption, the part before it exactly the oracle's."""
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    chunks = [chunk for _, chunk in log]
    marks = [i for i, c in enumerate(chunks) if c.get("name") == INTERRUPTED]
    assert len(marks) == 1, marks
    same = 0
    while chunks[same] == oracle[same]:
        same += 1
    assert same >= 8, "what clients saw before the loss is the crash-free output"
    closing = chunks[same : marks[0]]
    assert all(c["type"] in {"TEXT_MESSAGE_END", "TOOL_CALL_END"} for c in closing), closing
    starts = [c["messageId"] for c in chunks if c["type"] == "TEXT_MESSAGE_START"]
    assert len(starts) == len(set(starts)), "no message twice"
    return chunks


def _assert_every_call_answered_once(chunks: list[Chunk]) -> None:
    calls = Counter(c["toolCallId"] for c in chunks if c["type"] == "TOOL_CALL_END")
    results = Counter(c["toolCallId"] for c in chunks if c["type"] == "TOOL_CALL_RESULT")
    assert calls == results
    assert set(calls.values()) == {1}


@pytest.mark.parametrize("worker_dies_too", [False, True], ids=["owner-alive", "owner-killed"])
def test_a_continuable_agent_goes_on_after_its_sandbox_is_lost(
    fleet: Fleet, tmp_path: Path, worker_dies_too: bool
) -> None:
    fleet.start_pair()
    run = fleet.client.submit(AGENT, PROMPT)
    owned = _wait_for_chunks(fleet, run.run_id, 10)
    if worker_dies_too:
        _lose_owner_and_sandbox(fleet, owned)
    else:
        _destroy_sandbox(owned)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert done.epoch == (2 if worker_dies_too else 1)

    oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "oracle")
    chunks = _assert_consistent(fleet.log_of(run.run_id), oracle)
    _assert_every_call_answered_once(chunks)
    assert chunks[-1] == oracle[-1], "it finished like a crash-free run"
    lost = [
        c for c in chunks if c["type"] == "TOOL_CALL_RESULT" and c["content"] == OUTCOME_UNKNOWN
    ]
    assert len(lost) <= 1
    assert done.sandbox_ref is not None
    assert len(done.sandbox_ref["journals"]) == 2, "the lost process and its continuation"


def test_an_agent_that_cannot_continue_fails_with_the_reason(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_pair()
    run = fleet.client.submit(TEXT_AGENT, "")
    owned = _wait_for_chunks(fleet, run.run_id, 5)
    _lose_owner_and_sandbox(fleet, owned)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error["reason"] == "sandbox-lost"  # type: ignore[index]
    chunks = [chunk for _, chunk in fleet.log_of(run.run_id)]
    assert chunks[-1] == {
        "type": "RUN_ERROR",
        "message": "the sandbox was lost mid-run and this agent cannot continue",
        "code": "sandbox-lost",
    }
    assert [c.get("name") for c in chunks].count(INTERRUPTED) == 1
    texts = [c["delta"] for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT"]
    assert texts == [f"line {i}\n" for i in range(1, len(texts) + 1)], "a prefix, each line once"


def test_a_sandbox_lost_during_the_closing_answer_still_finishes(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The continuation has no tool call left: its stream must still be recorded as the
    turn's, or the run could never be marked consumed and would fail after its attempts."""
    fleet.start_worker()
    fleet.start_beat()
    agent = {"preset": "scripted", "turns": 1, "pace": 0.15, "seed": 2}
    run = fleet.client.submit(agent, PROMPT)
    while True:
        chunks = [chunk for _, chunk in fleet.log_of(run.run_id)]
        results = [i for i, c in enumerate(chunks) if c["type"] == "TOOL_CALL_RESULT"]
        if results and len(chunks) > results[-1] + 3:
            break
        time.sleep(0.02)
    _destroy_sandbox(fleet.client.require(run.run_id))
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert done.epoch == 1, "no takeover was needed"
    oracle = expected_log(run.run_id, run.session_id, agent, PROMPT, tmp_path / "oracle")
    final = _assert_consistent(fleet.log_of(run.run_id), oracle)
    _assert_every_call_answered_once(final)
    assert final[-1] == oracle[-1]


def test_a_tool_call_cut_off_mid_input_is_closed_and_answered(fleet: Fleet) -> None:
    """The lost process had started a tool call and was streaming its input: the call is
    closed, answered with an unknown outcome, and the continuation goes on after it."""
    fleet.start_worker()
    fleet.start_beat()
    run = fleet.client.submit(CUT_AGENT, "cut")
    owned = _wait_for_chunks(fleet, run.run_id, 4)
    _destroy_sandbox(owned)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    chunks = [chunk for _, chunk in fleet.log_of(run.run_id)]
    call = f"{run.run_id}-t0"
    assert [(c["type"], c.get("toolCallId"), c.get("name")) for c in chunks[:8]] == [
        ("RUN_STARTED", None, None),
        ("CUSTOM", None, "turnkeeper.session"),
        ("TOOL_CALL_START", call, None),
        ("TOOL_CALL_ARGS", call, None),
        ("TOOL_CALL_END", call, None),
        ("CUSTOM", None, INTERRUPTED),
        ("TOOL_CALL_RESULT", call, None),
        ("CUSTOM", None, "turnkeeper.session"),
    ]
    assert chunks[6] == outcome_unknown(call)
    _assert_every_call_answered_once(chunks)
    assert [c["type"] for c in chunks[8:]] == [
        "TEXT_MESSAGE_START",
        *["TEXT_MESSAGE_CONTENT"] * (len(chunks) - 12),
        "TEXT_MESSAGE_END",
        "CUSTOM",
        "RUN_FINISHED",
    ]
