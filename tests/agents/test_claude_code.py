"""Claude Code stream-json: the real CLI's samples, partial messages, odd lines."""

from __future__ import annotations

import orjson

from tests.agents.helpers import fixture, translate_all
from turnkeeper.agents.formats import translator_for

R = "run-1"

SESSION_PLAIN = {
    "type": "CUSTOM",
    "name": "turnkeeper.session",
    "value": {
        "agent": "claude-code",
        "sessionId": "a08c376f-0d30-45dc-bce7-a38544ca874b",
        "model": "claude-opus-5-5",
    },
}
TOOL_CALL = [
    {
        "type": "TOOL_CALL_START",
        "toolCallId": f"{R}-t0",
        "toolCallName": "Bash",
        "parentMessageId": f"{R}-m0",
        "metadata": {"agentId": "toolu_01"},
    },
]
TOOL_RESULT = {
    "type": "TOOL_CALL_RESULT",
    "messageId": f"{R}-m1",
    "toolCallId": f"{R}-t0",
    "content": "hello-from-tool",
    "role": "tool",
    "metadata": {"agentId": "toolu_01"},
}


def _usage(duration_ms: int) -> dict[str, object]:
    return {
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
            "durationMs": duration_ms,
            "totalCostUsd": 0.000936,
            "subtype": "success",
        },
    }


def _text(message_id: str, agent_id: str, deltas: list[str]) -> list[dict[str, object]]:
    start = {
        "type": "TEXT_MESSAGE_START",
        "messageId": message_id,
        "role": "assistant",
        "metadata": {"agentId": agent_id},
    }
    contents = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": d} for d in deltas
    ]
    return [start, *contents, {"type": "TEXT_MESSAGE_END", "messageId": message_id}]


def test_stream_json_sample_translates_to_the_full_expected_chunks() -> None:
    chunks = translate_all("claude-code", fixture("claude-code/stream-json.ndjson"))
    assert chunks == [
        SESSION_PLAIN,
        *_text(f"{R}-m0", "msg_1796011867811", ["I will run a command to check."]),
        *TOOL_CALL,
        {
            "type": "TOOL_CALL_ARGS",
            "toolCallId": f"{R}-t0",
            "delta": '{"command": "echo hello-from-tool", "description": "Print a greeting"}',
        },
        {"type": "TOOL_CALL_END", "toolCallId": f"{R}-t0"},
        TOOL_RESULT,
        *_text(f"{R}-m2", "msg_1796011868419", ["The command printed hello-from-tool. All done."]),
        _usage(906),
    ]


def test_partial_messages_sample_streams_deltas_and_never_repeats_the_full_message() -> None:
    chunks = translate_all("claude-code", fixture("claude-code/stream-json-partial.ndjson"))
    session = {
        **SESSION_PLAIN,
        "value": {**SESSION_PLAIN["value"], "sessionId": "b9b2fdda-e96b-4544-8e07-0f22c4db0615"},  # type: ignore[dict-item]
    }
    args = [
        '{"command": ',
        '"echo hello-',
        'from-tool", ',
        '"description',
        '": "Print a ',
        'greeting"}',
    ]
    assert chunks == [
        session,
        *_text(
            f"{R}-m0",
            "msg_1796011872831",
            ["I ", "will ", "run ", "a ", "command ", "to ", "check."],
        ),
        *TOOL_CALL,
        *({"type": "TOOL_CALL_ARGS", "toolCallId": f"{R}-t0", "delta": a} for a in args),
        {"type": "TOOL_CALL_END", "toolCallId": f"{R}-t0"},
        TOOL_RESULT,
        *_text(
            f"{R}-m2",
            "msg_1796011873494",
            ["The ", "command ", "printed ", "hello-from-tool. ", "All ", "done."],
        ),
        _usage(928),
    ]
    # the concatenated arguments are the tool input the full message carried
    assert orjson.loads("".join(args)) == {
        "command": "echo hello-from-tool",
        "description": "Print a greeting",
    }


def _line(obj: object) -> bytes:
    return orjson.dumps(obj) + b"\n"


def _stream(event: dict[str, object]) -> bytes:
    return _line({"type": "stream_event", "event": event})


def test_a_stream_cut_mid_message_is_closed_by_finish() -> None:
    translator = translator_for("claude-code", "r")
    fed = [
        _stream({"type": "message_start", "message": {"id": "msg_a"}}),
        _stream({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        _stream(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "hi"},
            }
        ),
        _stream(
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_x", "name": "Read", "input": {}},
            }
        ),
    ]
    chunks = [c for line in fed for c in translator.feed(line)]
    assert chunks == [
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "r-m0",
            "role": "assistant",
            "metadata": {"agentId": "msg_a"},
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m0", "delta": "hi"},
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "r-t0",
            "toolCallName": "Read",
            "parentMessageId": "r-m0",
            "metadata": {"agentId": "toolu_x"},
        },
    ]
    assert translator.finish() == [
        {"type": "TEXT_MESSAGE_END", "messageId": "r-m0"},
        {"type": "TOOL_CALL_END", "toolCallId": "r-t0"},
    ]
    assert translator.finish() == []


