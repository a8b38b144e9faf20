"""The line splitter against a one-line-at-a-time reference, over every way to chunk."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.sandbox.lines import Line, LinePiece, LineSplitter, ReadPoint, split_lines


def _reference(data: bytes, start: int) -> list[tuple[bytes, int]]:
    """The obvious definition: each complete line and the offset just past its newline."""
    out = []
    position = start
    line_start = 0
    for index, byte in enumerate(data):
        if byte == ord("\n"):
            out.append((data[line_start:index], position + index + 1 - line_start))
            position += index + 1 - line_start
            line_start = index + 1
    return out


_bytes = st.lists(st.sampled_from([b"\n", b"a", b"\xff", b"\r", b"\x00", b"\xe2\x82\xac"]))


@given(
    pieces=_bytes,
    cuts=st.lists(st.integers(min_value=0, max_value=64), max_size=8),
    start=st.integers(min_value=0, max_value=10**12),
)
def test_any_chunking_gives_the_reference_lines_and_offsets(
    pieces: list[bytes], cuts: list[int], start: int
) -> None:
    data = b"".join(pieces)
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    splitter = LineSplitter(start)
    out: list[tuple[bytes, int]] = []
    for lo, hi in itertools.pairwise(bounds):
        out.extend(splitter.feed(data[lo:hi]))
    expected = _reference(data, start)
    assert out == expected
    assert splitter.position == (expected[-1][1] if expected else start)
    assert splitter.fed_until == start + len(data)
    assert splitter.pending == len(data) - (splitter.position - start)
    assert splitter.received == len(data)


def test_take_hands_back_the_complete_lines_once() -> None:
    splitter = LineSplitter(5)
    assert splitter.take(b"par") is None
    assert splitter.take(b"tial\nnext\nrest") == (b"partial\nnext", 5)
    assert splitter.position == 18
    assert splitter.take(b"\n") == (b"rest", 18)
    assert split_lines(b"partial\nnext", 5) == [(b"partial", 13), (b"next", 18)]
    assert split_lines(b"", 7) == [(b"", 8)]  # a lone newline is one empty line


def test_feed_consumes_its_chunk_even_if_not_iterated() -> None:
    splitter = LineSplitter(0)
    lines = splitter.feed(b"a\nb\nc")
    assert (splitter.position, splitter.pending) == (4, 1)
    assert list(lines) == [(b"a", 2), (b"b", 4)]


def _reference_capped(data: bytes, start: int, cap: int) -> list[tuple[bytes, int, str]]:
    """The cut rule by its definition: a line of at most ``cap`` bytes whole, a longer
    one as its bytes ``[0, cap)``, ``[cap, 2 cap)``...; of the unfinished last line, the
    full pieces after which a byte has arrived. Each item says what it is."""
    out: list[tuple[bytes, int, str]] = []
    line_start = 0
    while (newline := data.find(b"\n", line_start)) >= 0:
        line = data[line_start:newline]
        if len(line) <= cap:
            out.append((line, start + newline + 1, "line"))
        else:
            for offset in range(0, len(line), cap):
                final = offset + cap >= len(line)
                end = newline + 1 if final else line_start + offset + cap
                out.append((line[offset : offset + cap], start + end, "final" if final else "part"))
        line_start = newline + 1
    tail = data[line_start:]
    out.extend(
        (tail[offset : offset + cap], start + line_start + offset + cap, "part")
        for offset in range(0, len(tail) - cap, cap)
    )
    return out


def _kind(line: bytes) -> str:
    if isinstance(line, LinePiece):
        return "final" if line.final else "part"
    return "line"


@given(
    pieces=st.lists(st.sampled_from([b"\n", b"a", b"bb", b"\xe2\x82\xac", b"x" * 9])),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10),
    start=st.integers(min_value=0, max_value=10**12),
    cap=st.integers(min_value=1, max_value=12),
)
def test_a_capped_splitter_cuts_by_byte_position_whatever_the_chunking(
    pieces: list[bytes], cuts: list[int], start: int, cap: int
) -> None:
    data = b"".join(pieces)
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    splitter = LineSplitter(start, max_line_bytes=cap)
    out: list[tuple[bytes, int]] = []
    widest = 0
    for lo, hi in itertools.pairwise(bounds):
        out.extend(splitter.split(data[lo:hi]))
        widest = max(widest, hi - lo)
        assert splitter.pending <= cap  # never more than one piece of an unfinished line
    assert [(bytes(line), end, _kind(line)) for line, end in out] == _reference_capped(
        data, start, cap
    )
    assert splitter.peak_pending <= cap + widest
    assert splitter.fed_until == start + len(data)
    # Consecutive: each item starts where the one before it ended, newline included.
    position = start
    for line, end in out:
        newline = 0 if isinstance(line, LinePiece) and not line.final else 1
        assert end == position + len(line) + newline
        position = end


def test_a_line_of_exactly_the_cap_is_whole_and_one_byte_more_is_cut() -> None:
    splitter = LineSplitter(0, max_line_bytes=4)
    assert splitter.split(b"abcd") == []  # the next byte decides
    assert splitter.split(b"\nabcde") == [(b"abcd", 5), (b"abcd", 9)]
    assert splitter.pending == 1
    tail = splitter.split(b"\n")
    assert tail == [(b"e", 11)]
    assert isinstance(tail[0][0], LinePiece)
    assert tail[0][0].final
    assert tail[0][0].journal_bytes() == b"e\n"


def test_a_200_mb_line_streams_through_holding_one_piece() -> None:
    cap, block = 1 << 20, 1 << 16
    splitter = LineSplitter(0, max_line_bytes=cap)
    data = b"y" * block
    ends = []
    for _ in range((200 << 20) // block):
        for piece, end in splitter.split(data):
            assert len(piece) == cap
            ends.append(end)
        assert splitter.pending <= cap
    (last,) = splitter.split(b"\n")
    assert ends == [cap * k for k in range(1, 200)]
    assert (len(last[0]), last[1]) == (cap, (200 << 20) + 1)
    assert splitter.peak_pending <= cap + block


def _split(splitter: LineSplitter, data: bytes, cuts: list[int]) -> list[Line]:
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    out: list[Line] = []
    for lo, hi in itertools.pairwise(bounds):
        out.extend(splitter.split(data[lo:hi]))
    return out


@given(
    pieces=st.lists(st.sampled_from([b"\n", b"a", b"bb", b"\xe2\x82\xac", b"x" * 9])),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10),
    again=st.lists(st.integers(min_value=0, max_value=200), max_size=10),
    start=st.integers(min_value=0, max_value=10**12),
    cap=st.integers(min_value=1, max_value=12),
)
def test_a_read_started_again_where_one_stopped_cuts_as_if_it_never_stopped(
    pieces: list[bytes], cuts: list[int], again: list[int], start: int, cap: int
) -> None:
    """A read that stops after any of its lines or pieces (a follow whose link dropped)
    and one started again at its ``ReadPoint`` hand out together what one read does: the
    rest of a cut line is that line's pieces, the last one final, never a line of its own."""
    data = b"".join(pieces)
    expected = _reference_capped(data, start, cap)
    first = _split(LineSplitter(start, max_line_bytes=cap), data, cuts)
    for stop in range(len(first) + 1):
        kept = first[:stop]
        point = ReadPoint(start, start).after(kept)
        resumed = LineSplitter(point.offset, max_line_bytes=cap, line_start=point.line_start)
        rest = _split(resumed, data[point.offset - start :], again)
        assert [(bytes(line), end, _kind(line)) for line, end in kept + rest] == expected


