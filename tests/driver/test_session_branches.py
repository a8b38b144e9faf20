"""Branches: a run may start from an earlier entry of its session's transcript (a retry,
an edited message); the tree gains a branch, the leaf moves to it, and the agent sees
only the conversation up to that entry. Where the agent cannot fork its conversation
there, the submit is refused with the reason (docs/architecture.md, "Branches")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import Fleet, expected_log, follow_up_prompt
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.errors import AgentError, InvalidInputError
from turnkeeper.queues import enqueue_run
from turnkeeper.store.records import RunStatus

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 1, "pace": 0.01, "seed": 4}


def test_a_branch_from_turn_1_sees_no_turn_2(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    chat = fleet.client.session("chat", agent=AGENT)
    for run_id, prompt in (("t1", "write the notes"), ("t2", "add a summary")):
        chat.send(prompt, run_id=run_id)
        assert fleet.wait_settled(run_id).status is RunStatus.COMPLETED
    turn_1 = [e.entry_id for e in fleet.client.transcript("chat") if e.run_id == "t1"]
    turn_2 = [e.entry_id for e in fleet.client.transcript("chat") if e.run_id == "t2"]
    end_of_1 = turn_1[-1]

    retry = chat.send("add a short summary", run_id="t2b", from_entry=end_of_1)
    assert fleet.wait_settled(retry.run.run_id).status is RunStatus.COMPLETED
    said = expected_log("t1", "chat", AGENT, "write the notes", tmp_path / "oracle-1")
    # The workspace is the session's: turn 2's files are there; its words are not.
    workdir = tmp_path / "oracle"
    expected_log("t1", "chat", AGENT, "write the notes", workdir)
    expected_log(
        "t2", "chat", AGENT, follow_up_prompt("add a summary", [("write the notes", said)]), workdir
    )
    given = follow_up_prompt("add a short summary", [("write the notes", said)])
    assert [c for _, c in fleet.log_of("t2b")] == expected_log("t2b", "chat", AGENT, given, workdir)
    branch = [e.entry_id for e in fleet.client.transcript("chat") if e.run_id == "t2b"]
    assert [e.entry_id for e in fleet.client.transcript("chat")] == [*turn_1, *branch]
    tree = {e.entry_id: e.parent_id for e in fleet.client.store.session_entries("chat")}
    assert tree["t2/input"] == tree["t2b/input"] == end_of_1, "two children of turn 1's end"
    assert set(turn_2) <= set(tree), "the other branch stays in the tree"


def test_a_branch_is_refused_where_the_agent_cannot_fork(fleet: Fleet) -> None:
    fleet.start_worker()
    chat = fleet.client.session("chat", agent=AGENT)
    for run_id in ("t1", "t2"):
        chat.send("write the notes", run_id=run_id)
        fleet.wait_settled(run_id)
    entries = [e.entry_id for e in fleet.client.transcript("chat")]
    before = fleet.client.list_runs(session_id="chat")
    with pytest.raises(AgentError) as codex:  # codex exec resume cannot fork a thread
        chat.send("again", agent="codex", from_entry="t1/turn-1/assistant")
    assert codex.value.reason == "cannot-fork"
    assert "cannot fork its conversation" in codex.value.message
    with pytest.raises(AgentError) as claude:  # Claude Code forks, but only where a run ended
        chat.send("again", agent="claude-code", from_entry="t1/input")
    assert claude.value.reason == "cannot-fork"
    assert "where an earlier run ended" in claude.value.message
    with pytest.raises(InvalidInputError) as unknown:
        chat.send("again", from_entry="no-such-entry")
    assert unknown.value.reason == "unknown-entry"
    assert fleet.client.list_runs(session_id="chat") == before, "nothing admitted"
    assert [e.entry_id for e in fleet.client.transcript("chat")] == entries


def test_a_branch_whose_entry_stopped_being_the_leaf_after_its_submit_is_refused_at_start(
    fleet: Fleet,
) -> None:
    """Codex cannot fork a thread, so a branch of it is allowed only from the session's
    leaf while the session is settled. That check runs at submit, outside the
    admission's session lock: a plain message admitted between the check and the
    branch's admission runs first and moves the leaf, and the branch then resumed a
    thread holding that message, which its branch does not. The worker checks again
    before it records the input; here the branch is admitted as if its check had
    passed before the plain message was."""
    fleet.start_worker()
    chat = fleet.client.session("chat", agent=AGENT)
    for run_id in ("t1", "t2"):
        chat.send("write the notes", run_id=run_id)
        assert fleet.wait_settled(run_id).status is RunStatus.COMPLETED
    end_of_1 = [e.entry_id for e in fleet.client.transcript("chat") if e.run_id == "t1"][-1]
    path = [e.entry_id for e in fleet.client.transcript("chat")]
    codex = AgentSpec.from_payload("codex").to_payload()
    payload = {"agent": codex, "prompt": "again", "provider": None, "from_entry": end_of_1}
    fleet.client.store.admit_run("b", "chat", payload, max_attempts=1, deadline=None)
    enqueue_run(fleet.client.app, fleet.client.settings, "b", store=fleet.client.store)

    settled = fleet.wait_settled("b")

    assert settled.status is RunStatus.FAILED
    assert settled.error == {
        "reason": "cannot-fork",
        "message": "this agent cannot fork its conversation: it can only go on from the "
        "session's latest entry",
    }
    assert [e.entry_id for e in fleet.client.transcript("chat")] == path, "the leaf stays"
    assert "b/input" not in {e.entry_id for e in fleet.client.store.session_entries("chat")}
