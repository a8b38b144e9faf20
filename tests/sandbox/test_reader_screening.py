"""The reader's per-chunk screening equals checking each line in order: the sentinel
first, then the size limit, with every earlier line handed out before an error; and a
sentinel counts only as the journal's final line."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnkeeper.errors import InvalidSentinelError, JournalTooLargeError
from turnkeeper.sandbox import JournalPaths, JournalReader, Sandbox, exit_sentinel_line

RUN = "screen-run"
NONCE = "5a" * 32


def _journal(sandbox: Sandbox, body: bytes) -> JournalPaths:
    """A finished journal holding ``body``, written in one go so one read sees it all."""
    paths = JournalPaths(sandbox.ref.journal_dir, RUN, 1)
    Path(paths.journal).write_bytes(body)
    Path(paths.lock).touch()
    return paths


def _sentinel(sandbox: Sandbox, code: int = 0) -> bytes:
    return exit_sentinel_line(code, NONCE)


def _forged(sandbox: Sandbox) -> bytes:
    """This run's nonce in a line that is not exactly the sentinel."""
    return _sentinel(sandbox).replace(b'"__exit":0', b'"__exit":"0"')


def _read(
    sandbox: Sandbox, paths: JournalPaths, strategy: str, **options: object
) -> tuple[list[tuple[bytes, int]], JournalReader, Exception | None]:
    reader = JournalReader(
        sandbox,
        paths,
        nonce=NONCE,
        strategy=strategy,  # type: ignore[arg-type]
        **options,  # type: ignore[arg-type]
    )
    lines: list[tuple[bytes, int]] = []
    try:
        lines.extend(reader)
    except (InvalidSentinelError, JournalTooLargeError) as exc:
        return lines, reader, exc
    return lines, reader, None


STRATEGIES = pytest.mark.parametrize("strategy", ["follow", "poll"])


@STRATEGIES
def test_lines_before_an_oversized_line_are_handed_out_then_it_fails(
    local_sandbox: Sandbox, strategy: str
) -> None:
    paths = _journal(local_sandbox, b"aaaa\n" * 3 + _sentinel(local_sandbox))
    lines, reader, error = _read(local_sandbox, paths, strategy, max_bytes=12)
    assert lines == [(b"aaaa", 5), (b"aaaa", 10)]
    assert isinstance(error, JournalTooLargeError)
    assert (error.reason, error.fields["position"]) == ("journal-too-large", 15)
    assert reader.exit_code is None
    assert reader.position == 10


@STRATEGIES
def test_a_sentinel_past_the_limit_is_still_the_end(local_sandbox: Sandbox, strategy: str) -> None:
    sentinel = _sentinel(local_sandbox, 3)
    paths = _journal(local_sandbox, b"aaaa\n" * 2 + sentinel)
    lines, reader, error = _read(local_sandbox, paths, strategy, max_bytes=10)
    assert (lines, error) == ([(b"aaaa", 5), (b"aaaa", 10)], None)
    assert (reader.exit_code, reader.end_position) == (3, 10 + len(sentinel))


@STRATEGIES
def test_the_size_limit_is_checked_before_a_later_forged_sentinel(
    local_sandbox: Sandbox, strategy: str
) -> None:
    body = b"aaaa\n" * 3 + _forged(local_sandbox) + _sentinel(local_sandbox)
    lines, _reader, error = _read(
        local_sandbox, _journal(local_sandbox, body), strategy, max_bytes=7
    )
    assert lines == [(b"aaaa", 5)]
    assert isinstance(error, JournalTooLargeError)
    assert error.fields["position"] == 10


@STRATEGIES
def test_a_forged_sentinel_fails_after_the_lines_before_it(
    local_sandbox: Sandbox, strategy: str
) -> None:
    forged = _forged(local_sandbox)
    body = b"one\ntwo\n" + forged + b"after\n" + _sentinel(local_sandbox)
    lines, reader, error = _read(local_sandbox, _journal(local_sandbox, body), strategy)
    assert lines == [(b"one", 4), (b"two", 8)]
    assert isinstance(error, InvalidSentinelError)
    assert error.fields["position"] == 8 + len(forged)
    assert reader.exit_code is None


@STRATEGIES
@pytest.mark.parametrize("after", [b"late\n", b"late", b"\n"], ids=["line", "partial", "blank"])
def test_a_sentinel_followed_by_anything_is_a_forgery(
    local_sandbox: Sandbox, strategy: str, after: bytes
) -> None:
    """Only the writer appends the sentinel, and last: bytes after it mean the nonce
    leaked, so the run fails rather than end, and the line never reaches a client."""
    sentinel = _sentinel(local_sandbox, 0)
    body = b"x\n" + sentinel + after
    lines, reader, error = _read(local_sandbox, _journal(local_sandbox, body), strategy)
    assert lines == [(b"x", 2)]
    assert isinstance(error, InvalidSentinelError)
    assert (error.reason, error.fields["position"]) == ("invalid-sentinel", len(body))
    assert (reader.exit_code, reader.end_position) == (None, None)


@STRATEGIES
def test_bytes_appended_after_the_sentinel_was_read_are_a_forgery(
    local_sandbox: Sandbox, strategy: str
) -> None:
    """A sentinel that ended the bytes read so far is confirmed once its writer is gone:
    a journal that grew behind it fails the same way."""
    sentinel = _sentinel(local_sandbox, 0)
    paths = _journal(local_sandbox, b"x\n" + sentinel)
    reader = JournalReader(local_sandbox, paths, nonce=NONCE, strategy=strategy)  # type: ignore[arg-type]
    lines = iter(reader)
    assert next(lines) == (b"x", 2)
    with Path(paths.journal).open("ab") as journal:  # before the reader looks at the end
        journal.write(b"more\n")
    with pytest.raises(InvalidSentinelError) as caught:
        next(lines)
    assert caught.value.fields["position"] == 2 + len(sentinel) + 5
