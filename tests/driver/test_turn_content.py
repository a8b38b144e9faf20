"""A turn's transcript text is bounded: a message of any size keeps its first
TRANSCRIPT_TEXT_LIMIT characters and says it was truncated."""

from __future__ import annotations

from turnkeeper.driver.record import TRANSCRIPT_TEXT_LIMIT, TurnContent
from turnkeeper.store.records import NewEntry


def test_a_message_past_the_limit_is_kept_truncated_and_a_short_one_whole() -> None:
    content = TurnContent()
    piece = "a" * (TRANSCRIPT_TEXT_LIMIT // 3 + 1)
    content.observe({"type": "TEXT_MESSAGE_START", "messageId": "m0", "role": "assistant"})
    for _ in range(5):
        content.observe({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m0", "delta": piece})
    content.observe({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "short"})
    content.observe({"type": "TOOL_CALL_START", "toolCallId": "t0", "toolCallName": "Bash"})
    content.observe({"type": "TOOL_CALL_ARGS", "toolCallId": "t0", "delta": '{"c": 1}'})
    assert content.entries("r", 0) == [
        NewEntry(
            "r/turn-0/assistant",
            "assistant",
            {
                "messages": [
                    {"id": "m0", "text": "a" * TRANSCRIPT_TEXT_LIMIT, "truncated": True},
                    {"id": "m1", "text": "short"},
                ],
                "toolCalls": [{"id": "t0", "name": "Bash", "args": '{"c": 1}'}],
            },
        )
    ]
