"""Codex ``codex exec --json`` events.

- ``thread.started``: CUSTOM ``turnkeeper.session`` ``{agent, sessionId}``
  (the thread id, which ``codex exec resume`` takes).
- ``turn.started``: nothing. ``turn.completed``: CUSTOM ``turnkeeper.usage``.
  ``turn.failed``: ``turnkeeper.agent_error`` (fatal; :attr:`failure` is set).
  The top-level ``error`` event: ``turnkeeper.agent_error`` with ``fatal: false``:
  Codex reports its stream's retries with it ("Reconnecting... 2/5") and goes on; a
  turn it gives up on ends in ``turn.failed`` or a failed exit.
- ``item.*`` by item type:
  - ``agent_message`` (completed): a whole TEXT_MESSAGE_START/CONTENT/END;
  - ``reasoning`` (completed): a whole REASONING_MESSAGE_*;
  - ``command_execution``, ``file_change``, ``mcp_tool_call``, ``web_search``:
    a tool call. Started: TOOL_CALL_START, TOOL_CALL_ARGS, TOOL_CALL_END (the
    arguments are known at once); completed: TOOL_CALL_RESULT (preceded by the
    start/args/end when the item was never seen started). Updates give nothing.
  - ``todo_list``: CUSTOM ``turnkeeper.plan`` ``{items}`` at every step;
  - ``error``: ``turnkeeper.agent_error`` with ``fatal: false`` (Codex goes on).
  Any other item type is RAW.

Codex streams no text deltas in this mode, so each message arrives whole.
The item id (``item_3``) is kept in ``metadata.agentId``.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.agents.translator import (
    AGENT_ERROR,
    PLAN,
    SESSION,
    USAGE,
    BaseTranslator,
    _Unusable,
    camel_usage,
    custom_chunk,
    json_text,
    reasoning_message,
    require,
    text_message,
    tool_call_args,
    tool_call_end,
    tool_call_result,
    tool_call_start,
)
from turnkeeper.chunks import Chunk

_TOOL_ITEMS = frozenset({"command_execution", "file_change", "mcp_tool_call", "web_search"})


class CodexTranslator(BaseTranslator):
    format = "codex"

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self._calls: dict[str, str] = {}  # item id -> tool call id
        self._answered: set[str] = set()

    def translate(self, event: dict[str, Any]) -> list[Chunk]:
        kind = event.get("type")
        if kind == "thread.started":
            self._session_id = require(event["thread_id"], str)
            return [custom_chunk(SESSION, {"agent": self.format, "sessionId": self._session_id})]
        if kind == "turn.started":
            return []
        if kind == "turn.completed":
            return [
                custom_chunk(
                    USAGE, {"agent": self.format, "usage": camel_usage(event.get("usage"))}
                )
            ]
        if kind == "turn.failed":
            error = require(event["error"], dict)
            return [self.report_failure(require(error["message"], str))]
        if kind == "error":
            message = require(event["message"], str)
            return [
                custom_chunk(
                    AGENT_ERROR, {"agent": self.format, "message": message, "fatal": False}
                )
            ]
        if kind in ("item.started", "item.updated", "item.completed"):
            return self._item(kind.removeprefix("item."), require(event["item"], dict))
        raise _Unusable

    def _item(  # noqa: PLR0911 - one branch per Codex item type
        self, phase: str, item: dict[str, Any]
    ) -> list[Chunk]:
        item_id = require(item["id"], str)
        kind = item.get("type")
        if kind == "agent_message":
            if phase != "completed":
                return []
            text = require(item["text"], str)
            return text_message(self.new_message_id(), text, agent_id=item_id) if text else []
        if kind == "reasoning":
            if phase != "completed":
                return []
            text = require(item.get("text", ""), str)
            return reasoning_message(self.new_message_id(), text) if text else []
        if kind == "todo_list":
            return [
                custom_chunk(PLAN, {"agent": self.format, "items": require(item["items"], list)})
            ]
        if kind == "error":
            if phase != "completed":
                return []
            message = require(item["message"], str)
            return [
                custom_chunk(
                    AGENT_ERROR, {"agent": self.format, "message": message, "fatal": False}
                )
            ]
        if kind in _TOOL_ITEMS:
            name, arguments = _call(kind, item)
            out: list[Chunk] = []
            if item_id not in self._calls:
                call = self._calls[item_id] = self.new_tool_call_id()
                out.append(tool_call_start(call, name, agent_id=item_id))
                out.append(tool_call_args(call, json_text(arguments)))
                out.append(tool_call_end(call))
            if phase == "completed" and item_id not in self._answered:
                self._answered.add(item_id)
                content, metadata = _outcome(kind, item)
                metadata["agentId"] = item_id
                out.append(
                    tool_call_result(
                        self.new_message_id(), self._calls[item_id], content, metadata=metadata
                    )
                )
            return out
        raise _Unusable


def _call(kind: str, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool's name and arguments, as the model would have spelled them."""
    if kind == "command_execution":
        return kind, {"command": require(item["command"], str)}
    if kind == "file_change":
        return kind, {"changes": require(item["changes"], list)}
    if kind == "web_search":
        return kind, {"query": require(item["query"], str)}
    tool = require(item["tool"], str)
    server = require(item["server"], str)
    return f"mcp__{server}__{tool}", {"arguments": item.get("arguments")}


def _outcome(kind: str, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool's result as text, with its status (and exit code) as metadata."""
    metadata: dict[str, Any] = {}
    if isinstance(item.get("status"), str):
        metadata["status"] = item["status"]
    if kind == "command_execution":
        if isinstance(item.get("exit_code"), int):
            metadata["exitCode"] = item["exit_code"]
        return require(item.get("aggregated_output", ""), str), metadata
    if kind == "file_change":
        lines = [
            f"{change.get('kind', '?')} {change.get('path', '?')}"
            for change in require(item["changes"], list)
            if isinstance(change, dict)
        ]
        return "\n".join(lines), metadata
    if kind == "mcp_tool_call":
        error = item.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            metadata["isError"] = True
            return error["message"], metadata
        result = item.get("result")
        if isinstance(result, dict) and isinstance(result.get("content"), list):
            texts = [
                part["text"]
                for part in result["content"]
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            ]
            return "\n".join(texts), metadata
        return ("" if result is None else json_text(result)), metadata
    return "", metadata
