"""Codex exec --json: the real CLI's sample and the item types it did not show."""

from __future__ import annotations

import orjson

from tests.agents.helpers import fixture, translate_all
from turnkeeper.agents.formats import translator_for

R = "run-1"


def test_exec_json_sample_translates_to_the_full_expected_chunks() -> None:
    chunks = translate_all("codex", fixture("codex/exec-json.ndjson"))
    assert chunks == [
        {
            "type": "CUSTOM",
            "name": "turnkeeper.session",
            "value": {"agent": "codex", "sessionId": "01a22aa7-307f-7f81-8b3e-d25e8c305080"},
        },
        {
            "type": "CUSTOM",
            "name": "turnkeeper.agent_error",
            "value": {
                "agent": "codex",
                "message": "Model metadata for `gpt-test` not found. Defaulting to fallback "
                "metadata; this can degrade performance and cause issues.",
                "fatal": False,
            },
        },
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": f"{R}-m0",
            "role": "assistant",
            "metadata": {"agentId": "item_1"},
        },
        {
            "type": "TEXT_MESSAGE_CONTENT",
            "messageId": f"{R}-m0",
            "delta": "I will run a command to check.",
        },
        {"type": "TEXT_MESSAGE_END", "messageId": f"{R}-m0"},
        {
            "type": "TOOL_CALL_START",
            "toolCallId": f"{R}-t0",
            "toolCallName": "command_execution",
            "metadata": {"agentId": "item_2"},
        },
        {
            "type": "TOOL_CALL_ARGS",
            "toolCallId": f"{R}-t0",
            "delta": '{"command": "/bin/bash -lc \'echo hello-from-tool\'"}',
        },
        {"type": "TOOL_CALL_END", "toolCallId": f"{R}-t0"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"{R}-m1",
            "toolCallId": f"{R}-t0",
            "content": "hello-from-tool\n",
            "role": "tool",
            "metadata": {"status": "completed", "exitCode": 0, "agentId": "item_2"},
        },
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": f"{R}-m2",
            "role": "assistant",
            "metadata": {"agentId": "item_3"},
        },
        {
            "type": "TEXT_MESSAGE_CONTENT",
            "messageId": f"{R}-m2",
            "delta": "The command printed hello-from-tool. All done.",
        },
        {"type": "TEXT_MESSAGE_END", "messageId": f"{R}-m2"},
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


def test_other_items_and_a_failed_turn() -> None:
    events = [
        {"type": "item.completed", "item": {"id": "i0", "type": "reasoning", "text": "hmm"}},
        {
            "type": "item.completed",
            "item": {
                "id": "i1",
                "type": "file_change",
                "changes": [{"path": "a.py", "kind": "add"}, {"path": "b.py", "kind": "update"}],
                "status": "completed",
            },
        },
        {
            "type": "item.started",
            "item": {
                "id": "i2",
                "type": "mcp_tool_call",
                "server": "docs",
                "tool": "search",
                "arguments": {"q": "x"},
                "status": "in_progress",
            },
        },
        {
            "type": "item.updated",
            "item": {
                "id": "i2",
                "type": "mcp_tool_call",
                "server": "docs",
                "tool": "search",
                "status": "in_progress",
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": "i2",
                "type": "mcp_tool_call",
                "server": "docs",
                "tool": "search",
                "error": {"message": "denied"},
                "status": "failed",
            },
        },
        {
            "type": "item.updated",
            "item": {"id": "i3", "type": "todo_list", "items": [{"text": "a", "completed": True}]},
        },
        {"type": "item.completed", "item": {"id": "i4", "type": "hologram"}},
        {"type": "turn.failed", "error": {"message": "stream disconnected"}},
    ]
    translator = translator_for("codex", "r")
    chunks = [c for e in events for c in translator.feed(orjson.dumps(e))]
    assert chunks == [
        {"type": "REASONING_MESSAGE_START", "messageId": "r-m0", "role": "reasoning"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r-m0", "delta": "hmm"},
        {"type": "REASONING_MESSAGE_END", "messageId": "r-m0"},
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "r-t0",
            "toolCallName": "file_change",
            "metadata": {"agentId": "i1"},
        },
        {
            "type": "TOOL_CALL_ARGS",
            "toolCallId": "r-t0",
            "delta": '{"changes": [{"path": "a.py", "kind": "add"}, '
            '{"path": "b.py", "kind": "update"}]}',
        },
        {"type": "TOOL_CALL_END", "toolCallId": "r-t0"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "r-m1",
            "toolCallId": "r-t0",
            "content": "add a.py\nupdate b.py",
            "role": "tool",
            "metadata": {"status": "completed", "agentId": "i1"},
        },
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "r-t1",
            "toolCallName": "mcp__docs__search",
            "metadata": {"agentId": "i2"},
        },
        {"type": "TOOL_CALL_ARGS", "toolCallId": "r-t1", "delta": '{"arguments": {"q": "x"}}'},
        {"type": "TOOL_CALL_END", "toolCallId": "r-t1"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "r-m2",
            "toolCallId": "r-t1",
            "content": "denied",
            "role": "tool",
            "metadata": {"status": "failed", "isError": True, "agentId": "i2"},
        },
        {
            "type": "CUSTOM",
            "name": "turnkeeper.plan",
            "value": {"agent": "codex", "items": [{"text": "a", "completed": True}]},
        },
        {"type": "RAW", "event": events[6], "source": "codex"},
        {
            "type": "CUSTOM",
            "name": "turnkeeper.agent_error",
            "value": {"agent": "codex", "message": "stream disconnected", "fatal": True},
        },
    ]
    assert translator.failure == "stream disconnected"
    assert translator.finish() == []


def test_a_stream_retry_reported_as_an_error_event_does_not_fail_the_turn() -> None:
    """Codex 0.169 reports each retry of its model stream as a top-level ``error``
    event and goes on: the run fails only on ``turn.failed`` (or its exit code)."""
    retry = "Reconnecting... 2/5 (stream disconnected before completion)"
    events = [
        {"type": "thread.started", "thread_id": "th-1"},
        {"type": "turn.started"},
        {"type": "error", "message": retry},
        {"type": "item.completed", "item": {"id": "i1", "type": "agent_message", "text": "ok"}},
        {"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}},
    ]
    translator = translator_for("codex", "r")
    chunks = [c for e in events for c in translator.feed(orjson.dumps(e))]
    assert chunks[1] == {
        "type": "CUSTOM",
        "name": "turnkeeper.agent_error",
        "value": {"agent": "codex", "message": retry, "fatal": False},
    }
    assert [c["type"] for c in chunks[2:5]] == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
    ]
    assert translator.failure is None