def test_the_rest_of_a_cut_line_after_a_resume_is_its_final_piece() -> None:
    """Stopped after the second piece of a 10-byte line under a cap of 4: the two bytes
    left are the line's final piece, as they are to a read that never stopped."""
    pieces = LineSplitter(100, max_line_bytes=4).split(b"abcdefghi")
    assert pieces == [(b"abcd", 104), (b"efgh", 108)]
    point = ReadPoint(100, 100).after(pieces)
    assert point == ReadPoint(108, 100)
    (rest,) = LineSplitter(108, max_line_bytes=4, line_start=100).split(b"ij\nnext\n")[:1]
    assert rest == (b"ij", 111)
    assert isinstance(rest[0], LinePiece)
    assert rest[0].final
    # Between lines the two offsets are one: a whole line or a final piece ends its line.
    assert point.after([rest]) == ReadPoint(111, 111)
    assert point.after([rest, (b"next", 116)]) == ReadPoint(116, 116)
    assert ReadPoint(7, 7).after([]) == ReadPoint(7, 7)


@pytest.mark.parametrize(
    ("start", "line_start", "cap"), [(10, 4, 4), (4, 10, 4), (12, 4, None), (9, 4, 4)]
)
def test_a_read_cannot_start_inside_a_line_but_at_the_end_of_one_of_its_pieces(
    start: int, line_start: int, cap: int | None
) -> None:
    with pytest.raises(ValueError, match="cannot start"):
        LineSplitter(start, max_line_bytes=cap, line_start=line_start)
