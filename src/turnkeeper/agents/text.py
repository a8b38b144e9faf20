"""Any other program: its stdout is the text of one assistant message.

The message starts at the first non-empty line and ends at :meth:`finish`.
Each line is one TEXT_MESSAGE_CONTENT whose delta is the line's bytes exactly,
its newline included when the driver passed it (so the deltas concatenate to
the program's output). A line that is not UTF-8 is a CUSTOM
``turnkeeper.unparsed`` chunk (``reason: "invalid-utf8"``, ``base64`` of the
bytes); nothing else is ever unusable here.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.agents.translator import BaseTranslator, register, unparsed_chunk
from turnkeeper.chunks import Chunk


class TextTranslator(BaseTranslator):
    format = "text"

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self._message: str | None = None

    def feed(self, line: bytes) -> list[Chunk]:
        if not line:
            return []
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return [unparsed_chunk(line, "invalid-utf8")]
        out: list[Chunk] = []
        if self._message is None:
            self._message = self.new_message_id()
            out.append(
                {"type": "TEXT_MESSAGE_START", "messageId": self._message, "role": "assistant"}
            )
        out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": self._message, "delta": text})
        return out

    def translate(self, event: dict[str, Any]) -> list[Chunk]:  # pragma: no cover - feed overrides
        raise NotImplementedError

    def finish(self) -> list[Chunk]:
        if self._message is None:
            return []
        message, self._message = self._message, None
        return [{"type": "TEXT_MESSAGE_END", "messageId": message}]


register(TextTranslator.format, TextTranslator)
