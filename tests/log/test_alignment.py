"""Alignment of a replay against a stored log: the pure walk, then takeovers on real Redis."""

from __future__ import annotations

import pytest

from turnkeeper.chunks import Chunk
from turnkeeper.errors import (
    AlignmentError,
    JournalReplayDivergedError,
    JournalReplayShortError,
)
from turnkeeper.log import Aligner, RunLog, align

from .samples import custom_chunk, text_chunk


def stored(items: list[Chunk]) -> list[tuple[int, Chunk]]:
    return list(enumerate(items, start=1))


SIX = [text_chunk(n) for n in range(6)]


def test_empty_log_forwards_everything() -> None:
    assert align(SIX, [], run_id="r") == stored(SIX)


def test_full_match_forwards_nothing() -> None:
    assert align(SIX, stored(SIX), run_id="r") == []


def test_prefix_is_suppressed_and_the_rest_continues_its_seqs() -> None:
    assert align(SIX, stored(SIX[:3]), run_id="r") == [(4, SIX[3]), (5, SIX[4]), (6, SIX[5])]


def test_timestamp_drift_and_key_order_still_align() -> None:
    replayed = [{**dict(reversed(list(c.items()))), "timestamp": 999} for c in SIX]
    logged = [{**c, "timestamp": 1} for c in SIX[:4]]
    assert align(replayed, stored(logged), run_id="r") == [(5, replayed[4]), (6, replayed[5])]


@pytest.mark.parametrize("at", [0, 2])
def test_divergence_raises_with_index_and_fingerprints(at: int) -> None:
    replayed = list(SIX)
    replayed[at] = text_chunk(99)
    aligner = Aligner("r", stored(SIX[:4]))
    fed: list[tuple[int, Chunk]] = []

    def feed_all() -> None:
        for chunk in replayed:
            fed.extend(aligner.feed(chunk))

    with pytest.raises(JournalReplayDivergedError) as info:
        feed_all()
    assert fed == []
    error = info.value
    assert (error.run_id, error.fields["index"], error.fields["seq"]) == ("r", at, at + 1)
    assert error.fields["stored"] == (
        f'{{"delta":"chunk {at}","messageId":"m","type":"TEXT_MESSAGE_CONTENT"}}'
    )
    assert error.fields["replayed"] == (
        '{"delta":"chunk 99","messageId":"m","type":"TEXT_MESSAGE_CONTENT"}'
    )


def test_nested_change_diverges() -> None:
    logged = [{"type": "CUSTOM", "name": "x", "value": {"a": [1, {"b": 2}]}}, text_chunk(0)]
    replayed = [{"type": "CUSTOM", "name": "x", "value": {"a": [1, {"b": 3}]}}, text_chunk(0)]
    # The stored CUSTOM is out-of-band, so it is skipped; then chunk 0 mismatches the replayed one.
    with pytest.raises(JournalReplayDivergedError):
        align(replayed, stored(logged), run_id="r")
    with pytest.raises(JournalReplayDivergedError):
        align(replayed, stored(logged), run_id="r", is_out_of_band=lambda _c: False)


@pytest.mark.parametrize("replay_length", [0, 1, 3])
def test_shorter_replay_raises(replay_length: int) -> None:
    with pytest.raises(JournalReplayShortError) as info:
        align(SIX[:replay_length], stored(SIX[:4]), run_id="r")
    assert info.value.fields["index"] == replay_length
    assert info.value.fields["remaining"] == 4 - replay_length


def test_out_of_band_entries_are_skipped_in_the_middle_and_at_the_end() -> None:
    logged = [
        custom_chunk("accepted"),
        SIX[0],
        custom_chunk("bridge-1"),
        custom_chunk("bridge-2"),
        SIX[1],
        SIX[2],
        custom_chunk("tail"),
    ]
    assert align(SIX[:3], stored(logged), run_id="r") == []
    assert align(SIX, stored(logged), run_id="r") == [(8, SIX[3]), (9, SIX[4]), (10, SIX[5])]


