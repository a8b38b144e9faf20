"""The real CLIs in a session: each follow-up resumes the agent's own conversation.

A fleet (real workers, bwrap jails, the egress proxy) runs Claude Code and Codex from
npm against the scripted model servers on loopback. Three runs of one session: the
model's request for each later turn carries the earlier turns, because the worker
resumed the CLI's own conversation (``claude -p --resume ID``, ``codex exec resume
ID``), whose files it kept in the session's workspace (its HOME).
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
from tests.integration.agent_runs import (
    CLAUDE_FLAGS,
    CODEX_FLAGS,
    CODEX_KEY_VARIABLE,
    CODEX_MODEL,
    PROMPT,
    claude_env,
)
from tests.integration.model_server import ModelServer
from tests.integration.npm_cache import AgentClis, cache_root
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus

pytestmark = pytest.mark.slow

PROMPTS = [PROMPT, "now say it once more", "and a last time"]


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
    claude_fleet: Fleet, agent_clis: AgentClis, anthropic_server: ModelServer, tmp_path: Path
) -> None:
    env = {
        k: v for k, v in claude_env(agent_clis, anthropic_server, tmp_path).items() if k != "HOME"
    }
    agent = {"preset": "claude-code", "args": CLAUDE_FLAGS[3:]}
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
    # The agent's own conversation id, recorded at each settle, resumed by the next run.
    ids = [claude_fleet.client.require(run_id).agent_session_id for run_id in runs]
    assert all(ids), ids


def test_codex_follow_ups_carry_the_earlier_turns(
    codex_fleet: Fleet, agent_clis: AgentClis, responses_server: ModelServer
) -> None:
    provider = (
        f'{{name="scripted", base_url="{responses_server.base_url}/v1", '
        f'wire_api="responses", env_key="{CODEX_KEY_VARIABLE}"}}'
    )
    args = [
        *CODEX_FLAGS,
        "-c", f'model="{CODEX_MODEL}"',
        "-c", 'model_provider="scripted"',
        "-c", f"model_providers.scripted={provider}",
    ]  # fmt: skip
    env = {"PATH": agent_clis.path_env(), "LANG": "C.UTF-8", CODEX_KEY_VARIABLE: "sk-scripted"}
    runs = _converse(codex_fleet, {"preset": "codex", "args": args}, env)
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
    threads = [codex_fleet.client.require(run_id).agent_session_id for run_id in runs]
    assert threads[0] is not None
    assert threads == [threads[0]] * 3, "one thread, resumed twice"


def test_a_worker_killed_in_the_middle_of_turn_2_asks_the_model_nothing_twice(
    claude_fleet: Fleet, agent_clis: AgentClis, anthropic_server: ModelServer, tmp_path: Path
) -> None:
    fleet = claude_fleet
    env = {
        k: v for k, v in claude_env(agent_clis, anthropic_server, tmp_path).items() if k != "HOME"
    }
    agent = {"preset": "claude-code", "args": CLAUDE_FLAGS[3:]}
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
    claude_fleet: Fleet, agent_clis: AgentClis, anthropic_server: ModelServer, tmp_path: Path
) -> None:
    env = {
        k: v for k, v in claude_env(agent_clis, anthropic_server, tmp_path).items() if k != "HOME"
    }
    agent = {"preset": "claude-code", "args": CLAUDE_FLAGS[3:]}
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
