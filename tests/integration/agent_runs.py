"""Running the real CLIs against the scripted servers, and the chunks their output must give.

The environments are complete and explicit (nothing inherited from the test process),
the same way a sandbox hands an agent only what its spec names. The expected chunk
lists are written out literally: the only values taken from the run are the ones the
CLI makes up itself (its session id, its wall-clock duration, its price table's cost).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson

from tests.integration.model_server import ModelServer, Request
from tests.integration.npm_cache import AgentClis
from turnkeeper.agents.formats import translator_for
from turnkeeper.chunks import Chunk, validate_chunk

PROMPT = "check the greeting"
CODEX_MODEL = "gpt-test"
CODEX_KEY_VARIABLE = "SCRIPTED_API_KEY"
RUN_TIMEOUT = 240  # a hang guard below pytest's own 300 s, not an expectation
CLAUDE_FLAGS = [
    "--output-format",
    "stream-json",
    "--verbose",
    "--allowedTools",
    "Bash",
    "--permission-mode",
    "bypassPermissions",
]
CODEX_FLAGS = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]


def claude_env(clis: AgentClis, server: ModelServer, home: Path) -> dict[str, str]:
    env = {
        "PATH": clis.path_env(),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": server.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-scripted",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # Claude Code refuses bypassPermissions as root otherwise
    return env


def codex_env(clis: AgentClis, server: ModelServer, home: Path) -> dict[str, str]:
    """Codex's environment; writes the config pointing it at ``server`` to ``home/.codex``.

    ``~/.codex`` is where Codex looks without ``CODEX_HOME``, so a sandbox whose HOME is
    its workspace needs no extra variable for it.
    """
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{CODEX_MODEL}"\n'
        'model_provider = "scripted"\n\n'
        "[model_providers.scripted]\n"
        'name = "scripted"\n'
        f'base_url = "{server.base_url}/v1"\n'
        'wire_api = "responses"\n'
        f'env_key = "{CODEX_KEY_VARIABLE}"\n'
    )
    return {
        "PATH": clis.path_env(),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        CODEX_KEY_VARIABLE: "sk-scripted",
    }


def run_cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def translate(fmt: str, lines: list[bytes], run_id: str) -> list[Chunk]:
    """Every chunk a fresh translator makes of ``lines``, finish included, all validated."""
    translator = translator_for(fmt, run_id)
    chunks = [chunk for line in lines for chunk in translator.feed(line)]
    chunks += translator.finish()
    for chunk in chunks:
        validate_chunk(chunk)
    assert translator.failure is None
    return chunks


def json_lines(stdout: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stdout.splitlines() if line.strip()]


def only(events: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The one event whose fields equal ``match``."""
    found = [e for e in events if all(e.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


# --- what the scripted servers must have seen -------------------------------------------


def anthropic_tool_results(request: Request) -> list[Any]:
    """The tool_result blocks of a Messages request's last user message."""
    messages = request.body["messages"]
    return [
        block
        for block in messages[-1]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def responses_tool_outputs(request: Request) -> list[Any]:
    return [item for item in request.body["input"] if item.get("type") == "function_call_output"]


# --- the expected chunks ----------------------------------------------------------------


def _text(message_id: str, agent_id: str, deltas: list[str]) -> list[Chunk]:
    start: Chunk = {
        "type": "TEXT_MESSAGE_START",
        "messageId": message_id,
        "role": "assistant",
        "metadata": {"agentId": agent_id},
    }
    contents: list[Chunk] = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": d} for d in deltas
    ]
    return [start, *contents, {"type": "TEXT_MESSAGE_END", "messageId": message_id}]


def claude_chunks(
    run_id: str, *, session_id: str, model: str, result: dict[str, Any], partial: bool
) -> list[Chunk]:
    """What the scripted conversation must translate to; ``result`` is the CLI's result line."""
    r = run_id
    if partial:
        opening = ["I ", "will ", "run ", "a ", "command ", "to ", "check."]
        closing = ["The ", "command ", "printed ", "hello-from-tool. ", "All ", "done."]
        args = [
            '{"command": ',
            '"echo hello-',
            'from-tool", ',
            '"description',
            '": "Print a ',
            'greeting"}',
        ]
    else:
        opening = ["I will run a command to check."]
        closing = ["The command printed hello-from-tool. All done."]
        args = ['{"command": "echo hello-from-tool", "description": "Print a greeting"}']
    return [
        {
            "type": "CUSTOM",
            "name": "turnkeeper.session",
            "value": {"agent": "claude-code", "sessionId": session_id, "model": model},
        },
        *_text(f"{r}-m0", "msg_scripted_opening", opening),
        {
            "type": "TOOL_CALL_START",
            "toolCallId": f"{r}-t0",
            "toolCallName": "Bash",
            "parentMessageId": f"{r}-m0",
            "metadata": {"agentId": "toolu_01"},
        },
        *({"type": "TOOL_CALL_ARGS", "toolCallId": f"{r}-t0", "delta": a} for a in args),
        {"type": "TOOL_CALL_END", "toolCallId": f"{r}-t0"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"{r}-m1",
            "toolCallId": f"{r}-t0",
            "content": "hello-from-tool",
            "role": "tool",
            "metadata": {"agentId": "toolu_01"},
        },
        *_text(f"{r}-m2", "msg_scripted_closing", closing),
        {
            "type": "CUSTOM",
            "name": "turnkeeper.usage",
            "value": {
                "agent": "claude-code",
                "usage": {
                    "inputTokens": 24,
                    "cacheCreationInputTokens": 0,
                    "cacheReadInputTokens": 0,
                    "outputTokens": 42,
                },
                "numTurns": 2,
                "durationMs": result["duration_ms"],
                "totalCostUsd": result["total_cost_usd"],
                "subtype": "success",
            },
        },
    ]


def codex_chunks(run_id: str, *, thread_id: str) -> list[Chunk]:
    r = run_id
    return [
        {
            "type": "CUSTOM",
            "name": "turnkeeper.session",
            "value": {"agent": "codex", "sessionId": thread_id},
        },
        {
            "type": "CUSTOM",
            "name": "turnkeeper.agent_error",
            "value": {
                "agent": "codex",
                "message": f"Model metadata for `{CODEX_MODEL}` not found. Defaulting to "
                "fallback metadata; this can degrade performance and cause issues.",
                "fatal": False,
            },
        },
        *_text(f"{r}-m0", "item_1", ["I will run a command to check."]),
        {
            "type": "TOOL_CALL_START",
            "toolCallId": f"{r}-t0",
            "toolCallName": "command_execution",
            "metadata": {"agentId": "item_2"},
        },
        {
            "type": "TOOL_CALL_ARGS",
            "toolCallId": f"{r}-t0",
            "delta": '{"command": "/bin/bash -lc \'echo hello-from-tool\'"}',
        },
        {"type": "TOOL_CALL_END", "toolCallId": f"{r}-t0"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"{r}-m1",
            "toolCallId": f"{r}-t0",
            "content": "hello-from-tool\n",
            "role": "tool",
            "metadata": {"status": "completed", "exitCode": 0, "agentId": "item_2"},
        },
        *_text(f"{r}-m2", "item_3", ["The command printed hello-from-tool. All done."]),
        {
            "type": "CUSTOM",
            "name": "turnkeeper.usage",
            "value": {
                "agent": "codex",
                "usage": {
                    "inputTokens": 40,
                    "cachedInputTokens": 0,
                    "cacheWriteInputTokens": 0,
                    "outputTokens": 20,
                    "reasoningOutputTokens": 0,
                },
            },
        },
    ]
