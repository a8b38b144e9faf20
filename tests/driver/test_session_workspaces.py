"""A session's workspace outlives its runs (docs/architecture.md, "Session workspaces").

Real workers run the scripted agent, whose chore wording says whether the workspace
was empty and whose tools really run there, so a log tells which workspace a run saw.
Every test compares whole logs with the oracle: the agent run directly, in one
directory per session, its runs one after another.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import Fleet, expected_log, follow_up_prompt
from turnkeeper.chunks import Chunk
from turnkeeper.driver import lifecycle
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.store.workspaces import Workspace

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.05, "seed": 5}
FIRST = "write the notes"
SECOND = "write the notes again"


def _settled(fleet: Fleet, run: Run) -> Run:
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    return done


def _chunks(fleet: Fleet, run_id: str) -> list[Chunk]:
    stored = fleet.log_of(run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    return [chunk for _, chunk in stored]


def _workspace(fleet: Fleet, session_id: str) -> Workspace:
    workspace = fleet.client.store.session_workspace(session_id)
    assert workspace is not None
    return workspace


def _root(fleet: Fleet, session_id: str) -> Path:
    sandbox = _workspace(fleet, session_id).sandbox
    assert sandbox is not None
    return Path(str(sandbox["root"]))


def _journal_sandboxes(run: Run) -> set[str]:
    assert run.sandbox_ref is not None
    return {journal["ref"]["id"] for journal in run.sandbox_ref["journals"]}


def _wait_journals_removed(root: Path, timeout: float = 60.0) -> None:
    """Until the workspace holds no journal: its owner removes them after it settled
    the run and closed its log (a hang guard)."""
    deadline = time.monotonic() + timeout
    while left := sorted(p.name for p in (root / "journal").iterdir()):
        assert time.monotonic() < deadline, f"journals kept after the run settled: {left}"
        time.sleep(0.05)


def _fresh(oracle: list[Chunk], reason: str) -> list[Chunk]:
    """A run that did not find its session's workspace: it says so after RUN_STARTED."""
    return [oracle[0], lifecycle.fresh_workspace(reason), *oracle[1:]]


