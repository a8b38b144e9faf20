"""Any other program: its stdout is the text of one assistant message.

The message starts at the first non-empty line and ends at :meth:`finish`.
Each line is one TEXT_MESSAGE_CONTENT whose delta is the line's bytes exactly,
its newline included when the driver passed it (so the deltas concatenate to
the program's output). A line that is not UTF-8 is a CUSTOM
``turnkeeper.unparsed`` chunk (``reason: "invalid-utf8"``, ``base64`` of the
bytes); nothing else is ever unusable here. A line over the line cap comes in
pieces (:meth:`TextTranslator.feed_piece`): each is a TEXT_MESSAGE_CONTENT of its
own, a character cut in two carried to the next piece, so the deltas still
concatenate to the program's output.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.agents.translator import BaseTranslator, unparsed_chunk
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
        return self._content(text)

    def _content(self, text: str) -> list[Chunk]:
        out: list[Chunk] = []
        if self._message is None:
            self._message = self.new_message_id()
            out.append(
                {"type": "TEXT_MESSAGE_START", "messageId": self._message, "role": "assistant"}
            )
        out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": self._message, "delta": text})
        return out

    def feed_piece(self, piece: bytes, *, final: bool) -> list[Chunk]:
        _, body, text = self._piece_text.take(piece, final=final)
        if not body:
            return []
        if text is None:
            return [unparsed_chunk(body, "invalid-utf8")]
        return self._content(text)

    def translate(self, event: dict[str, Any]) -> list[Chunk]:  # pragma: no cover - feed overrides
        raise NotImplementedError

    def finish(self) -> list[Chunk]:
        if self._message is None:
            return []
        message, self._message = self._message, None
        return [{"type": "TEXT_MESSAGE_END", "messageId": message}]
