"""EventGate: what of a run log an AG-UI client is sent, event by event."""

from __future__ import annotations

from typing import Any

from turnkeeper.chunks import Chunk
from turnkeeper.web.agui import REFUSED_EVENT, EventGate

STARTED = {"type": "RUN_STARTED", "threadId": "s", "runId": "r"}
FINISHED = {"type": "RUN_FINISHED", "threadId": "s", "runId": "r"}


def _gate(*chunks: Chunk) -> tuple[EventGate, list[list[Chunk]]]:
    gate = EventGate("r", "s")
    return gate, [gate.admit(chunk) for chunk in chunks]


def refused(chunk: Chunk, reason: str) -> Chunk:
    return {"type": "CUSTOM", "name": REFUSED_EVENT, "value": {"reason": reason, "event": chunk}}


def text(kind: str, ident: str, **extra: Any) -> Chunk:
    return {"type": f"TEXT_MESSAGE_{kind}", "messageId": ident, **extra}


def test_a_well_formed_log_goes_through_as_it_is() -> None:
    log = [
        STARTED,
        text("START", "m", role="assistant"),
        text("CONTENT", "m", delta="hi"),
        text("END", "m"),
        {"type": "TOOL_CALL_START", "toolCallId": "t", "toolCallName": "Bash"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t", "delta": "{}"},
        {"type": "TOOL_CALL_END", "toolCallId": "t"},
        {"type": "TOOL_CALL_RESULT", "messageId": "x", "toolCallId": "t", "content": "ok"},
        {"type": "CUSTOM", "name": "turnkeeper.interrupted", "value": {"journal": 0}},
        {"type": "RAW", "event": {"any": "thing"}, "source": "claude-code"},
        FINISHED,
    ]
    gate, sent = _gate(*log)
    assert sent == [[chunk] for chunk in log]
    assert gate.ended
    assert gate.admit(text("START", "late", role="assistant")) == []
    assert gate.failed("gone", "expired") == []


def test_what_the_verifier_refuses_becomes_a_custom_event_holding_it() -> None:
    content = text("CONTENT", "m", delta="x")
    twice = text("START", "m", role="assistant")
    stray_end = {"type": "TOOL_CALL_END", "toolCallId": "nope"}
    subagent = {"type": "SUBAGENT_STARTED", "subagentRunId": "a", "name": "helper"}
    piece = {"type": "TEXT_MESSAGE_CHUNK", "messageId": "c", "delta": "y"}
    unknown = {"type": "NOT_AN_EVENT"}
    _, sent = _gate(STARTED, content, twice, twice, stray_end, subagent, piece, unknown, STARTED)
    assert sent[1:] == [
        [refused(content, "messageId 'm' is not open")],
        [twice],
        [refused(twice, "messageId 'm' is already open")],
        [refused(stray_end, "toolCallId 'nope' is not open")],
        [refused(subagent, "subagent lifecycles are not passed on")],
        [
            refused(
                piece, "TEXT_MESSAGE_CHUNK is not passed on: send its START, CONTENT and END events"
            )
        ],
        [refused(unknown, sent[7][0]["value"]["reason"])],
        [refused(STARTED, "the run has already started")],
    ]
    assert sent[7][0]["value"]["reason"].startswith("not a valid AG-UI event")


def test_the_end_closes_what_is_open_and_an_error_closes_nothing() -> None:
    opened = [
        STARTED,
        {"type": "STEP_STARTED", "stepName": "plan"},
        text("START", "m1", role="assistant"),
        text("START", "m2", role="assistant"),
        {"type": "TOOL_CALL_START", "toolCallId": "t", "toolCallName": "Bash"},
        {"type": "REASONING_START", "messageId": "r"},
        {"type": "REASONING_MESSAGE_START", "messageId": "rm", "role": "reasoning"},
    ]
    _, sent = _gate(*opened, FINISHED)
    assert sent[-1] == [
        {"type": "STEP_FINISHED", "stepName": "plan"},
        {"type": "REASONING_END", "messageId": "r"},
        {"type": "REASONING_MESSAGE_END", "messageId": "rm"},
        {"type": "TOOL_CALL_END", "toolCallId": "t"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m2"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        FINISHED,
    ]
    error = {"type": "RUN_ERROR", "message": "lost", "code": "lost"}
    _, sent = _gate(*opened, error)
    assert sent[-1] == [error]


def test_a_log_without_its_start_gets_one_and_a_failure_ends_the_stream() -> None:
    gate, sent = _gate(text("START", "m", role="assistant"))
    assert sent == [[STARTED, text("START", "m", role="assistant")]]
    assert gate.failed("the log expired", "expired") == [
        {"type": "RUN_ERROR", "message": "the log expired", "code": "expired"}
    ]
    assert EventGate("r", "s").failed("revoked", "revoked-key") == [
        STARTED,
        {"type": "RUN_ERROR", "message": "revoked", "code": "revoked-key"},
    ]
    error = {"type": "RUN_ERROR", "message": "setup failed", "code": "env-from"}
    assert _gate(error)[1] == [[error]]  # a run that failed before it started


def test_subagent_attribution_is_taken_off() -> None:
    tagged = text("START", "m", role="assistant", subagentRunId="a")
    snapshot = {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [{"id": "u", "role": "user", "content": "hi", "subagentRunId": None}],
    }
    _, sent = _gate(STARTED, tagged, snapshot)
    assert sent[1:] == [
        [text("START", "m", role="assistant")],
        [{"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "u", "role": "user", "content": "hi"}]}],
    ]
