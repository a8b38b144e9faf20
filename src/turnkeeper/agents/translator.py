"""Translators: one agent's output lines in, AG-UI chunks out.

A translator is fed the journal of one run, line by line, in order, and turns
each line into zero or more chunks (AG-UI events in camelCase wire form, see
:mod:`turnkeeper.chunks`). Takeover replays a journal from byte 0 through a
*new* translator and aligns the result against the stored log, so a translator
must be a pure function of the bytes it was fed and the run id:

- ids are ``f"{run_id}-m{n}"`` (messages, tool results, reasoning) and
  ``f"{run_id}-t{n}"`` (tool calls), counters starting at 0, never a clock or a
  random source; the agent's own ids ride along in ``metadata.agentId``;
- no ``timestamp`` is set (the driver may add one; fingerprints ignore it);
- no ``RUN_STARTED`` / ``RUN_FINISHED`` / ``RUN_ERROR``: the driver owns the
  run's lifecycle. A fatal error the agent reports becomes a CUSTOM
  ``turnkeeper.agent_error`` chunk with ``fatal: true`` and is kept in
  :attr:`Translator.failure` for the driver to settle the run with.

What ``feed`` takes: one complete journal line, with or without its trailing
``b"\\n"`` (a ``b"\\r\\n"`` ending is accepted too). Structured formats strip
the ending; the ``text`` format keeps the line's bytes exactly, newline
included when it was given, so the driver should pass lines as the journal
holds them.

The rule for lines a translator cannot use (it never raises):

- a blank line (only whitespace) gives no chunk;
- bytes that are not UTF-8, or UTF-8 that is not JSON, give a CUSTOM chunk
  named ``turnkeeper.unparsed`` with ``value = {"reason": "invalid-utf8" |
  "not-json", "text": <the line, undecodable bytes replaced>}`` plus
  ``"base64"`` of the raw bytes when they are not UTF-8;
- valid JSON whose shape the format does not know (not an object, an unknown
  ``type``, a known ``type`` with fields of the wrong kind) gives a RAW chunk
  ``{"type": "RAW", "event": <the JSON value>, "source": <format>}``;
- a line longer than the line cap (``TURNKEEPER_MAX_LINE_BYTES``) reaches
  :meth:`Translator.feed_piece` in pieces instead, and can never be parsed: in a
  JSON-lines format each piece gives a CUSTOM ``turnkeeper.unparsed`` chunk with
  ``value = {"reason": "line-too-long", "piece": <index in the line, from 0>,
  "final": <whether the line ends with it>, "text": <the piece's text>}`` (plus
  ``"base64"`` of its bytes when they are not UTF-8). Pieces are cut at byte
  offsets; a character cut in two is carried to the next piece
  (:class:`PieceText`), so the texts of a UTF-8 line concatenate to the line.
"""

from __future__ import annotations

import base64
import enum
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from turnkeeper.chunks import Chunk

UNPARSED: Final = "turnkeeper.unparsed"
SESSION: Final = "turnkeeper.session"
USAGE: Final = "turnkeeper.usage"
AGENT_ERROR: Final = "turnkeeper.agent_error"
PLAN: Final = "turnkeeper.plan"


class Translator(Protocol):
    """What the driver calls: feed every line in order, then finish once."""

    format: str
    run_id: str

    @property
    def failure(self) -> str | None:
        """The agent's own report of a fatal error, once it made one."""

    @property
    def session_id(self) -> str | None:
        """The agent's conversation id (for a continuation), once it said it."""

    def feed(self, line: bytes) -> list[Chunk]:
        """Chunks for one complete journal line."""

    def feed_piece(self, piece: bytes, *, final: bool) -> list[Chunk]:
        """Chunks for one piece of a line over the cap, in order; ``final`` for the
        line's last piece (given with its newline, as the journal holds it)."""

    def finish(self) -> list[Chunk]:
        """Chunks that close whatever the agent left open (call once, at the end)."""


class _Unusable(Exception):  # noqa: N818 - an internal signal, not an error callers see
    """A known line type whose fields have the wrong shape: becomes RAW."""


