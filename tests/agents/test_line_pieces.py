"""What the pieces of a line over the cap become, per format, through ``Replay`` as the
driver feeds it (``with_newlines`` of the splitter's output)."""

from __future__ import annotations

import itertools

from turnkeeper.driver.replay import Replay, with_newlines
from turnkeeper.sandbox.lines import LineSplitter

CAP = 8
EURO = "\N{EURO SIGN}".encode()  # 3 bytes


def _chunks(output_format: str, journal: bytes, read: int) -> list[dict[str, object]]:
    replay = Replay("r", "s", output_format)
    splitter = LineSplitter(0, max_line_bytes=CAP)
    chunks = []
    for offset in range(0, len(journal), read):
        chunks.extend(replay.lines(with_newlines(splitter.split(journal[offset : offset + read]))))
    return chunks + replay.closing()


def _unparsed(piece: int, final: bool, text: str, **extra: str) -> dict[str, object]:
    value = {"reason": "line-too-long", "piece": piece, "final": final, "text": text, **extra}
    return {"type": "CUSTOM", "name": "turnkeeper.unparsed", "value": value}


def test_a_json_line_over_the_cap_becomes_unparsed_pieces_whatever_the_reads() -> None:
    # 6 bytes, then a euro sign across the first boundary (bytes 6..8), 21 bytes in all.
    long_line = b'{"a":"' + EURO + b'bcdefghijk"}'
    journal = b'{"t":1}\n' + long_line + b"\n" + b'{"t":2}\n'
    expected = [
        {"type": "RAW", "event": {"t": 1}, "source": "claude-code"},
        _unparsed(0, False, '{"a":"'),  # the euro sign's first 2 bytes are carried
        _unparsed(1, False, "\N{EURO SIGN}bcdefgh"),
        _unparsed(2, True, 'ijk"}'),
        {"type": "RAW", "event": {"t": 2}, "source": "claude-code"},
    ]
    for read in (1, 3, 7, 64):
        assert _chunks("claude-code", journal, read) == expected
    texts = "".join(str(c["value"]["text"]) for c in expected[1:4])  # type: ignore[index]
    assert texts.encode() == long_line


def test_a_piece_that_is_not_utf8_keeps_its_bytes_in_base64() -> None:
    journal = b"\xff" * 10 + b"\n"
    assert _chunks("codex", journal, 4) == [
        _unparsed(0, False, "\ufffd" * 8, base64="//////////8="),
        _unparsed(1, True, "\ufffd" * 2, base64="//8="),
    ]


def test_a_text_line_over_the_cap_is_consecutive_content_of_one_message() -> None:
    journal = b"hi\n" + b"abcdefg" + EURO + b"hijklmnop\nend\n"
    message = "r-m0"
    deltas = ["hi\n", "abcdefg", "\N{EURO SIGN}hijklm", "nop\n", "end\n"]
    expected = [
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": d} for d in deltas),
        {"type": "TEXT_MESSAGE_END", "messageId": message},
    ]
    for read in itertools.chain(range(1, 6), (100,)):
        assert _chunks("text", journal, read) == expected