@pytest.mark.slow
def test_every_run_of_a_session_works_in_its_workspace(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    first = _settled(fleet, fleet.client.submit(AGENT, FIRST, session_id="chat"))
    root = _root(fleet, "chat")
    assert (root / "workspace").is_dir(), "kept after its run settled"
    _wait_journals_removed(root)
    second = _settled(fleet, fleet.client.submit(AGENT, SECOND, session_id="chat"))
    one = fleet.client.submit(AGENT, FIRST)  # no session named: a sandbox of its own
    _settled(fleet, one)

    workdir = tmp_path / "oracle-chat"
    said = expected_log(first.run_id, "chat", AGENT, FIRST, workdir)
    assert _chunks(fleet, first.run_id) == said
    follow_up = follow_up_prompt(SECOND, [(FIRST, said)])
    assert _chunks(fleet, second.run_id) == expected_log(
        second.run_id, "chat", AGENT, follow_up, workdir
    )
    assert second.sandbox_ref is not None
    assert first.sandbox_ref is not None
    assert second.sandbox_ref["sandbox"] == first.sandbox_ref["sandbox"]
    assert _workspace(fleet, "chat").sandbox == first.sandbox_ref["sandbox"]
    assert _chunks(fleet, one.run_id) == expected_log(
        one.run_id, one.run_id, AGENT, FIRST, tmp_path / "oracle-one"
    )
    assert fleet.client.store.session_workspace(one.run_id) is None
    # A one-shot run's sandbox goes when it settles, the session's stays.
    assert sorted(p.name for p in fleet.settings.sandboxes_dir.iterdir()) == [root.name]


@pytest.mark.slow
def test_a_lost_workspace_is_survivable_and_the_run_says_so(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    first = _settled(fleet, fleet.client.submit(AGENT, FIRST, session_id="chat"))
    said = expected_log(first.run_id, "chat", AGENT, FIRST, tmp_path / "oracle-first")
    lost = _root(fleet, "chat")
    shutil.rmtree(lost)
    second = _settled(fleet, fleet.client.submit(AGENT, SECOND, session_id="chat"))
    # The workspace is gone; the conversation is not: the transcript holds it.
    follow_up = follow_up_prompt(SECOND, [(FIRST, said)])
    oracle = expected_log(second.run_id, "chat", AGENT, follow_up, tmp_path / "oracle-fresh")
    assert _chunks(fleet, second.run_id) == _fresh(oracle, "lost")
    assert _root(fleet, "chat") != lost
    assert (_root(fleet, "chat") / "workspace").is_dir()
    assert second.sandbox_ref is not None
    assert second.sandbox_ref.get("fresh_workspace") == "lost"


@pytest.mark.slow
def test_the_reaper_destroys_an_idle_sessions_workspace_after_the_ttl(
    settings: Any, tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", session_ttl=1.0, reap_interval=0.5)
    try:
        fleet.start_worker()
        fleet.start_beat()
        first = _settled(fleet, fleet.client.submit(AGENT, FIRST, session_id="chat"))
        root = _root(fleet, "chat")
        deadline = time.monotonic() + 60  # a hang guard
        while _workspace(fleet, "chat").sandbox is not None:
            assert time.monotonic() < deadline, fleet.dump_logs()
            time.sleep(0.1)
        assert _workspace(fleet, "chat") == Workspace(None, None, "expired")
        while root.exists():  # forgotten first, then destroyed
            assert time.monotonic() < deadline, fleet.dump_logs()
            time.sleep(0.1)
        assert next(e.entry_id for e in fleet.client.transcript("chat")) == f"{first.run_id}/input"
        second = _settled(fleet, fleet.client.submit(AGENT, SECOND, session_id="chat"))
        said = expected_log(first.run_id, "chat", AGENT, FIRST, tmp_path / "oracle-first")
        follow_up = follow_up_prompt(SECOND, [(FIRST, said)])
        oracle = expected_log(second.run_id, "chat", AGENT, follow_up, tmp_path / "oracle-fresh")
        assert _chunks(fleet, second.run_id) == _fresh(oracle, "expired")
    finally:
        fleet.stop()


@pytest.mark.slow
def test_a_follow_up_taken_over_mid_stream_goes_on_in_the_workspace(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.start_pair()
    first = _settled(fleet, fleet.client.submit(AGENT, FIRST, session_id="chat"))
    second = fleet.client.submit(AGENT, SECOND, session_id="chat")
    fleet.wait_chunks(second.run_id, 8)
    fleet.signal_worker_of(fleet.client.require(second.run_id), signal.SIGKILL)
    done = _settled(fleet, second)
    assert (done.epoch, done.attempt_count) == (2, 2)
    workdir = tmp_path / "oracle-chat"
    said = expected_log(first.run_id, "chat", AGENT, FIRST, workdir)
    follow_up = follow_up_prompt(SECOND, [(FIRST, said)])
    assert _chunks(fleet, second.run_id) == expected_log(
        second.run_id, "chat", AGENT, follow_up, workdir
    )
    # Every agent process of both runs ran in the one workspace (the journals name their
    # sandbox; a reap may already have dropped a settled run's own reference to it).
    assert _journal_sandboxes(done) == _journal_sandboxes(first) == {_root(fleet, "chat").name}


TEXT_AGENT_PROBE = "ls -A /workspace; cat {victim}/workspace/*; echo rc=$?"


@pytest.mark.slow
def test_another_sessions_agent_cannot_reach_the_workspace(fleet: Fleet) -> None:
    """Two sessions, two workspaces: the jail of one never shows the other's."""
    fleet.start_worker()
    _settled(fleet, fleet.client.submit(AGENT, FIRST, session_id="victim"))
    victim = _root(fleet, "victim")
    assert any((victim / "workspace").iterdir()), "the victim's agent wrote files"
    probe = {
        "command": ["sh", "-c", TEXT_AGENT_PROBE.format(victim=victim), "probe"],
        "format": "text",
    }
    run = fleet.client.submit(probe, "look around", session_id="attacker")
    done = fleet.wait_settled(run.run_id)
    text = "".join(c.get("delta", "") for c in _chunks(fleet, run.run_id))
    assert done.status is RunStatus.COMPLETED, (done.error, text)
    assert text.splitlines()[-1] == "rc=1", text
    assert _root(fleet, "attacker") != victim
