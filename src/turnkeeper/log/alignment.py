"""Alignment of a journal replayed from byte 0 against the log clients already saw.

After a takeover, the new owner translates the whole journal again. Chunks that
are already in the log must not be appended twice, and the replay must really
reproduce them: a replay that differs is a bug (or a foreign journal) and stops
the takeover loudly instead of showing clients a forked transcript.

The walk: the snapshot is taken once, up front. Each replayed chunk is compared
by fingerprint with the stored chunk at the cursor. A match is suppressed. On a
mismatch, a stored out-of-band chunk (CUSTOM by default: markers and events
spliced in by timing, which a replay cannot reproduce) is skipped and the
comparison retried, at most ``max_out_of_band_skip`` in a row. Anything else
raises JournalReplayDivergedError. Once the cursor passes the end of the
snapshot, replayed chunks are forwarded with seqs after the last stored seq.

Since forwarding only starts once every stored chunk was matched or skipped, a
divergence can never follow a partial append.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from turnkeeper.chunks import Chunk, fingerprint
from turnkeeper.errors import (
    AlignmentError,
    JournalReplayDivergedError,
    JournalReplayShortError,
)

logger = structlog.get_logger(__name__)

DEFAULT_MAX_OUT_OF_BAND_SKIP: Final = 64

OutOfBand = Callable[[Chunk], bool]


def is_custom_chunk(chunk: Chunk) -> bool:
    """The default out-of-band rule: any CUSTOM chunk."""
    return chunk.get("type") == "CUSTOM"


@dataclass(frozen=True, slots=True)
class AlignmentSummary:
    suppressed: int
    skipped: int
    forwarded: int


def _show(value: bytes, limit: int = 300) -> str:
    text = value.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."


class Aligner:
    """Feeds replayed chunks one at a time; returns what is still to append."""

    def __init__(
        self,
        run_id: str,
        snapshot: Sequence[tuple[int, Chunk]],
        *,
        is_out_of_band: OutOfBand = is_custom_chunk,
        max_out_of_band_skip: int = DEFAULT_MAX_OUT_OF_BAND_SKIP,
    ) -> None:
        for index, (seq, _chunk) in enumerate(snapshot):
            if seq != index + 1:
                raise AlignmentError(
                    f"the snapshot must hold seqs 1..n without gaps; index {index} has seq {seq}",
                    run_id=run_id,
                    reason="incomplete-snapshot",
                    index=index,
                    seq=seq,
                )
        self.run_id = run_id
        self._stored = snapshot
        self._is_out_of_band = is_out_of_band
        self._max_skip = max_out_of_band_skip
        self._cursor = 0
        self._run_of_skips = 0
        self._suppressed = 0
        self._skipped = 0
        self._forwarded = 0
        self._next_seq = len(snapshot) + 1

    @property
    def aligned(self) -> bool:
        """True once every stored chunk was matched or skipped: chunks now pass through."""
        return self._cursor >= len(self._stored)

    @property
    def next_seq(self) -> int:
        """The seq the next forwarded chunk gets."""
        return self._next_seq

    def feed(self, chunk: Chunk) -> list[tuple[int, Chunk]]:
        """The chunks to append because of ``chunk``: none while still in the stored prefix."""
        if self.aligned:
            return self._forward(chunk)
        replayed = fingerprint(chunk)
        while self._cursor < len(self._stored):
            stored_chunk = self._stored[self._cursor][1]
            if fingerprint(stored_chunk) == replayed:
                self._cursor += 1
                self._run_of_skips = 0
                self._suppressed += 1
                return []
            if not self._is_out_of_band(stored_chunk):
                raise JournalReplayDivergedError(
                    f"journal replay diverged at index {self._cursor}: stored "
                    f"{_show(fingerprint(stored_chunk))} but replayed {_show(replayed)}",
                    run_id=self.run_id,
                    reason="diverged",
                    index=self._cursor,
                    seq=self._cursor + 1,
                    stored=fingerprint(stored_chunk).decode("utf-8", "replace"),
                    replayed=replayed.decode("utf-8", "replace"),
                )
            self._skip_out_of_band()
        return self._forward(chunk)

    def finish(self) -> AlignmentSummary:
        """End of the replay: every stored chunk left must be skippable out-of-band."""
        remaining = len(self._stored) - self._cursor
        while self._cursor < len(self._stored):
            if not self._is_out_of_band(self._stored[self._cursor][1]):
                raise JournalReplayShortError(
                    f"journal replay is shorter than the stored log: {remaining} stored "
                    f"chunk(s) from index {len(self._stored) - remaining} were not reproduced",
                    run_id=self.run_id,
                    reason="short",
                    index=len(self._stored) - remaining,
                    remaining=remaining,
                )
            self._skip_out_of_band()
        summary = AlignmentSummary(self._suppressed, self._skipped, self._forwarded)
        logger.info(
            "takeover.aligned",
            run_id=self.run_id,
            suppressed=summary.suppressed,
            skipped=summary.skipped,
            forwarded=summary.forwarded,
        )
        return summary

    def _skip_out_of_band(self) -> None:
        if self._run_of_skips >= self._max_skip:
            raise JournalReplayDivergedError(
                f"more than {self._max_skip} out-of-band chunks in a row at index "
                f"{self._cursor} were not reproduced by the replay",
                run_id=self.run_id,
                reason="too-many-out-of-band",
                index=self._cursor,
                seq=self._cursor + 1,
                stored=fingerprint(self._stored[self._cursor][1]).decode("utf-8", "replace"),
                replayed=None,
            )
        self._cursor += 1
        self._run_of_skips += 1
        self._skipped += 1

    def _forward(self, chunk: Chunk) -> list[tuple[int, Chunk]]:
        seq = self._next_seq
        self._next_seq += 1
        self._forwarded += 1
        return [(seq, chunk)]


def align(
    replayed_chunks: Iterable[Chunk],
    snapshot: Sequence[tuple[int, Chunk]],
    *,
    run_id: str,
    is_out_of_band: OutOfBand = is_custom_chunk,
    max_out_of_band_skip: int = DEFAULT_MAX_OUT_OF_BAND_SKIP,
) -> list[tuple[int, Chunk]]:
    """The chunks of a whole replay still to append, with their seqs.

    Raises JournalReplayDivergedError or JournalReplayShortError before
    returning anything.
    """
    aligner = Aligner(
        run_id,
        snapshot,
        is_out_of_band=is_out_of_band,
        max_out_of_band_skip=max_out_of_band_skip,
    )
    out: list[tuple[int, Chunk]] = []
    for chunk in replayed_chunks:
        out.extend(aligner.feed(chunk))
    aligner.finish()
    return out
