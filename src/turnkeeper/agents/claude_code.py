"""Claude Code ``--output-format stream-json`` (with or without partial messages).

Line types and what they become:

- ``system``/``init``: CUSTOM ``turnkeeper.session`` ``{agent, sessionId, model}``;
  other ``system`` subtypes (``status``...) give nothing; an unknown subtype is RAW.
- ``stream_event`` (only with ``--include-partial-messages``): the raw Messages
  API stream. Text deltas become TEXT_MESSAGE_START/CONTENT/END (started at the
  first non-empty delta), thinking deltas REASONING_MESSAGE_*, a tool_use block
  TOOL_CALL_START, its ``input_json_delta`` TOOL_CALL_ARGS and its block stop
  TOOL_CALL_END.
- ``assistant``: the full message, one content block per line. A block that was
  already streamed is skipped (the deltas are the content; text is never emitted
  twice); a block that was not streamed is emitted whole.
- ``user``: each ``tool_result`` block becomes TOOL_CALL_RESULT (content text;
  ``metadata.isError`` when the tool failed); other user content gives nothing.
- ``result``: CUSTOM ``turnkeeper.usage`` ``{agent, usage, numTurns,
  durationMs, totalCostUsd}``; with ``is_error`` also ``turnkeeper.agent_error``
  (fatal) and :attr:`failure` is set.

Ids: one AG-UI message id per Claude API message (its first text block uses it,
its tool calls name it as ``parentMessageId``); a later text block of the same
API message gets a fresh id. Tool calls get ``<run>-t<n>``; Claude's ``toolu_``
id is kept in ``metadata.agentId`` and used to pair results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnkeeper.agents.translator import (
    SESSION,
    USAGE,
    BaseTranslator,
    _Unusable,
    camel_usage,
    custom_chunk,
    json_text,
    raw_chunk,
    reasoning_message,
    require,
    text_message,
    tool_call_args,
    tool_call_end,
    tool_call_result,
    tool_call_start,
)
from turnkeeper.chunks import Chunk

_QUIET_SYSTEM_SUBTYPES = frozenset(
    {"status", "compact_boundary", "hook_started", "hook_response", "api_retry"}
)


@dataclass
class _Block:
    kind: str  # "text" | "thinking" | "tool_use" | "other"
    ident: str | None = None  # our message id or tool call id, once opened


@dataclass
class _Streamed:
    """What the partial stream of one API message already delivered."""

    texts: int = 0
    thinkings: int = 0
    tool_ids: set[str] = field(default_factory=set)
    # how many full-message text/thinking blocks were matched against the stream
    seen_texts: int = 0
    seen_thinkings: int = 0


class ClaudeCodeTranslator(BaseTranslator):
    format = "claude-code"

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self._api_messages: dict[str, str] = {}  # Claude message id -> our message id
        self._texted: set[str] = set()  # API messages whose own id a text block used
        self._tool_ids: dict[str, str] = {}  # Claude tool_use id -> our tool call id
        self._streamed: dict[str, _Streamed] = {}
        self._current: str | None = None  # API message being streamed
        self._blocks: dict[int, _Block] = {}

    # --- dispatch ---

    def translate(self, event: dict[str, Any]) -> list[Chunk]:
        kind = event.get("type")
        if kind == "system":
            return self._system(event)
        if kind == "stream_event":
            return self._stream_event(require(event["event"], dict), event)
        if kind == "assistant":
            return self._assistant(require(event["message"], dict))
        if kind == "user":
            return self._user(require(event["message"], dict))
        if kind == "result":
            return self._result(event)
        raise _Unusable

    def finish(self) -> list[Chunk]:
        return self._close_blocks()

    # --- line types ---

    def _system(self, event: dict[str, Any]) -> list[Chunk]:
        subtype = event.get("subtype")
        if subtype == "init":
            self._session_id = require(event.get("session_id"), str)
            value = {"agent": self.format, "sessionId": self._session_id}
            if isinstance(event.get("model"), str):
                value["model"] = event["model"]
            return [custom_chunk(SESSION, value)]
        if subtype in _QUIET_SYSTEM_SUBTYPES:
            return []
        raise _Unusable

    def _stream_event(  # noqa: PLR0911 - one branch per Messages API stream event
        self, inner: dict[str, Any], line: dict[str, Any]
    ) -> list[Chunk]:
        kind = inner.get("type")
        if kind == "message_start":
            out = self._close_blocks()
            api_id = require(require(inner["message"], dict)["id"], str)
            self._current = api_id
            self._streamed.setdefault(api_id, _Streamed())
            self._message_id(api_id)
            return out
        if kind in ("message_delta", "ping"):
            return []
        if kind == "message_stop":
            out = self._close_blocks()
            self._current = None
            return out
        if self._current is None:
            raise _Unusable
        if kind == "content_block_start":
            return self._block_start(
                require(inner["index"], int), require(inner["content_block"], dict)
            )
        if kind == "content_block_delta":
            return self._block_delta(require(inner["index"], int), require(inner["delta"], dict))
        if kind == "content_block_stop":
            block = self._blocks.pop(require(inner["index"], int), None)
            return self._close_block(block) if block else []
        return [raw_chunk(line, self.format)]

    def _block_start(self, index: int, content: dict[str, Any]) -> list[Chunk]:
        assert self._current is not None  # noqa: S101 - checked by the caller
        streamed = self._streamed[self._current]
        kind = content.get("type")
        if kind == "text":
            streamed.texts += 1
            self._blocks[index] = _Block("text")
            return self._block_delta(index, {"type": "text_delta", "text": content.get("text")})
        if kind == "thinking":
            streamed.thinkings += 1
            self._blocks[index] = _Block("thinking")
            return []
        if kind == "tool_use":
            agent_id = require(content["id"], str)
            name = require(content["name"], str)
            streamed.tool_ids.add(agent_id)
            call = self._tool_call_id(agent_id)
            self._blocks[index] = _Block("tool_use", call)
            parent = self._api_messages[self._current]
            return [tool_call_start(call, name, parent=parent, agent_id=agent_id)]
        self._blocks[index] = _Block("other")
        return []

    def _block_delta(self, index: int, delta: dict[str, Any]) -> list[Chunk]:
        block = self._blocks.get(index)
        if block is None:
            raise _Unusable
        kind = delta.get("type")
        if block.kind == "text" and kind == "text_delta":
            return self._open_and_append(block, "TEXT_MESSAGE", delta.get("text"))
        if block.kind == "thinking" and kind == "thinking_delta":
            return self._open_and_append(block, "REASONING_MESSAGE", delta.get("thinking"))
        if block.kind == "tool_use" and kind == "input_json_delta":
            piece = require(delta["partial_json"], str)
            return [tool_call_args(block.ident or "", piece)] if piece else []
        if kind == "signature_delta" or block.kind == "other":
            return []
        raise _Unusable

    def _open_and_append(self, block: _Block, family: str, piece: Any) -> list[Chunk]:
        if piece is None or piece == "":
            return []
        piece = require(piece, str)
        out: list[Chunk] = []
        if block.ident is None:
            assert self._current is not None  # noqa: S101 - a block belongs to a message
            if family == "TEXT_MESSAGE":
                block.ident = self._text_id(self._current)
                out.append(
                    {
                        "type": "TEXT_MESSAGE_START",
                        "messageId": block.ident,
                        "role": "assistant",
                        "metadata": {"agentId": self._current},
                    }
                )
            else:
                block.ident = self.new_message_id()
                out.append(
                    {
                        "type": "REASONING_MESSAGE_START",
                        "messageId": block.ident,
                        "role": "reasoning",
                    }
                )
        out.append({"type": f"{family}_CONTENT", "messageId": block.ident, "delta": piece})
        return out

    def _close_block(self, block: _Block) -> list[Chunk]:
        if block.ident is None:
            return []
        if block.kind == "text":
            return [{"type": "TEXT_MESSAGE_END", "messageId": block.ident}]
        if block.kind == "thinking":
            return [{"type": "REASONING_MESSAGE_END", "messageId": block.ident}]
        if block.kind == "tool_use":
            return [tool_call_end(block.ident)]
        return []

    def _close_blocks(self) -> list[Chunk]:
        out: list[Chunk] = []
        for index in sorted(self._blocks):
            out.extend(self._close_block(self._blocks[index]))
        self._blocks.clear()
        return out

    def _assistant(self, message: dict[str, Any]) -> list[Chunk]:
        api_id = require(message["id"], str)
        streamed = self._streamed.get(api_id)
        self._message_id(api_id)  # minted first, as message_start does when streaming
        out: list[Chunk] = []
        for item in require(message["content"], list):
            block = require(item, dict)
            kind = block.get("type")
            if kind == "text":
                if streamed is not None and streamed.seen_texts < streamed.texts:
                    streamed.seen_texts += 1
                    continue
                text = require(block["text"], str)
                if text:
                    out.extend(text_message(self._text_id(api_id), text, agent_id=api_id))
            elif kind == "thinking":
                if streamed is not None and streamed.seen_thinkings < streamed.thinkings:
                    streamed.seen_thinkings += 1
                    continue
                thought = require(block.get("thinking", ""), str)
                if thought:
                    out.extend(reasoning_message(self.new_message_id(), thought))
            elif kind == "tool_use":
                agent_id = require(block["id"], str)
                if streamed is not None and agent_id in streamed.tool_ids:
                    continue
                name = require(block["name"], str)
                call = self._tool_call_id(agent_id)
                parent = self._message_id(api_id)
                out.append(tool_call_start(call, name, parent=parent, agent_id=agent_id))
                arguments = block.get("input")
                if arguments not in (None, {}):
                    out.append(tool_call_args(call, json_text(arguments)))
                out.append(tool_call_end(call))
            elif kind != "redacted_thinking":
                out.append(raw_chunk(block, self.format))
        return out

    def _user(self, message: dict[str, Any]) -> list[Chunk]:
        content = message.get("content")
        if not isinstance(content, list):
            return []
        out: list[Chunk] = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            agent_id = block.get("tool_use_id")
            call = self._tool_ids.get(agent_id) if isinstance(agent_id, str) else None
            if call is None:
                out.append(raw_chunk(block, self.format))
                continue
            metadata: dict[str, Any] = {"agentId": agent_id}
            if block.get("is_error") is True:
                metadata["isError"] = True
            result = _result_text(block.get("content"))
            out.append(tool_call_result(self.new_message_id(), call, result, metadata=metadata))
        return out

    def _result(self, event: dict[str, Any]) -> list[Chunk]:
        out = self._close_blocks()
        value: dict[str, Any] = {"agent": self.format, "usage": camel_usage(event.get("usage"))}
        for source, target in (
            ("num_turns", "numTurns"),
            ("duration_ms", "durationMs"),
            ("total_cost_usd", "totalCostUsd"),
            ("subtype", "subtype"),
        ):
            if isinstance(event.get(source), int | float | str) and not isinstance(
                event.get(source), bool
            ):
                value[target] = event[source]
        out.append(custom_chunk(USAGE, value))
        if event.get("is_error") is True:
            message = event.get("result")
            if not isinstance(message, str) or not message:
                errors = event.get("errors")
                message = "; ".join(map(str, errors)) if isinstance(errors, list) and errors else ""
            out.append(self.report_failure(message or f"claude-code: {event.get('subtype')}"))
        return out

    # --- ids ---

    def _message_id(self, api_id: str) -> str:
        if api_id not in self._api_messages:
            self._api_messages[api_id] = self.new_message_id()
        return self._api_messages[api_id]

    def _text_id(self, api_id: str) -> str:
        """The API message's own id for its first text block, a fresh one after."""
        own = self._message_id(api_id)
        if api_id in self._texted:
            return self.new_message_id()
        self._texted.add(api_id)
        return own

    def _tool_call_id(self, agent_id: str) -> str:
        if agent_id not in self._tool_ids:
            self._tool_ids[agent_id] = self.new_tool_call_id()
        return self._tool_ids[agent_id]


def _result_text(content: Any) -> str:
    """A tool_result's content as text: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    return "" if content is None else json_text(content)
