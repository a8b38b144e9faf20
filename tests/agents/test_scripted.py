"""The bundled scripted agent, run as a real process and translated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.agents.helpers import translate_all
from turnkeeper.agents import TurnEvent, TurnTracker
from turnkeeper.agents.spec import AgentSpec


def _run(workspace: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    workspace.mkdir(parents=True, exist_ok=True)
    spec = AgentSpec.from_payload({"preset": "scripted", "seed": 4, "turns": 3, "pace": 0})
    argv = spec.argv("check the greeting") + list(extra)
    return subprocess.run(argv, cwd=workspace, capture_output=True, check=False, timeout=60)


def test_the_scripted_agent_really_runs_its_tools_and_translates_cleanly(tmp_path: Path) -> None:
    done = _run(tmp_path / "ws")
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert (lines[0]["type"], lines[0]["subtype"]) == ("system", "init")
    assert (lines[-1]["type"], lines[-1]["is_error"]) == ("result", False)
    # seed 4, turns 0..2: echo, ls, write (the kind cycles with seed + turn)
    assert sorted(p.name for p in (tmp_path / "ws").rglob("*")) == ["notes", "turn-3.txt"]
    results = [
        block["content"]
        for line in lines
        if line["type"] == "user"
        for block in line["message"]["content"]
    ]
    assert results[1] == ""  # `ls` of the empty workspace, before the note is written
    assert results[2] == "File created successfully at: notes/turn-3.txt"

    chunks = translate_all("claude-code", done.stdout, run_id="s")
    kinds = [c["type"] for c in chunks]
    assert kinds.count("TEXT_MESSAGE_START") == 4  # three tool turns and the closing one
    assert kinds.count("TEXT_MESSAGE_START") == kinds.count("TEXT_MESSAGE_END")
    assert kinds.count("TOOL_CALL_START") == kinds.count("TOOL_CALL_END") == 3
    assert [c["content"] for c in chunks if c["type"] == "TOOL_CALL_RESULT"] == results
    texts = {}
    for chunk in chunks:
        if chunk["type"] == "TEXT_MESSAGE_CONTENT":
            texts[chunk["messageId"]] = texts.get(chunk["messageId"], "") + chunk["delta"]
    full_texts = [
        b["text"]
        for line in lines
        if line["type"] == "assistant"
        for b in line["message"]["content"]
        if b["type"] == "text"
    ]
    assert list(texts.values()) == full_texts  # the deltas, once, never the full message again
    tracker = TurnTracker()
    events = [e for c in chunks if (e := tracker.observe(c)) is not None]
    assert events == [TurnEvent.TOOL_REQUEST_RECORDED, TurnEvent.TURN_COMPLETE] * 3
    assert chunks[-1]["name"] == "turnkeeper.usage"


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    first = _run(tmp_path / "ws")
    second = _run(tmp_path / "ws")  # an identical empty workspace, the same path
    assert first.stdout != b""
    # the second run sees the first one's note in `ls`, so compare in fresh workspaces
    import shutil  # noqa: PLC0415

    shutil.rmtree(tmp_path / "ws")
    third = _run(tmp_path / "ws")
    assert third.stdout == first.stdout
    assert second.stdout != first.stdout  # the tool output is real, not scripted


def test_a_continuation_prints_the_same_remaining_turns(tmp_path: Path) -> None:
    whole = _run(tmp_path / "ws").stdout.splitlines()
    # an interrupted run whose first two turns (and their tools) already happened
    rest = _run(tmp_path / "ws", "--start-turn", "2").stdout.splitlines()
    assert rest[0] == whole[0]  # the same init line, session id included
    start = (
        next(i for i, line in enumerate(whole) if b'"msg_scripted_4_2"' in line) - 1
    )  # the status line before turn 2's message_start
    assert rest[1:-1] != []
    # turn 2 is `write`, so its tool output does not depend on the workspace
    assert rest[1:-1] == whole[start:-1]
    assert orjson.loads(rest[-1])["num_turns"] == 2
    assert orjson.loads(whole[-1])["num_turns"] == 4


def test_error_and_exit_code_options(tmp_path: Path) -> None:
    done = _run(tmp_path / "ws", "--turns", "0", "--error", "model overloaded", "--exit-code", "3")
    assert done.returncode == 3
    chunks = translate_all("claude-code", done.stdout, run_id="s")
    assert chunks[-1] == {
        "type": "CUSTOM",
        "name": "turnkeeper.agent_error",
        "value": {"agent": "claude-code", "message": "model overloaded", "fatal": True},
    }


def test_the_module_runs_with_python_dash_m(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnkeeper.agents.scripted", "--help"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0
    assert b"--start-turn" in done.stdout
