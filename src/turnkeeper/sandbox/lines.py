"""Byte-exact line splitting with absolute offsets.

A journal is read in arbitrary chunks; a line is yielded only once its newline has
arrived, with the absolute byte offset just past that newline, which is exactly the
offset a later read resumes from. Bytes, never characters: invalid UTF-8 passes
through untouched and positions never drift.
"""

from __future__ import annotations

from collections.abc import Iterator


class LineSplitter:
    """Feed chunks, get ``(line_without_newline, end_position)`` for complete lines."""

    def __init__(self, start: int = 0) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self.position = start  # offset just past the last complete line
        self.received = 0

    @property
    def fed_until(self) -> int:
        """Offset just past the last byte fed (complete or not)."""
        return self.position + len(self._buffer)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, int]]:
        self.received += len(chunk)
        self._buffer += chunk
        start = 0
        search = self._scanned
        complete = False
        try:
            while True:
                newline = self._buffer.find(b"\n", search)
                if newline < 0:
                    complete = True
                    break
                line = bytes(self._buffer[start:newline])
                self.position += newline + 1 - start
                start = search = newline + 1
                yield line, self.position
        finally:
            del self._buffer[:start]
            # An abandoned feed may leave newlines unscanned; rescan them next time.
            self._scanned = len(self._buffer) if complete else 0