def test_a_replayed_custom_chunk_matches_its_stored_twin() -> None:
    replayed = [SIX[0], custom_chunk("unparsed"), SIX[1]]
    assert align(replayed, stored(replayed[:2]), run_id="r") == [(3, SIX[1])]


def test_strict_predicate_does_not_skip() -> None:
    with pytest.raises(JournalReplayDivergedError):
        align(SIX, stored([custom_chunk("a"), *SIX]), run_id="r", is_out_of_band=lambda _c: False)


def test_out_of_band_skip_limit_counts_consecutive_skips_only() -> None:
    burst = [custom_chunk(f"b{n}") for n in range(64)]
    logged = [*burst, SIX[0], *burst, SIX[1]]
    assert align(SIX, stored(logged), run_id="r") == [(131 + n, SIX[2 + n]) for n in range(4)]
    too_many = [*burst, custom_chunk("one more"), SIX[0]]
    with pytest.raises(JournalReplayDivergedError) as info:
        align(SIX, stored(too_many), run_id="r")
    assert info.value.reason == "too-many-out-of-band"
    assert info.value.fields["index"] == 64
    assert align(SIX, stored(too_many), run_id="r", max_out_of_band_skip=65) == [
        (67 + n, SIX[1 + n]) for n in range(5)
    ]


def test_a_real_divergence_after_out_of_band_entries_still_raises() -> None:
    with pytest.raises(JournalReplayDivergedError) as info:
        align([text_chunk(7)], stored([custom_chunk("a"), SIX[0]]), run_id="r")
    assert info.value.fields["index"] == 1


def test_snapshot_with_a_gap_is_refused() -> None:
    with pytest.raises(AlignmentError) as info:
        Aligner("r", [(2, SIX[0])])
    assert info.value.reason == "incomplete-snapshot"


def test_aligner_reports_progress() -> None:
    aligner = Aligner("r", stored([custom_chunk("a"), *SIX[:2]]))
    assert (aligner.aligned, aligner.next_seq) == (False, 4)
    assert aligner.feed(SIX[0]) == []
    assert aligner.feed(SIX[1]) == []
    assert aligner.aligned
    assert aligner.feed(SIX[2]) == [(4, SIX[2])]
    summary = aligner.finish()
    assert (summary.suppressed, summary.skipped, summary.forwarded) == (2, 1, 1)


# --- takeovers on a real log ------------------------------------------------------


def takeover(log: RunLog, run_id: str, epoch: int, replay: list[Chunk]) -> None:
    """What the driver does: fence, snapshot once, align, append the rest."""
    log.fence(run_id, epoch)
    snapshot = log.snapshot(run_id)
    rest = align(replay, snapshot, run_id=run_id)
    if rest:
        log.append(run_id, epoch, rest[0][0], [chunk for _seq, chunk in rest])


def test_takeover_after_three_of_six_chunks_leaves_exactly_six(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, SIX[:3])
    takeover(runlog, "r", 2, SIX)
    runlog.close("r", 2)
    assert list(runlog.read("r")) == stored(SIX)


def test_two_takeovers_in_a_row_still_leave_each_chunk_once(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, SIX[:2])
    takeover(runlog, "r", 2, SIX[:4])
    takeover(runlog, "r", 3, SIX)
    assert runlog.snapshot("r") == stored(SIX)


def test_diverging_takeover_raises_and_appends_nothing(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, SIX[:3])
    diverging = [*SIX[:2], text_chunk(42), *SIX[3:]]
    with pytest.raises(JournalReplayDivergedError):
        takeover(runlog, "r", 2, diverging)
    assert runlog.snapshot("r") == stored(SIX[:3])
    assert runlog.state("r").epoch == 2


def test_takeover_skips_a_stored_out_of_band_marker(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, [custom_chunk("run.accepted"), *SIX[:2]])
    takeover(runlog, "r", 2, SIX)
    assert runlog.snapshot("r") == stored([custom_chunk("run.accepted"), *SIX])
