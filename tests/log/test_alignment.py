"""Alignment of a replay against a stored log: the pure walk, then takeovers on real Redis."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from turnkeeper.chunks import Chunk
from turnkeeper.errors import (
    AlignmentError,
    JournalReplayDivergedError,
    JournalReplayShortError,
)
from turnkeeper.log import Aligner, RunLog, Snapshot, chunk_kind

from .samples import custom_chunk, text_chunk


def align(
    replayed: Iterable[Chunk], stored: Any, *, run_id: str, **options: Any
) -> list[tuple[int, Chunk]]:
    """What ``Aligner`` says to append for a whole replay, fed as a driver feeds it."""
    aligner = Aligner(run_id, stored, **options)
    out: list[tuple[int, Chunk]] = []
    for chunk in replayed:
        out.extend(aligner.feed(chunk))
    aligner.finish()
    return out


def stored(items: list[Chunk]) -> list[tuple[int, Chunk]]:
    return list(enumerate(items, start=1))


SIX = [text_chunk(n) for n in range(6)]


def kinds(*chunks: Chunk) -> frozenset[str]:
    """An explicit out-of-band list naming the kinds of ``chunks``."""
    return frozenset(chunk_kind(chunk) for chunk in chunks)


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


def test_a_change_inside_a_custom_chunk_diverges_at_that_chunk() -> None:
    """A CUSTOM chunk is compared like any other: a nested value that differs is a
    divergence at its own seq, not a skip that hides it."""
    logged = [text_chunk(0), {"type": "CUSTOM", "name": "x", "value": {"a": [1, {"b": 2}]}}]
    replayed = [text_chunk(0), {"type": "CUSTOM", "name": "x", "value": {"a": [1, {"b": 3}]}}]
    with pytest.raises(JournalReplayDivergedError) as info:
        align(replayed, stored(logged), run_id="r")
    assert (info.value.fields["seq"], info.value.reason) == (2, "diverged")
    assert info.value.fields["stored"] == '{"name":"x","type":"CUSTOM","value":{"a":[1,{"b":2}]}}'


def test_chunk_kinds_name_custom_chunks_by_their_name() -> None:
    assert [chunk_kind(c) for c in (SIX[0], custom_chunk("a"))] == [
        "TEXT_MESSAGE_CONTENT",
        "CUSTOM:a",
    ]


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
    listed = kinds(*(c for c in logged if c["type"] == "CUSTOM"))
    assert align(SIX[:3], stored(logged), run_id="r", out_of_band=listed) == []
    assert align(SIX, stored(logged), run_id="r", out_of_band=listed) == [
        (8, SIX[3]),
        (9, SIX[4]),
        (10, SIX[5]),
    ]
    # Listed kinds only: the same log with one kind missing from the list diverges there.
    with pytest.raises(JournalReplayDivergedError) as info:
        align(SIX, stored(logged), run_id="r", out_of_band=listed - {"CUSTOM:bridge-2"})
    assert info.value.fields["seq"] == 4


def test_a_replayed_custom_chunk_matches_its_stored_twin() -> None:
    replayed = [SIX[0], custom_chunk("unparsed"), SIX[1]]
    assert align(replayed, stored(replayed[:2]), run_id="r") == [(3, SIX[1])]


def test_a_stored_custom_chunk_is_not_skipped_by_default() -> None:
    with pytest.raises(JournalReplayDivergedError) as info:
        align(SIX, stored([custom_chunk("a"), *SIX]), run_id="r")
    assert info.value.fields["seq"] == 1
    with pytest.raises(JournalReplayShortError):
        align(SIX, stored([*SIX, custom_chunk("a")]), run_id="r")


def test_out_of_band_skip_limit_counts_consecutive_skips_only() -> None:
    burst = [custom_chunk(f"b{n}") for n in range(64)]
    listed = kinds(*burst, custom_chunk("one more"))
    logged = [*burst, SIX[0], *burst, SIX[1]]
    assert align(SIX, stored(logged), run_id="r", out_of_band=listed) == [
        (131 + n, SIX[2 + n]) for n in range(4)
    ]
    too_many = [*burst, custom_chunk("one more"), SIX[0]]
    with pytest.raises(JournalReplayDivergedError) as info:
        align(SIX, stored(too_many), run_id="r", out_of_band=listed)
    assert info.value.reason == "too-many-out-of-band"
    assert info.value.fields["index"] == 64
    assert align(
        SIX, stored(too_many), run_id="r", out_of_band=listed, max_out_of_band_skip=65
    ) == [(67 + n, SIX[1 + n]) for n in range(5)]


def test_a_real_divergence_after_out_of_band_entries_still_raises() -> None:
    with pytest.raises(JournalReplayDivergedError) as info:
        align(
            [text_chunk(7)],
            stored([custom_chunk("a"), SIX[0]]),
            run_id="r",
            out_of_band=kinds(custom_chunk("a")),
        )
    assert info.value.fields["index"] == 1


def test_snapshot_with_a_gap_is_refused() -> None:
    with pytest.raises(AlignmentError) as info:
        Aligner("r", [(2, SIX[0]), (4, SIX[1])])
    assert info.value.reason == "incomplete-snapshot"


@pytest.mark.parametrize("page_size", [1, 2, 1000])
def test_a_trimmed_log_aligns_from_its_first_kept_seq(page_size: int) -> None:
    """Seqs 1..3 were trimmed: the first three replayed chunks stand for them, the
    rest is compared from seq 4, in pages."""
    kept = list(enumerate(SIX[3:5], start=4))
    aligner = Aligner("r", Snapshot("r", kept), page_size=page_size)
    assert [aligner.feed(chunk) for chunk in SIX] == [[], [], [], [], [], [(6, SIX[5])]]
    summary = aligner.finish()
    assert (summary.trimmed, summary.suppressed, summary.forwarded) == (3, 2, 1)


def test_a_trimmed_log_still_catches_a_divergence_at_its_first_kept_seq() -> None:
    kept = list(enumerate(SIX[3:5], start=4))
    replay = [*SIX[:3], text_chunk(42), *SIX[4:]]
    with pytest.raises(JournalReplayDivergedError) as info:
        align(replay, Snapshot("r", kept), run_id="r")
    assert info.value.fields["seq"] == 4


def test_a_trimmed_log_with_a_replay_that_ends_inside_the_trimmed_range_is_short() -> None:
    kept = list(enumerate(SIX[3:5], start=4))
    with pytest.raises(JournalReplayShortError) as info:
        align(SIX[:2], Snapshot("r", kept), run_id="r")
    assert (info.value.fields["index"], info.value.fields["remaining"]) == (2, 3)


def test_realign_takes_in_chunks_a_rebuild_put_past_the_known_end() -> None:
    """The aligner knew seqs 1..2 and forwarded 3..4; the log (rebuilt) holds 1..5:
    the forwards are compared again, and only what is past seq 5 goes on."""
    log = stored(SIX[:5])
    aligner = Aligner("r", Snapshot("r", log[:2]))
    assert [aligner.feed(c) for c in SIX[:4]] == [[], [], [(3, SIX[2])], [(4, SIX[3])]]

    class Grown:
        first_seq, last_seq = 1, 5

        def page(self, after_seq: int, count: int) -> list[tuple[int, Chunk]]:
            return log[after_seq : after_seq + count]

    aligner.realign(3, 5, Grown())  # the log as it is now
    assert [aligner.feed(c) for c in SIX[2:]] == [[], [], [], [(6, SIX[5])]]
    assert aligner.finish().forwarded == 1


def test_aligner_reports_progress() -> None:
    aligner = Aligner(
        "r", stored([custom_chunk("a"), *SIX[:2]]), out_of_band=kinds(custom_chunk("a"))
    )
    assert (aligner.aligned, aligner.next_seq) == (False, 4)
    assert aligner.feed(SIX[0]) == []
    assert aligner.feed(SIX[1]) == []
    assert aligner.aligned
    assert aligner.feed(SIX[2]) == [(4, SIX[2])]
    summary = aligner.finish()
    assert (summary.suppressed, summary.skipped, summary.forwarded) == (2, 1, 1)


# --- takeovers on a real log ------------------------------------------------------


def takeover(
    log: RunLog, run_id: str, epoch: int, replay: list[Chunk], out_of_band: frozenset[str] = kinds()
) -> None:
    """What the driver does: fence, snapshot once, align, append the rest."""
    log.fence(run_id, epoch)
    snapshot = log.snapshot(run_id)
    rest = align(replay, snapshot, run_id=run_id, out_of_band=out_of_band)
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
    takeover(runlog, "r", 2, SIX, kinds(custom_chunk("run.accepted")))
    assert runlog.snapshot("r") == stored([custom_chunk("run.accepted"), *SIX])
