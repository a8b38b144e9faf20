"""The real CLIs through the shipped presets, in a session and across a takeover.

A fleet (real workers, bwrap jails, the egress proxy) runs Claude Code and Codex from
npm against the scripted model servers on loopback, exactly as a user submits them:
the preset's name (Codex: with its ``base_url`` option) and, in the env, the model's
key and endpoint plus the PATH where the CLIs are installed. No test here passes a
flag of its own: the presets must let the model's tool call run in the jail.

Three runs of one session: the model's request for each later turn carries the earlier
turns, because the worker resumed the CLI's own conversation (``claude -p --resume
ID``, ``codex exec resume ID``), whose files it kept in the session's workspace (its
HOME). An owner SIGKILLed while the agent runs its tool is taken over: the agent lives
on, and the model is asked nothing twice.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import turnkeeper
from tests.driver.fleet import Fleet
from tests.integration.agent_runs import PROMPT
from tests.integration.model_server import (
    TOOL_COMMAND,
    AnthropicScript,
    ModelServer,
    ResponsesScript,
)
from tests.integration.npm_cache import AgentClis, cache_root
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus

pytestmark = pytest.mark.slow

PROMPTS = [PROMPT, "now say it once more", "and a last time"]
SLOW_TOOL = f"sleep 3 && {TOOL_COMMAND}"
"""A tool call that lasts long enough for its owner to be killed in the middle of it."""


def claude_code(clis: AgentClis, server: ModelServer) -> tuple[Any, dict[str, str]]:
    """The ``claude-code`` preset as shipped, and a user's env: the model's key and
    endpoint, and where the CLI is installed."""
    env = {
        "PATH": clis.path_env(),
        "ANTHROPIC_BASE_URL": server.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-scripted",
    }
    return "claude-code", env


def codex(clis: AgentClis, server: ModelServer) -> tuple[Any, dict[str, str]]:
    """The ``codex`` preset with its endpoint option, and a user's env."""
    agent = {"preset": "codex", "base_url": f"{server.base_url}/v1"}
    return agent, {"PATH": clis.path_env(), "OPENAI_API_KEY": "sk-scripted"}


def _fleet(settings: Settings, tmp_path: Path, server: ModelServer) -> Fleet:
    python = [sys.prefix, sys.base_prefix, str(Path(turnkeeper.__file__).parent)]
    return Fleet.create(
        settings,
        tmp_path / "logs",
        sandbox_ro_binds=",".join(dict.fromkeys([*python, str(cache_root())])),
        sandbox_egress=f"127.0.0.1:{server.port}",
    )


@pytest.fixture
def claude_fleet(
    settings: Settings, tmp_path: Path, anthropic_server: ModelServer
) -> Iterator[Fleet]:
    fleet = _fleet(settings, tmp_path, anthropic_server)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def codex_fleet(
    settings: Settings, tmp_path: Path, responses_server: ModelServer
) -> Iterator[Fleet]:
    fleet = _fleet(settings, tmp_path, responses_server)
    try:
        yield fleet
    finally:
        fleet.stop()


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]


def _tool_results(fleet: Fleet, run_id: str) -> list[Any]:
    """The tool results in a run's log: what the jailed tool printed, as the model got it."""
    return [c["content"] for _, c in fleet.log_of(run_id) if c["type"] == "TOOL_CALL_RESULT"]


def _converse(fleet: Fleet, agent: dict[str, Any], env: dict[str, str]) -> list[str]:
    """Three runs of one session, one after another; their run ids."""
    fleet.start_worker()
    ids = []
    for prompt in PROMPTS:
        run = fleet.client.submit(agent, prompt, session_id="chat", env=env)
        done = fleet.wait_settled(run.run_id, timeout=240)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        ids.append(run.run_id)
    return ids


