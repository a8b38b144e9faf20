"""What the terminal shows: chunks as a conversation (assistant text, tool calls, their
results), and tables of runs and sessions.

Whatever an agent wrote reaches the terminal without its control characters
(``terminal_safe``): a terminal obeys an escape sequence in the agent's text, a tool's
name, arguments or output, or its error message as it would the operator's own, and
sequences exist that set the window title, clear the screen or write the clipboard
(OSC 52). ``--raw`` asks for the agent's characters as they are."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from turnkeeper.chunks import Chunk

_RESULT_PREVIEW = 400
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 but tab and newline, DEL, and C1 (0x9b is a CSI to a terminal that reads C1)."""
_JSON_CONTROLS = re.compile(b"\x7f|\xc2[\x80-\x9f]")
"""DEL and C1 in UTF-8: JSON leaves them unescaped, the only controls it does."""

Piece = tuple[str, str]
"""Part of a line, and its style."""


def terminal_safe(text: str) -> str:
    """``text`` without the characters a terminal acts on instead of showing: without
    its ESC, every escape sequence is plain text; tab and newline stay."""
    return _CONTROLS.sub("", text)


def json_line(data: bytes) -> bytes:
    """A JSON text with DEL and the C1 controls escaped as well (``\\u009b``): the
    same value, and nothing a terminal acts on."""
    return _JSON_CONTROLS.sub(lambda m: b"\\u%04x" % ord(m.group().decode()), data)


class ConversationRenderer:
    """Streams text deltas as they come; tool calls and results on lines of their own.

    What the agent wrote is shown ``terminal_safe``; with ``raw``, as it is, written
    straight to the console's file (rich itself would drop some controls, a BEL that
    ends an OSC among them), and so without styles."""

    def __init__(self, console: Console, *, raw: bool = False) -> None:
        self.console = console
        self.raw = raw
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
            self._line((f"● run {self._shown(str(chunk.get('runId')))}", "bold"))
        elif kind == "RUN_FINISHED":
            self._line(("● finished", "bold green"))
        elif kind == "RUN_ERROR":  # the agent's own message, or its stderr's, often
            self._line((f"● error: {self._shown(str(chunk.get('message')))}", "bold red"))
        elif kind == "CUSTOM" and chunk.get("name") == "turnkeeper.interrupted":
            self._line(("● interrupted: the agent continues in a new process", "yellow"))
        elif kind == "CUSTOM" and chunk.get("name") == "turnkeeper.fresh_workspace":
            value = chunk.get("value")
            message = value.get("message") if isinstance(value, dict) else None
            self._line((f"● {self._shown(str(message or 'a fresh workspace'))}", "yellow"))

    def _shown(self, text: str) -> str:
        return text if self.raw else terminal_safe(text)

    def _text(self, delta: str) -> None:
        if not self._in_text:
            self._write("\n")
            self._in_text = True
        if self.raw:
            self._write(delta)
        else:
            self.console.print(
                terminal_safe(delta), end="", markup=False, highlight=False, soft_wrap=True
            )

    def _end_text(self) -> None:
        if self._in_text:
            self._write("\n")
            self._in_text = False

    def _tool_call(self, call_id: str) -> None:
        name = self._shown(self._tool_names.get(call_id, "tool"))
        args = self._shown(_compact(self._tool_args.get(call_id, "")))
        self._line(("⏺ ", "cyan"), (name, "bold cyan"), (f"({args})", ""))

    def _tool_result(self, content: str) -> None:
        preview = content if len(content) <= _RESULT_PREVIEW else content[:_RESULT_PREVIEW] + "…"
        self._line(("  ⎿ ", "dim"), (self._shown(preview).rstrip(), "dim"))

    def _line(self, *pieces: Piece) -> None:
        self._end_text()
        if self.raw:
            self._write("".join(text for text, _ in pieces) + "\n")
            return
        from rich.text import Text  # rich for the conversation only: the tables are plain

        self.console.print(Text.assemble(*pieces), soft_wrap=True)

    def _write(self, text: str) -> None:
        """Plain text, past rich: rich prints a bare newline as this does."""
        self.console.file.write(text)
        self.console.file.flush()

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


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` safe to print: a control character (an agent's escape sequence, say,
    which a terminal would obey) is shown escaped, as ``\\x1b``; with ``lines``,
    line breaks stay."""
    return "".join(
        ch if ch.isprintable() or (lines and ch == "\n") else ascii(ch)[1:-1] for ch in text
    )


def columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table as aligned plain-text lines, each column as wide as its widest cell.

    Never cut to the terminal's width: an id is what the next command takes, so it is
    shown whole, and a line longer than the terminal wraps there. Cells are printed as
    they are, never read as markup or emoji codes (an owner ``host:1234:...`` would
    otherwise show an emoji), their control characters escaped (an inline command's
    program is the runs list's agent, and whoever submitted it chose it)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]
    return "\n".join(lines)
