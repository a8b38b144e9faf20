"""A line over the cap, read from a real agent's journal on every provider: handed out
in pieces at fixed byte offsets of the line, and never held whole by the reader."""

from __future__ import annotations

import pytest

from turnkeeper.sandbox import AgentCommand, JournalReader, Sandbox, spawn_journaled
from turnkeeper.sandbox.lines import LinePiece
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
    line = _line()
    start = len(b"short\n")
    pieces = [
        (line[offset : offset + CAP], start + offset + CAP, False)
        for offset in range(0, LENGTH - CAP, CAP)
    ]
    final = (line[len(pieces) * CAP :], start + LENGTH + 1, True)
    assert len(pieces) == LENGTH // CAP
    assert items == [(b"short", start, False), *pieces, final, (b"last", start + LENGTH + 6, False)]
    # At most one read beyond the piece being cut: bounded by the cap, not by the line.
    assert reader.peak_pending <= CAP + FOLLOW_READ_BYTES
    assert reader.peak_pending < LENGTH // 4