def test_claude_code_follow_ups_carry_the_earlier_turns(
    claude_fleet: Fleet, agent_clis: AgentClis, anthropic_server: ModelServer
) -> None:
    agent, env = claude_code(agent_clis, anthropic_server)
    runs = _converse(claude_fleet, agent, env)
    requests = anthropic_server.scripted_requests()
    # Turn 1 asks twice (the tool call, then its result); each follow-up once.
    assert len(requests) == 4
    said = [
        [t for m in r.body["messages"] if m["role"] == "user" for t in _texts(m["content"])]
        for r in requests
    ]
    asked = [[t for t in texts if t in PROMPTS] for texts in said]
    assert asked == [PROMPTS[:1], PROMPTS[:1], PROMPTS[:2], PROMPTS[:3]]
    results = [str(r.body["messages"]).count("tool_result") for r in requests]
    assert results == [0, 1, 1, 1], "the tool's answer of turn 1 stays in the conversation"
    assert "hello-from-tool" in str(requests[1].body["messages"]), "the tool ran in the jail"
    assert _tool_results(claude_fleet, runs[0]) == ["hello-from-tool"]
    # The agent's own conversation id, recorded at each settle, resumed by the next run.
    ids = [claude_fleet.client.require(run_id).agent_session_id for run_id in runs]
    assert all(ids), ids


def test_codex_follow_ups_carry_the_earlier_turns(
    codex_fleet: Fleet, agent_clis: AgentClis, responses_server: ModelServer
) -> None:
    agent, env = codex(agent_clis, responses_server)
    runs = _converse(codex_fleet, agent, env)
    requests = responses_server.scripted_requests()
    assert len(requests) == 4
    said = [
        [
            t
            for item in r.body["input"]
            if isinstance(item, dict) and item.get("role") == "user"
            for t in ([c.get("text", "") for c in item.get("content", []) if isinstance(c, dict)])
        ]
        for r in requests
    ]
    asked = [[t for t in texts if t.strip() in PROMPTS] for texts in said]
    assert [[t.strip() for t in a] for a in asked] == [
        PROMPTS[:1],
        PROMPTS[:1],
        PROMPTS[:2],
        PROMPTS[:3],
    ]
    outputs = [i for i in requests[1].body["input"] if i.get("type") == "function_call_output"]
    assert [o["output"].endswith("hello-from-tool\n") for o in outputs] == [True]
    assert _tool_results(codex_fleet, runs[0]) == ["hello-from-tool\n"]
    threads = [codex_fleet.client.require(run_id).agent_session_id for run_id in runs]
    assert threads[0] is not None
    assert threads == [threads[0]] * 3, "one thread, resumed twice"


