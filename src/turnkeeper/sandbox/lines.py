"""Byte-exact line splitting with absolute offsets.

A journal is read in arbitrary chunks; a line is yielded only once its newline has
arrived, with the absolute byte offset just past that newline, which is exactly the
offset a later read resumes from. Bytes, never characters: invalid UTF-8 passes
through untouched and positions never drift.

A chunk is split all at once (one ``rfind``, one ``split`` and the offsets summed
in C), because per-line Python work was most of the cost of reading a journal
(bench/journal_throughput.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate
from operator import add


class LineSplitter:
    """Feed chunks, get ``(line_without_newline, end_position)`` for complete lines."""

    def __init__(self, start: int = 0) -> None:
        self._buffer = bytearray()  # the incomplete last line, if any
        self.position = start  # offset just past the last complete line
        self.received = 0

    @property
    def fed_until(self) -> int:
        """Offset just past the last byte fed (complete or not)."""
        return self.position + len(self._buffer)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def take(self, chunk: bytes) -> tuple[bytes, int] | None:
        """Consume ``chunk``; the bytes of the lines it completes (newlines between
        them, not after the last) and their start offset, or None if it completes none."""
        self.received += len(chunk)
        last = chunk.rfind(b"\n")
        if last < 0:
            self._buffer += chunk
            return None
        if self._buffer:
            self._buffer += chunk[:last]
            body = bytes(self._buffer)
        else:
            body = bytes(chunk[:last])
        self._buffer = bytearray(chunk[last + 1 :])
        start = self.position
        self.position += len(body) + 1
        return body, start

    def split(self, chunk: bytes) -> list[tuple[bytes, int]]:
        """Consume ``chunk``; every line it completes, with its end offset, in order."""
        taken = self.take(chunk)
        return [] if taken is None else split_lines(*taken)

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, int]]:
        """Like ``split``; the chunk is consumed at the call, whatever is iterated."""
        return iter(self.split(chunk))


def split_lines(body: bytes, start: int) -> list[tuple[bytes, int]]:
    """``(line, end_offset)`` for each newline-separated line of ``body`` (as returned
    by ``LineSplitter.take``), all at C speed."""
    lines = body.split(b"\n")
    # end of line i = start + (bytes of lines 0..i) + (i + 1 newlines)
    first = start + 1
    ends = map(add, accumulate(map(len, lines)), range(first, first + len(lines)))
    return list(zip(lines, ends, strict=True))