class BaseTranslator:
    """Shared plumbing: line decoding, the unusable-line rule, id counters."""

    format: str = ""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._messages = 0
        self._tools = 0
        self._failure: str | None = None
        self._session_id: str | None = None
        self._piece_text = PieceText()

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def session_id(self) -> str | None:
        return self._session_id

    def new_message_id(self) -> str:
        ident = f"{self.run_id}-m{self._messages}"
        self._messages += 1
        return ident

    def new_tool_call_id(self) -> str:
        ident = f"{self.run_id}-t{self._tools}"
        self._tools += 1
        return ident

    def feed(self, line: bytes) -> list[Chunk]:
        body = strip_line_ending(line)
        if not body.strip():
            return []
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return [unparsed_chunk(body, "invalid-utf8")]
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return [unparsed_chunk(body, "not-json")]
        if not isinstance(value, dict):
            return [raw_chunk(value, self.format)]
        try:
            return self.translate(value)
        except (_Unusable, KeyError, TypeError, ValueError, AttributeError, IndexError):
            return [raw_chunk(value, self.format)]

    def translate(self, event: dict[str, Any]) -> list[Chunk]:
        """Chunks for one JSON object line; raise to have it kept as RAW."""
        raise NotImplementedError

    def feed_piece(self, piece: bytes, *, final: bool) -> list[Chunk]:
        """A JSON line over the cap cannot be parsed: each piece is kept as unparsed."""
        index, body, text = self._piece_text.take(
            strip_line_ending(piece) if final else piece, final=final
        )
        value: dict[str, Any] = {"reason": "line-too-long", "piece": index, "final": final}
        if text is None:
            value["text"] = body.decode("utf-8", errors="replace")
            value["base64"] = base64.b64encode(body).decode("ascii")
        else:
            value["text"] = text
        return [custom_chunk(UNPARSED, value)]

    def finish(self) -> list[Chunk]:
        return []

    def report_failure(self, message: str) -> Chunk:
        if self._failure is None:
            self._failure = message
        return custom_chunk(AGENT_ERROR, {"agent": self.format, "message": message, "fatal": True})


class PieceText:
    """The text of a cut line's pieces, never splitting a UTF-8 character.

    A piece that ends inside a character hands its last (at most 3) bytes on to the
    next piece of the line; what is handed on is a function of the bytes only, so a
    replay decodes exactly as the live read did.
    """

    def __init__(self) -> None:
        self._carry = b""
        self._index = 0

    def take(self, piece: bytes, *, final: bool) -> tuple[int, bytes, str | None]:
        """The piece's index in its line, its bytes (carry included) and their text,
        or None for the text when they are not UTF-8."""
        data = self._carry + piece if self._carry else bytes(piece)
        keep = len(data) if final else utf8_boundary(data)
        body, self._carry = data[:keep], data[keep:]
        index = self._index
        self._index = 0 if final else index + 1
        try:
            return index, body, body.decode("utf-8")
        except UnicodeDecodeError:
            return index, body, None


