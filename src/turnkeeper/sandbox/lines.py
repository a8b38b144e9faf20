"""Byte-exact line splitting with absolute offsets, and the cut of over-long lines.

A journal is read in arbitrary chunks; a line is yielded only once its newline has
arrived, with the absolute byte offset just past that newline, which is exactly the
offset a later read resumes from. Bytes, never characters: invalid UTF-8 passes
through untouched and positions never drift.

A chunk is split all at once (one ``rfind``, one ``split`` and the offsets summed
in C), because per-line Python work was most of the cost of reading a journal
(bench/journal_throughput.py).

With ``max_line_bytes`` (``TURNKEEPER_MAX_LINE_BYTES``), no line is ever held whole.
A line of ``L`` bytes (newline not counted) is handed out whole when ``L`` is at most
the cap ``M``; a longer one is handed out as the pieces ``[0, M)``, ``[M, 2M)``, ...
of its bytes, each a :class:`LinePiece`, as soon as the byte after a piece has
arrived (so a line of exactly ``M`` bytes is never cut). The cut points depend on the
line's bytes only, never on how they were read, so a replay from byte 0 cuts exactly
where the live read cut. A piece's end offset is just past its last byte, or just
past the newline for the line's final piece; the splitter then holds at most ``M``
bytes of an unfinished line.

A read that stops after a piece and starts again (a follow resumed after its link
dropped) starts again inside that line: it is given the line's start as well as its
own (``ReadPoint``), so it cuts the rest where an uninterrupted read would have, and
hands out the line's last bytes as its final piece rather than as a line of their own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import add, itemgetter

Line = tuple[bytes, int]
"""A journal line (or a piece of one) without its newline, and the offset just past it."""


class LinePiece(bytes):
    """A piece of a line longer than the cap; ``final`` when the line's newline follows it.

    Whole lines are plain ``bytes``; only the pieces of cut lines are of this type, so
    telling them apart costs nothing on the common path.
    """

    final: bool

    def __new__(cls, data: bytes | memoryview, final: bool) -> LinePiece:
        piece = super().__new__(cls, data)
        piece.final = final
        return piece

    def __repr__(self) -> str:
        return f"LinePiece({bytes(self)!r}, final={self.final})"

    def journal_bytes(self) -> LinePiece:
        """The piece as the journal holds it: with the line's newline when it is final."""
        return LinePiece(self + b"\n", True) if self.final else self


@dataclass(frozen=True)
class ReadPoint:
    """Where a read of a journal stands: ``offset`` just past the last line or piece it
    handed out, ``line_start`` where the line that one belongs to began.

    The two are equal between lines. They differ after a piece that is not its line's
    last: a read started again there must know how much of the line it already cut, or
    it would take the line's rest for a whole line (``LineSplitter(line_start=...)``).
    """

    offset: int = 0
    line_start: int = 0

    def after(self, lines: Sequence[Line]) -> ReadPoint:
        """The point once ``lines`` (the next lines or pieces of the read) are handed out."""
        if not lines:
            return self
        offset = lines[-1][1]
        for line, end in reversed(lines):  # the common last item ends its line: one step
            if not isinstance(line, LinePiece) or line.final:
                return ReadPoint(offset, end)
        return ReadPoint(offset, self.line_start)


