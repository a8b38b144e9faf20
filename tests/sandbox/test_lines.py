"""The line splitter against a one-line-at-a-time reference, over every way to chunk."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.sandbox.lines import LineSplitter, split_lines


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