def utf8_boundary(data: bytes) -> int:
    """The length of ``data`` without a UTF-8 character its end cuts short (if any)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: a lead byte or ASCII
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            if byte & 0xC0 == 0xC0 and byte >> 3 != 0b11111 and back < need:
                return len(data) - back
            return len(data)
    return len(data)


# --- small pure helpers -----------------------------------------------------------


def strip_line_ending(line: bytes) -> bytes:
    if line.endswith(b"\n"):
        line = line[:-1]
    if line.endswith(b"\r"):
        line = line[:-1]
    return line


def unparsed_chunk(body: bytes, reason: str) -> Chunk:
    value: dict[str, Any] = {"reason": reason, "text": body.decode("utf-8", errors="replace")}
    if reason == "invalid-utf8":
        value["base64"] = base64.b64encode(body).decode("ascii")
    return custom_chunk(UNPARSED, value)


def raw_chunk(event: Any, source: str) -> Chunk:
    return {"type": "RAW", "event": event, "source": source}


def custom_chunk(name: str, value: Any) -> Chunk:
    return {"type": "CUSTOM", "name": name, "value": value}


def require(value: Any, kind: type | tuple[type, ...]) -> Any:
    """``value`` if it is of ``kind``, else the line is unusable (kept as RAW)."""
    if not isinstance(value, kind):
        raise _Unusable
    return value


def text_message(message_id: str, text: str, *, agent_id: str | None = None) -> list[Chunk]:
    """A whole assistant text message at once: start, one content, end."""
    start: Chunk = {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"}
    if agent_id is not None:
        start["metadata"] = {"agentId": agent_id}
    return [
        start,
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": text},
        {"type": "TEXT_MESSAGE_END", "messageId": message_id},
    ]


def reasoning_message(message_id: str, text: str) -> list[Chunk]:
    return [
        {"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": message_id, "delta": text},
        {"type": "REASONING_MESSAGE_END", "messageId": message_id},
    ]


def tool_call_start(
    tool_call_id: str, name: str, *, parent: str | None = None, agent_id: str | None = None
) -> Chunk:
    chunk: Chunk = {"type": "TOOL_CALL_START", "toolCallId": tool_call_id, "toolCallName": name}
    if parent is not None:
        chunk["parentMessageId"] = parent
    if agent_id is not None:
        chunk["metadata"] = {"agentId": agent_id}
    return chunk


def tool_call_args(tool_call_id: str, delta: str) -> Chunk:
    return {"type": "TOOL_CALL_ARGS", "toolCallId": tool_call_id, "delta": delta}


def tool_call_end(tool_call_id: str) -> Chunk:
    return {"type": "TOOL_CALL_END", "toolCallId": tool_call_id}


def tool_call_result(
    message_id: str, tool_call_id: str, content: str, *, metadata: dict[str, Any] | None = None
) -> Chunk:
    chunk: Chunk = {
        "type": "TOOL_CALL_RESULT",
        "messageId": message_id,
        "toolCallId": tool_call_id,
        "content": content,
        "role": "tool",
    }
    if metadata:
        chunk["metadata"] = metadata
    return chunk


def json_text(value: Any) -> str:
    """Arguments as text, the way the Anthropic stream spells them (``", "`` / ``": "``)."""
    import json  # noqa: PLC0415 - only json.dumps spells separators like the agents do

    return json.dumps(value, ensure_ascii=False)


def camel_usage(usage: Any) -> dict[str, int]:
    """The integer counters of an agent's usage object, keys in camelCase."""
    if not isinstance(usage, dict):
        return {}
    out: dict[str, int] = {}
    for key, value in usage.items():
        if isinstance(value, int) and not isinstance(value, bool):
            head, *rest = str(key).split("_")
            out[head + "".join(part[:1].upper() + part[1:] for part in rest)] = value
    return out


# --- turn boundaries for the driver ---------------------------------------------------


class Boundary(enum.Enum):
    """What a chunk means for the turn slot."""

    TOOL_REQUEST = "tool_request"  # a tool call's arguments are complete
    TOOL_RESULT = "tool_result"  # a tool call was answered


def boundary(chunk: Chunk) -> Boundary | None:
    kind = chunk.get("type")
    if kind == "TOOL_CALL_END":
        return Boundary.TOOL_REQUEST
    if kind == "TOOL_CALL_RESULT":
        return Boundary.TOOL_RESULT
    return None


class TurnEvent(enum.Enum):
    TOOL_REQUEST_RECORDED = "tool_request_recorded"  # first requested call of a turn
    TURN_COMPLETE = "turn_complete"  # every requested call of the turn is answered


@dataclass
class TurnTracker:
    """Folds chunks into turn events: pure, so a replay yields the same events.

    A turn with tool calls is "requested" at its first ``TOOL_CALL_END`` and
    "complete" when every call that ended has a ``TOOL_CALL_RESULT``.
    """

    pending: set[str] = field(default_factory=set)
    turns_completed: int = 0

    def observe(self, chunk: Chunk) -> TurnEvent | None:
        edge = boundary(chunk)
        call = chunk.get("toolCallId")
        if edge is Boundary.TOOL_REQUEST and isinstance(call, str):
            first = not self.pending
            self.pending.add(call)
            return TurnEvent.TOOL_REQUEST_RECORDED if first else None
        if edge is Boundary.TOOL_RESULT and call in self.pending:
            self.pending.discard(call)
            if not self.pending:
                self.turns_completed += 1
                return TurnEvent.TURN_COMPLETE
        return None
