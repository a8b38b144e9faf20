"""The agui pass-through and the plain-text format."""

from __future__ import annotations

import orjson

from turnkeeper.agents.formats import translator_for


def test_agui_lines_pass_through_lifecycle_is_the_drivers_and_invalid_is_raw() -> None:
    translator = translator_for("agui", "r")
    lines = [
        {"type": "RUN_STARTED", "threadId": "t", "runId": "x"},
        {"type": "TEXT_MESSAGE_START", "messageId": "a1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "hi", "timestamp": 5},
        {"type": "TEXT_MESSAGE_END", "messageId": "a1"},
        {"type": "TEXT_MESSAGE_CONTENT", "delta": "no message id"},
        {"type": "NOT_AN_EVENT"},
        {"type": "RUN_ERROR", "message": "model overloaded"},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "x"},
    ]
    chunks = [c for line in lines for c in translator.feed(orjson.dumps(line) + b"\n")]
    assert chunks == [
        lines[1],
        lines[2],
        lines[3],
        {"type": "RAW", "event": lines[4], "source": "agui"},
        {"type": "RAW", "event": lines[5], "source": "agui"},
        {
            "type": "CUSTOM",
            "name": "turnkeeper.agent_error",
            "value": {"agent": "agui", "message": "model overloaded", "fatal": True},
        },
    ]
    assert translator.failure == "model overloaded"
    assert translator.finish() == []


def test_text_lines_are_one_message_byte_for_byte() -> None:
    translator = translator_for("text", "r")
    output = [
        b"hello world\n",
        b"\n",
        b'  {"not": "parsed"}\r\n',
        b"caf\xc3\xa9\n",
        b"\xff\xfe\n",
        b"tail",
    ]
    chunks = [c for line in output for c in translator.feed(line)]
    chunks += translator.finish()
    assert chunks == [
        {"type": "TEXT_MESSAGE_START", "messageId": "r-m0", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m0", "delta": "hello world\n"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m0", "delta": "\n"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m0", "delta": '  {"not": "parsed"}\r\n'},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m0", "delta": "café\n"},
        {
            "type": "CUSTOM",
            "name": "turnkeeper.unparsed",
            "value": {"reason": "invalid-utf8", "text": "\ufffd\ufffd\n", "base64": "//4K"},
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "r-m0", "delta": "tail"},
        {"type": "TEXT_MESSAGE_END", "messageId": "r-m0"},
    ]
    text = "".join(c["delta"] for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT")
    assert text.encode() == b'hello world\n\n  {"not": "parsed"}\r\ncaf\xc3\xa9\ntail'


def test_text_with_no_output_makes_no_message() -> None:
    translator = translator_for("text", "r")
    assert translator.feed(b"") == []
    assert translator.finish() == []