def test_thinking_second_text_block_and_error_result() -> None:
    message = {
        "id": "msg_b",
        "content": [
            {"type": "thinking", "thinking": "let me see", "signature": "sig"},
            {"type": "text", "text": "first"},
            {"type": "tool_use", "id": "toolu_y", "name": "Bash", "input": {}},
            {"type": "text", "text": "second"},
        ],
    }
    data = b"".join(
        [
            _line({"type": "assistant", "message": message}),
            _line(
                {
                    "type": "user",
                    "message": {
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_y",
                                "content": [{"type": "text", "text": "boom"}, {"type": "image"}],
                                "is_error": True,
                            },
                            {"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "?"},
                        ]
                    },
                }
            ),
            _line(
                {"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 9}
            ),
        ]
    )
    translator = translator_for("claude-code", "r")
    chunks = [c for line in data.splitlines() for c in translator.feed(line)]
    assert chunks == [
        {"type": "REASONING_MESSAGE_START", "messageId": "r-m1", "role": "reasoning"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r-m1", "delta": "let me see"},
        {"type": "REASONING_MESSAGE_END", "messageId": "r-m1"},
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "r-m0",
            "role": "assistant",
            "metadata": {"agentId": "msg_b"},
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m0", "delta": "first"},
        {"type": "TEXT_MESSAGE_END", "messageId": "r-m0"},
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "r-t0",
            "toolCallName": "Bash",
            "parentMessageId": "r-m0",
            "metadata": {"agentId": "toolu_y"},
        },
        {"type": "TOOL_CALL_END", "toolCallId": "r-t0"},
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "r-m2",
            "role": "assistant",
            "metadata": {"agentId": "msg_b"},
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m2", "delta": "second"},
        {"type": "TEXT_MESSAGE_END", "messageId": "r-m2"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "r-m3",
            "toolCallId": "r-t0",
            "content": "boom\n[image]",
            "role": "tool",
            "metadata": {"agentId": "toolu_y", "isError": True},
        },
        {
            "type": "RAW",
            "event": {"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "?"},
            "source": "claude-code",
        },
        {
            "type": "CUSTOM",
            "name": "turnkeeper.usage",
            "value": {
                "agent": "claude-code",
                "usage": {},
                "numTurns": 9,
                "subtype": "error_max_turns",
            },
        },
        {
            "type": "CUSTOM",
            "name": "turnkeeper.agent_error",
            "value": {
                "agent": "claude-code",
                "message": "claude-code: error_max_turns",
                "fatal": True,
            },
        },
    ]
    assert translator.failure == "claude-code: error_max_turns"
    assert translator.session_id is None


def test_unknown_and_malformed_claude_lines_follow_the_rule() -> None:
    translator = translator_for("claude-code", "r")
    assert translator.feed(b'{"type": "rate_limit_event", "x": 1}\n') == [
        {"type": "RAW", "event": {"type": "rate_limit_event", "x": 1}, "source": "claude-code"}
    ]
    # a known type with a field of the wrong kind
    assert translator.feed(b'{"type": "assistant", "message": "oops"}') == [
        {"type": "RAW", "event": {"type": "assistant", "message": "oops"}, "source": "claude-code"}
    ]
    # a delta for a message that never started
    stray = {"type": "stream_event", "event": {"type": "content_block_stop", "index": 0}}
    assert translator.feed(_line(stray)) == [
        {"type": "RAW", "event": stray, "source": "claude-code"}
    ]
    assert translator.feed(b'{"type":"system","subtype":"status","status":"requesting"}') == []
    assert translator.feed(b"[1, 2]\n") == [
        {"type": "RAW", "event": [1, 2], "source": "claude-code"}
    ]
    assert translator.feed(b"Error: something broke\r\n") == [
        {
            "type": "CUSTOM",
            "name": "turnkeeper.unparsed",
            "value": {"reason": "not-json", "text": "Error: something broke"},
        }
    ]
    assert translator.feed(b'{"type": "assis\xff"}\n') == [
        {
            "type": "CUSTOM",
            "name": "turnkeeper.unparsed",
            "value": {
                "reason": "invalid-utf8",
                "text": '{"type": "assis\ufffd"}',
                "base64": "eyJ0eXBlIjogImFzc2lz/yJ9",
            },
        }
    ]
    assert translator.feed(b"   \n") == []
    assert translator.feed(b"") == []
