"""A line over the cap, read from a real agent's journal on every provider: handed out
in pieces at fixed byte offsets of the line, and never held whole by the reader."""

from __future__ import annotations

import pytest

from turnkeeper.sandbox import AgentCommand, JournalReader, Sandbox, spawn_journaled
from turnkeeper.sandbox.lines import Line, LinePiece, ReadPoint
from turnkeeper.sandbox.reader import FOLLOW_READ_BYTES, Strategy

CAP = 64 * 1024
LENGTH = 5 * 1024 * 1024 + 5  # 80 pieces of 64 KiB and one of 5 bytes
PRINT_LONG = (
    "import sys; o = sys.stdout.buffer; o.write(b'short\\n')\n"
    f"for i in range({LENGTH // 1000}): o.write(b'%03d' % (i % 1000) + b'.' * 997)\n"
    f"o.write(b'!' * {LENGTH % 1000} + b'\\nlast\\n')\n"
)


def _line() -> bytes:
    return b"".join(b"%03d" % (i % 1000) + b"." * 997 for i in range(LENGTH // 1000)) + (
        b"!" * (LENGTH % 1000)
    )


def _expected() -> list[tuple[bytes, int, bool]]:
    """What a read of PRINT_LONG's journal hands out: each line or piece, its end, and
    whether it is a cut line's final piece."""
    line = _line()
    start = len(b"short\n")
    pieces = [
        (line[offset : offset + CAP], start + offset + CAP, False)
        for offset in range(0, LENGTH - CAP, CAP)
    ]
    final = (line[len(pieces) * CAP :], start + LENGTH + 1, True)
    assert len(pieces) == LENGTH // CAP
    return [(b"short", start, False), *pieces, final, (b"last", start + LENGTH + 6, False)]


@pytest.mark.parametrize("strategy", ["follow", "poll"])
def test_a_5_mib_line_comes_in_pieces_and_is_never_held_whole(
    sandbox: Sandbox, strategy: Strategy
) -> None:
    handle = spawn_journaled(sandbox, "long-run", AgentCommand(("python3", "-c", PRINT_LONG)))
    reader = JournalReader(
        sandbox, handle.paths, nonce=handle.nonce, strategy=strategy, max_line_bytes=CAP
    )
    items = [(bytes(line), end, isinstance(line, LinePiece) and line.final) for line, end in reader]
    assert reader.exit_code == 0
    assert items == _expected()
    # At most one read beyond the piece being cut: bounded by the cap, not by the line.
    assert reader.peak_pending <= CAP + FOLLOW_READ_BYTES
    assert reader.peak_pending < LENGTH // 4


@pytest.mark.parametrize("strategy", ["follow", "poll"])
def test_a_read_stopped_inside_the_line_goes_on_with_its_pieces(
    sandbox: Sandbox, strategy: Strategy
) -> None:
    """A read stopped after a piece (a follow whose link dropped) and a reader started
    again at its ``ReadPoint`` hand out what one read does: stopped after piece 40, the
    rest is cut where it was; stopped after piece 80, the 5 bytes left are the line's
    final piece, not a line of their own."""
    handle = spawn_journaled(sandbox, "long-run", AgentCommand(("python3", "-c", PRINT_LONG)))
    for stop_after in (1 + 40, 1 + 80):  # the short line, then that many pieces
        kept: list[Line] = []
        first = JournalReader(
            sandbox, handle.paths, nonce=handle.nonce, strategy=strategy, max_line_bytes=CAP
        )
        for line, end in first:
            kept.append((line, end))
            if len(kept) == stop_after:
                break  # the read's generator is closed here, its follow process killed
        point = ReadPoint().after(kept)
        assert point.line_start == len(b"short\n") < point.offset
        again = JournalReader(
            sandbox,
            handle.paths,
            nonce=handle.nonce,
            strategy=strategy,
            max_line_bytes=CAP,
            from_byte=point.offset,
            line_start=point.line_start,
        )
        rest = list(again)
        assert again.exit_code == 0
        items = [
            (bytes(line), end, isinstance(line, LinePiece) and line.final)
            for line, end in kept + rest
        ]
        assert items == _expected()
