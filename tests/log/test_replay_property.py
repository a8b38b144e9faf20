"""A journal cut at any byte, replayed from byte 0 and aligned, gives the crash-free log.

The first attempt translates the complete lines it had read when it died and
appended some prefix of those chunks (it may have died between translating and
appending). The takeover fences, snapshots once, replays the whole journal
through a fresh translator, aligns and appends the rest. The resulting log must
equal, seq for seq, the log of a run that never crashed.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnkeeper.agents.formats import translator_for
from turnkeeper.chunks import Chunk, validate_chunk
from turnkeeper.log import Aligner, RunLog

from .samples import custom_chunk

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "claude-code"
PARTIAL_JOURNAL = (FIXTURES / "stream-json-partial.ndjson").read_bytes()
PLAIN_JOURNAL = (FIXTURES / "stream-json.ndjson").read_bytes()
ACCEPTED = custom_chunk("turnkeeper.run_accepted")

_run_numbers = itertools.count()


def complete_lines(data: bytes) -> list[bytes]:
    """The lines a follower has read: those ending in a newline, newline kept."""
    return data.splitlines(keepends=True)[: data.count(b"\n")] if data else []


def crash_free(journal: bytes, fmt: str, run_id: str, accepted: bool) -> list[Chunk]:
    translator = translator_for(fmt, run_id)
    out = [ACCEPTED] if accepted else []
    for line in complete_lines(journal):
        out.extend(translator.feed(line))
    out.extend(translator.finish())
    return out


def first_attempt(
    log: RunLog, run_id: str, journal: bytes, fmt: str, *, cut: int, lost: int, accepted: bool
) -> None:
    """Dies after reading ``journal[:cut]``, with its last ``lost`` chunks never appended."""
    log.fence(run_id, 1)
    translator = translator_for(fmt, run_id)
    chunks: list[Chunk] = []
    for line in complete_lines(journal[:cut]):
        chunks.extend(translator.feed(line))
    # The driver appends its marker before the agent starts; only translated chunks can be lost.
    keep = ([ACCEPTED] if accepted else []) + chunks[: max(0, len(chunks) - lost)]
    seq = 1
    for start in range(0, len(keep), 3):
        seq = log.append(run_id, 1, seq, keep[start : start + 3]) + 1


def takeover(log: RunLog, run_id: str, journal: bytes, fmt: str) -> None:
    log.fence(run_id, 2)
    # The first attempt's marker is not in the journal: an explicitly out-of-band kind.
    out_of_band = {"CUSTOM:turnkeeper.run_accepted"}
    aligner = Aligner(run_id, log.snapshot(run_id), out_of_band=out_of_band)
    translator = translator_for(fmt, run_id)
    for line in complete_lines(journal):
        for chunk in translator.feed(line):
            for seq, forwarded in aligner.feed(chunk):
                log.append(run_id, 2, seq, [forwarded])
    for chunk in translator.finish():
        for seq, forwarded in aligner.feed(chunk):
            log.append(run_id, 2, seq, [forwarded])
    aligner.finish()
    log.close(run_id, 2)


def check(log: RunLog, journal: bytes, fmt: str, cut: int, lost: int, *, accepted: bool) -> None:
    run_id = f"prop-{next(_run_numbers)}"
    first_attempt(log, run_id, journal, fmt, cut=cut, lost=lost, accepted=accepted)
    takeover(log, run_id, journal, fmt)
    expected = list(enumerate(crash_free(journal, fmt, run_id, accepted), start=1))
    assert list(log.read(run_id)) == expected


def test_crash_free_logs_are_valid_and_non_trivial() -> None:
    for journal in (PARTIAL_JOURNAL, PLAIN_JOURNAL):
        chunks = crash_free(journal, "claude-code", "run", accepted=True)
        assert len(chunks) > 10
        for chunk in chunks:
            validate_chunk(chunk)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    cut=st.integers(min_value=0, max_value=len(PARTIAL_JOURNAL)),
    lost=st.integers(min_value=0, max_value=4),
    accepted=st.booleans(),
)
def test_claude_code_journal_cut_anywhere(
    runlog: RunLog, cut: int, lost: int, accepted: bool
) -> None:
    check(runlog, PARTIAL_JOURNAL, "claude-code", cut, lost, accepted=accepted)


@pytest.mark.parametrize("lost", [0, 2])
def test_claude_code_journal_cut_around_every_line_boundary(runlog: RunLog, lost: int) -> None:
    boundaries = [i + 1 for i, byte in enumerate(PLAIN_JOURNAL) if byte == ord("\n")]
    for boundary in [0, *boundaries]:
        for cut in {max(0, boundary - 1), boundary, min(len(PLAIN_JOURNAL), boundary + 1)}:
            check(runlog, PLAIN_JOURNAL, "claude-code", cut, lost, accepted=True)


text_lines = st.lists(
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\n"), max_size=12),
    min_size=0,
    max_size=12,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lines=text_lines, data=st.data(), accepted=st.booleans())
def test_text_journal_cut_anywhere(
    runlog: RunLog, lines: list[str], data: st.DataObject, accepted: bool
) -> None:
    journal = "".join(f"{line}\n" for line in lines).encode()
    cut = data.draw(st.integers(min_value=0, max_value=len(journal)), label="cut")
    lost = data.draw(st.integers(min_value=0, max_value=2), label="lost")
    check(runlog, journal, "text", cut, lost, accepted=accepted)
