"""Properties every translator keeps: determinism, never raising, valid AG-UI chunks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agents.helpers import fixture, translate_all
from turnkeeper.agents.formats import formats, translator_for
from turnkeeper.agents.translator import TurnEvent, TurnTracker
from turnkeeper.chunks import encode_chunk, validate_chunk
from turnkeeper.errors import UnknownAgentError

SAMPLES = [
    ("claude-code", "claude-code/stream-json.ndjson"),
    ("claude-code", "claude-code/stream-json-partial.ndjson"),
    ("codex", "codex/exec-json.ndjson"),
    ("agui", "claude-code/stream-json.ndjson"),
    ("text", "codex/exec-json.ndjson"),
]
FORMATS = ["agui", "claude-code", "codex", "text"]


def test_the_registry_knows_the_four_formats_and_refuses_others() -> None:
    assert formats() == FORMATS
    with pytest.raises(UnknownAgentError) as caught:
        translator_for("klingon", "r")
    assert caught.value.reason == "unknown-format"


@pytest.mark.parametrize(("fmt", "name"), SAMPLES)
def test_a_replay_through_a_fresh_translator_gives_identical_chunks(fmt: str, name: str) -> None:
    data = fixture(name)
    first = translate_all(fmt, data)
    again = translate_all(fmt, data)
    assert [encode_chunk(c) for c in first] == [encode_chunk(c) for c in again]
    assert first  # every sample yields something, so the comparison means something


@pytest.mark.parametrize(("fmt", "name"), SAMPLES)
def test_ids_are_scoped_to_the_run(fmt: str, name: str) -> None:
    chunks = translate_all(fmt, fixture(name), run_id="other-run")
    ids = {c[k] for c in chunks for k in ("messageId", "toolCallId") if k in c}
    if fmt == "agui":
        assert ids == set()  # the Claude lines are not AG-UI events: all RAW
    else:
        assert ids
        assert all(i.startswith("other-run-") for i in ids)


def test_a_journal_cut_mid_line_replays_to_a_prefix_of_the_whole() -> None:
    data = fixture("claude-code/stream-json-partial.ndjson")
    whole = translate_all("claude-code", data)
    lines = data.splitlines(keepends=True)
    for n in range(len(lines) + 1):
        translator = translator_for("claude-code", "run-1")
        part = [c for line in lines[:n] for c in translator.feed(line)]
        assert part == whole[: len(part)]


_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_KNOWN_TYPES = st.sampled_from(
    [
        "system",
        "stream_event",
        "assistant",
        "user",
        "result",
        "thread.started",
        "turn.completed",
        "turn.failed",
        "error",
        "item.started",
        "item.completed",
        "TEXT_MESSAGE_START",
        "TOOL_CALL_RESULT",
        "RUN_ERROR",
        "CUSTOM",
        "RAW",
    ]
)
_SHAPED = st.builds(
    lambda t, rest: {**rest, "type": t},
    _KNOWN_TYPES,
    st.dictionaries(
        st.sampled_from(
            [
                "message",
                "event",
                "item",
                "subtype",
                "content",
                "index",
                "delta",
                "id",
                "text",
                "messageId",
                "name",
                "value",
                "error",
                "usage",
            ]
        ),
        _JSONISH,
        max_size=5,
    ),
)


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(FORMATS), lines=st.lists(st.binary(max_size=200), max_size=6))
def test_any_bytes_never_raise_and_give_valid_chunks(fmt: str, lines: list[bytes]) -> None:
    translator = translator_for(fmt, "r")
    for line in lines:
        for chunk in translator.feed(line):
            validate_chunk(chunk)
            encode_chunk(chunk)
    for chunk in translator.finish():
        validate_chunk(chunk)


@settings(max_examples=400, deadline=None)
@given(fmt=st.sampled_from(FORMATS), events=st.lists(_SHAPED, max_size=8))
def test_json_of_known_types_and_any_fields_never_raises(fmt: str, events: list[dict]) -> None:
    import orjson  # noqa: PLC0415 - local to the property

    translator = translator_for(fmt, "r")
    for event in events:
        for chunk in translator.feed(orjson.dumps(event)):
            validate_chunk(chunk)
    for chunk in translator.finish():
        validate_chunk(chunk)


def test_turn_tracker_follows_the_claude_sample() -> None:
    tracker = TurnTracker()
    chunks = translate_all("claude-code", fixture("claude-code/stream-json.ndjson"))
    events = [(c["type"], e) for c in chunks if (e := tracker.observe(c)) is not None]
    assert events == [
        ("TOOL_CALL_END", TurnEvent.TOOL_REQUEST_RECORDED),
        ("TOOL_CALL_RESULT", TurnEvent.TURN_COMPLETE),
    ]
    assert tracker.turns_completed == 1


def test_turn_tracker_waits_for_every_parallel_call() -> None:
    tracker = TurnTracker()
    seen = [
        tracker.observe({"type": "TOOL_CALL_END", "toolCallId": "a"}),
        tracker.observe({"type": "TOOL_CALL_END", "toolCallId": "b"}),
        tracker.observe({"type": "TOOL_CALL_RESULT", "toolCallId": "b", "messageId": "m"}),
        tracker.observe({"type": "TOOL_CALL_RESULT", "toolCallId": "zzz", "messageId": "m"}),
        tracker.observe({"type": "TOOL_CALL_RESULT", "toolCallId": "a", "messageId": "m"}),
    ]
    assert seen == [TurnEvent.TOOL_REQUEST_RECORDED, None, None, None, TurnEvent.TURN_COMPLETE]
