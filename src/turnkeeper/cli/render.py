"""Chunks as a conversation in the terminal: assistant text, tool calls, their results."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.text import Text

from turnkeeper.chunks import Chunk

_RESULT_PREVIEW = 400


class ConversationRenderer:
    """Streams text deltas as they come; tool calls and results on lines of their own."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._in_text = False
        self._tool_args: dict[str, str] = {}
        self._tool_names: dict[str, str] = {}

    def render(self, chunk: Chunk) -> None:
        kind = chunk.get("type")
        if kind == "TEXT_MESSAGE_CONTENT":
            self._text(str(chunk.get("delta", "")))
        elif kind == "TEXT_MESSAGE_END":
            self._end_text()
        elif kind == "TOOL_CALL_START":
            self._end_text()
            self._tool_names[chunk["toolCallId"]] = str(chunk.get("toolCallName", "tool"))
            self._tool_args[chunk["toolCallId"]] = ""
        elif kind == "TOOL_CALL_ARGS":
            call = chunk.get("toolCallId", "")
            self._tool_args[call] = self._tool_args.get(call, "") + str(chunk.get("delta", ""))
        elif kind == "TOOL_CALL_END":
            self._tool_call(chunk["toolCallId"])
        elif kind == "TOOL_CALL_RESULT":
            self._tool_result(str(chunk.get("content", "")))
        elif kind == "RUN_STARTED":
            self._line(Text(f"● run {chunk.get('runId')}", style="bold"))
        elif kind == "RUN_FINISHED":
            self._line(Text("● finished", style="bold green"))
        elif kind == "RUN_ERROR":
            self._line(Text(f"● error: {chunk.get('message')}", style="bold red"))
        elif kind == "CUSTOM" and chunk.get("name") == "turnkeeper.interrupted":
            self._line(Text("● interrupted: the agent continues in a new process", style="yellow"))
        elif kind == "CUSTOM" and chunk.get("name") == "turnkeeper.fresh_workspace":
            value = chunk.get("value")
            message = value.get("message") if isinstance(value, dict) else None
            self._line(Text(f"● {message or 'a fresh workspace'}", style="yellow"))

    def _text(self, delta: str) -> None:
        if not self._in_text:
            self.console.print()
            self._in_text = True
        self.console.print(delta, end="", markup=False, highlight=False, soft_wrap=True)

    def _end_text(self) -> None:
        if self._in_text:
            self.console.print()
            self._in_text = False

    def _tool_call(self, call_id: str) -> None:
        name = self._tool_names.get(call_id, "tool")
        args = _compact(self._tool_args.get(call_id, ""))
        self._line(Text.assemble(("⏺ ", "cyan"), (name, "bold cyan"), f"({args})"))

    def _tool_result(self, content: str) -> None:
        preview = content if len(content) <= _RESULT_PREVIEW else content[:_RESULT_PREVIEW] + "…"
        self._line(Text.assemble(("  ⎿ ", "dim"), (preview.rstrip(), "dim")))

    def _line(self, text: Text) -> None:
        self._end_text()
        self.console.print(text, soft_wrap=True)

    def close(self) -> None:
        self._end_text()


def _compact(args: str) -> str:
    try:
        value: Any = json.loads(args)
    except ValueError:
        return args
    if isinstance(value, dict):
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in value.items())
    return json.dumps(value)