class LineSplitter:
    """Feed chunks, get ``(line_without_newline, end_position)`` for complete lines.

    ``start`` is the offset of the first byte fed; ``line_start``, when the read starts
    inside a line it already cut into pieces (``ReadPoint``), is where that line began.
    """

    def __init__(
        self, start: int = 0, *, max_line_bytes: int | None = None, line_start: int | None = None
    ) -> None:
        if max_line_bytes is not None and max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be positive, got {max_line_bytes!r}")
        cut = 0 if line_start is None else start - line_start
        if cut and (cut < 0 or max_line_bytes is None or cut % max_line_bytes):
            # Only the end of a piece is a place to start inside a line: anything else
            # would cut the rest of the line elsewhere than the first read did.
            raise ValueError(
                f"a read cannot start {cut} bytes into a line under a cap of {max_line_bytes}"
            )
        self._buffer = bytearray()  # the unfinished line's bytes not yet handed out
        self.position = start  # offset just past the last line or piece handed out
        self.max_line_bytes = max_line_bytes
        self.received = 0
        self.peak_pending = 0
        """The most bytes of an unfinished line held at once, after a chunk was taken."""
        self._cut = cut  # bytes of the unfinished line already handed out as pieces
        self._taken_cut = 0  # the same, for the first line of the last ``take``

    @property
    def fed_until(self) -> int:
        """Offset just past the last byte fed (complete or not)."""
        return self.position + len(self._buffer)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def take(self, chunk: bytes) -> tuple[bytes, int] | None:
        """Consume ``chunk``; the bytes of the lines it completes (newlines between
        them, not after the last) and their start offset, or None if it completes none.

        With a cap, hand the result to :meth:`lines` (not ``split_lines``), then take
        the unfinished line's pieces with :meth:`pieces`.
        """
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
        self._taken_cut, self._cut = self._cut, 0
        return body, start

    def lines(self, body: bytes, start: int) -> list[Line]:
        """The lines of a ``take`` result, over-long ones cut into pieces."""
        lines = split_lines(body, start)
        limit = self.max_line_bytes
        if limit is None or (
            not self._taken_cut
            and (len(body) <= limit or max(map(len, map(itemgetter(0), lines))) <= limit)
        ):
            return lines
        return cut_lines(lines, limit, self._taken_cut)

    def pieces(self) -> list[Line]:
        """The pieces of the unfinished line that can be handed out now: each full
        piece whose next byte has arrived (that byte is not a newline, or the line
        would have been complete)."""
        limit = self.max_line_bytes
        held = len(self._buffer)
        if limit is None or held <= limit:
            self.peak_pending = max(self.peak_pending, held)
            return []
        count = (held - 1) // limit
        out: list[Line] = []
        with memoryview(self._buffer) as view:  # one copy per piece, into the piece
            for index in range(count):
                self.position += limit
                out.append(
                    (LinePiece(view[index * limit : (index + 1) * limit], False), self.position)
                )
        del self._buffer[: count * limit]
        self._cut += count * limit
        self.peak_pending = max(self.peak_pending, held, len(self._buffer))
        return out

    def split(self, chunk: bytes) -> list[Line]:
        """Consume ``chunk``; every line (or piece) it completes, with its end offset."""
        taken = self.take(chunk)
        out = [] if taken is None else self.lines(*taken)
        if self.max_line_bytes is not None:
            out.extend(self.pieces())
        return out

    def feed(self, chunk: bytes) -> Iterator[Line]:
        """Like ``split``; the chunk is consumed at the call, whatever is iterated."""
        return iter(self.split(chunk))


def split_lines(body: bytes, start: int) -> list[Line]:
    """``(line, end_offset)`` for each newline-separated line of ``body`` (as returned
    by ``LineSplitter.take``), all at C speed."""
    lines = body.split(b"\n")
    # end of line i = start + (bytes of lines 0..i) + (i + 1 newlines)
    first = start + 1
    ends = map(add, accumulate(map(len, lines)), range(first, first + len(lines)))
    return list(zip(lines, ends, strict=True))


def cut_lines(lines: list[Line], limit: int, first_cut: int = 0) -> list[Line]:
    """``lines`` with every line over ``limit`` bytes cut into pieces; the first line
    is the rest of a line whose first ``first_cut`` bytes were handed out already (a
    multiple of ``limit``)."""
    out: list[Line] = []
    for index, (line, end) in enumerate(lines):
        cut = first_cut if index == 0 else 0
        if not cut and len(line) <= limit:
            out.append((line, end))
            continue
        start = end - len(line) - 1
        for offset in range(0, max(len(line), 1), limit):
            piece = line[offset : offset + limit]
            final = offset + limit >= len(line)
            out.append((LinePiece(piece, final), end if final else start + offset + limit))
    return out
