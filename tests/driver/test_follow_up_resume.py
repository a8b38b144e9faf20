"""Which conversation of its own a follow-up resumes (docs/architecture.md, "Follow-ups"):
read from the runs and the transcript in Postgres, as a successor reads them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.driver.conversation import FollowUp
from turnkeeper.store import Store
from turnkeeper.store.records import NewEntry, RunStatus

CLAUDE: dict[str, Any] = {"agent": "claude-code"}


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with Store(database_url, pool_size=2) as opened:
        yield opened


def _run(
    store: Store,
    run_id: str,
    entries: list[NewEntry],
    status: RunStatus,
    agent_session_id: str | None,
) -> str:
    """A settled run of session ``chat`` that appended ``entries`` under the leaf; the new leaf."""
    store.admit_run(run_id, "chat", {**CLAUDE, "prompt": run_id}, max_attempts=1, deadline=None)
    claim = store.claim_run(run_id, "worker-a", 3600.0)
    assert claim is not None
    leaf = store.session_leaf("chat")
    new_leaf = store.append_transcript(claim, "chat", entries, leaf)
    assert new_leaf is not None
    store.settle_run(claim, status, agent_session_id=agent_session_id)
    return new_leaf


def test_a_turn_cancelled_before_the_agent_spoke_does_not_end_the_conversation(
    store: Store,
) -> None:
    """A chat user sends a message and presses Ctrl-C at once: the run is cancelled after
    its input was recorded but before Claude Code said its session id (it never reached
    the model). The next message must still resume turn 1's conversation, not start a
    new one in which the model has never seen turn 1."""
    _run(
        store,
        "t1",
        [
            NewEntry("t1/input", "user", {"prompt": "write the notes"}),
            NewEntry("t1/turn-0/assistant", "assistant", {"messages": [{"text": "done"}]}),
        ],
        RunStatus.COMPLETED,
        "sess-1",
    )
    cancelled_input = _run(
        store,
        "t2",
        [NewEntry("t2/input", "user", {"prompt": "add a summary"})],
        RunStatus.ABORTED,
        None,
    )
    store.admit_run("t3", "chat", {**CLAUDE, "prompt": "t3"}, max_attempts=1, deadline=None)
    follow_up = store.get_run("t3")
    assert follow_up is not None

    resumed = FollowUp.of(store, follow_up, cancelled_input)

    assert resumed is not None
    assert resumed.agent_session_id == "sess-1"
    argv = AgentSpec.from_payload("claude-code").follow_up_command(session_id="sess-1").argv
    assert "--resume" in argv


def test_a_run_that_spoke_without_an_id_is_not_skipped(store: Store) -> None:
    """A run of the same agent that wrote more than its input (the model answered) but
    reported no id: resuming an earlier conversation would hide that answer from the
    model, so the follow-up starts afresh as before."""
    _run(
        store,
        "t1",
        [
            NewEntry("t1/input", "user", {"prompt": "write the notes"}),
            NewEntry("t1/turn-0/assistant", "assistant", {"messages": [{"text": "done"}]}),
        ],
        RunStatus.COMPLETED,
        "sess-1",
    )
    answered = _run(
        store,
        "t2",
        [
            NewEntry("t2/input", "user", {"prompt": "add a summary"}),
            NewEntry("t2/turn-0/assistant", "assistant", {"messages": [{"text": "ok"}]}),
        ],
        RunStatus.FAILED,
        None,
    )
    store.admit_run("t3", "chat", {**CLAUDE, "prompt": "t3"}, max_attempts=1, deadline=None)
    follow_up = store.get_run("t3")
    assert follow_up is not None

    resumed = FollowUp.of(store, follow_up, answered)

    assert resumed is not None
    assert resumed.agent_session_id is None