def test_a_worker_killed_in_the_middle_of_turn_2_asks_the_model_nothing_twice(
    claude_fleet: Fleet, agent_clis: AgentClis, anthropic_server: ModelServer
) -> None:
    fleet = claude_fleet
    agent, env = claude_code(agent_clis, anthropic_server)
    fleet.start_pair()
    first = fleet.client.submit(agent, PROMPTS[0], session_id="chat", env=env)
    assert fleet.wait_settled(first.run_id, timeout=240).status is RunStatus.COMPLETED
    anthropic_server.pace = 0.25  # turn 2 streams slowly enough to be cut in the middle
    second = fleet.client.submit(agent, PROMPTS[1], session_id="chat", env=env)
    while not any(
        chunk["type"] == "TEXT_MESSAGE_CONTENT" for _, chunk in fleet.log_of(second.run_id)
    ):
        assert not fleet.client.require(second.run_id).status.is_terminal
        time.sleep(0.02)
    fleet.signal_worker_of(fleet.client.require(second.run_id), signal.SIGKILL)
    done = fleet.wait_settled(second.run_id, timeout=240)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (2, 2)
    log = fleet.log_of(second.run_id)
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    chunks = [chunk for _, chunk in log]
    kinds = [c["type"] for c in chunks]
    assert (kinds[0], kinds[-1], kinds.count("RUN_STARTED"), kinds.count("RUN_FINISHED")) == (
        "RUN_STARTED",
        "RUN_FINISHED",
        1,
        1,
    )
    starts = [c["messageId"] for c in chunks if c["type"] == "TEXT_MESSAGE_START"]
    assert len(starts) == len(set(starts)), "no message twice"
    text = "".join(c["delta"] for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "The command printed hello-from-tool. All done."
    # The agent lived on through the takeover: turn 2 asked the model once.
    requests = anthropic_server.scripted_requests()
    assert len(requests) == 3
    said = [
        [t for m in r.body["messages"] if m["role"] == "user" for t in _texts(m["content"])]
        for r in requests
    ]
    assert [[t for t in texts if t in PROMPTS] for texts in said][-1] == PROMPTS[:2]


def test_a_claude_code_branch_from_turn_1_sends_no_turn_2(
    claude_fleet: Fleet, agent_clis: AgentClis, anthropic_server: ModelServer
) -> None:
    agent, env = claude_code(agent_clis, anthropic_server)
    fleet = claude_fleet
    runs = _converse(fleet, agent, env)
    end_of_1 = [e.entry_id for e in fleet.client.transcript("chat") if e.run_id == runs[0]][-1]
    retry = fleet.client.submit(
        agent, "say it differently", session_id="chat", env=env, from_entry=end_of_1
    )
    done = fleet.wait_settled(retry.run_id, timeout=240)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    requests = anthropic_server.scripted_requests()
    assert len(requests) == 5
    last = [
        t
        for m in requests[-1].body["messages"]
        if m["role"] == "user"
        for t in _texts(m["content"])
    ]
    assert [t for t in last if t in [*PROMPTS, "say it differently"]] == [
        PROMPTS[0],
        "say it differently",
    ]
    assert str(requests[-1].body["messages"]).count("tool_result") == 1, "turn 1's tool call"
    # Each follow-up forked: every run's own id names its conversation as it ended.
    ids = [fleet.client.require(r).agent_session_id for r in [*runs, retry.run_id]]
    assert len(set(ids)) == 4, ids


@pytest.mark.parametrize("cli", ["claude-code", "codex"])
def test_an_owner_killed_during_the_tool_call_is_taken_over_without_asking_again(
    settings: Settings, tmp_path: Path, agent_clis: AgentClis, cli: str
) -> None:
    script = AnthropicScript(SLOW_TOOL) if cli == "claude-code" else ResponsesScript(SLOW_TOOL)
    with ModelServer(script) as server:
        fleet = _fleet(settings, tmp_path, server)
        try:
            agent, env = (claude_code if cli == "claude-code" else codex)(agent_clis, server)
            fleet.start_pair()
            run = fleet.client.submit(agent, PROMPT, env=env)
            while not any(c["type"] == "TOOL_CALL_END" for _, c in fleet.log_of(run.run_id)):
                assert not fleet.client.require(run.run_id).status.is_terminal, fleet.dump_logs()
                time.sleep(0.02)
            # The model asked for the tool; the tool is sleeping in the jail.
            assert len(server.scripted_requests()) == 1
            fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
            done = fleet.wait_settled(run.run_id, timeout=240)
            assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
            assert (done.epoch, done.attempt_count) == (2, 2)
            log = fleet.log_of(run.run_id)
        finally:
            fleet.stop()
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    kinds = [c["type"] for _, c in log]
    assert kinds.count("TOOL_CALL_START") == kinds.count("TOOL_CALL_RESULT") == 1
    assert (kinds[0], kinds[-1], kinds.count("RUN_FINISHED")) == ("RUN_STARTED", "RUN_FINISHED", 1)
    results = [c["content"] for _, c in log if c["type"] == "TOOL_CALL_RESULT"]
    assert results == (["hello-from-tool"] if cli == "claude-code" else ["hello-from-tool\n"])
    text = "".join(c["delta"] for _, c in log if c["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "I will run a command to check.The command printed hello-from-tool. All done."
    # One request for the tool call, one carrying its result: the agent lived on.
    assert len(server.scripted_requests()) == 2
