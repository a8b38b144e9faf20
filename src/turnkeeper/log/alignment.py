"""Alignment of a journal replayed from byte 0 against the log clients already saw.

After a takeover, the new owner translates the whole journal again. Chunks that
are already in the log must not be appended twice, and the replay must really
reproduce them: a replay that differs is a bug (or a foreign journal) and stops
the takeover loudly instead of showing clients a forked transcript.

The walk: the stored log's extent (first kept seq, last seq) is read once, up
front; its chunks are read in pages as the walk reaches them, so a takeover never
holds a long log whole. Each replayed chunk is compared by fingerprint with the
stored chunk at the cursor. A match is suppressed. On a mismatch, a stored chunk
of an explicitly out-of-band kind (``out_of_band``: chunk kinds a replay cannot
reproduce; none by default, since every chunk the driver appends is a replay of
what Postgres holds) is skipped and the comparison retried, at most
``max_out_of_band_skip`` in a row. Anything else, a CUSTOM chunk included, raises
JournalReplayDivergedError. Once the cursor passes the stored end, replayed
chunks are forwarded with seqs after the last stored seq.

A trimmed log (past ``log_max_chunks``) is aligned from its first kept seq: the
replayed chunks before it stand for the trimmed ones and are suppressed uncompared
(out-of-band chunks in the trimmed range would shift what follows, and surface as
a divergence at the first kept seq, never as a silent fork).

Since forwarding only starts once every stored chunk was matched or skipped, a
divergence can never follow a partial append. ``realign`` lets the writer take in
chunks that a rebuild of the log from Postgres put after the end it knew.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from turnkeeper.chunks import Chunk, fingerprint
from turnkeeper.errors import (
    AlignmentError,
    JournalReplayDivergedError,
    JournalReplayShortError,
)
from turnkeeper.logconfig import get_logger

logger = get_logger(__name__)

DEFAULT_MAX_OUT_OF_BAND_SKIP: Final = 64
OUT_OF_BAND_KINDS: Final[frozenset[str]] = frozenset()
"""Chunk kinds (``chunk_kind``) a replay may fail to reproduce. None today: the
driver appends nothing that is not a pure function of the journal bytes and the
decisions recorded in Postgres."""
PAGE_SIZE: Final = 1_000


def chunk_kind(chunk: Chunk) -> str:
    """``TYPE``, or ``CUSTOM:<name>`` for a CUSTOM chunk: what ``out_of_band`` lists."""
    kind = str(chunk.get("type"))
    return f"{kind}:{chunk.get('name')}" if kind == "CUSTOM" else kind


class StoredChunks(Protocol):
    """The stored log the aligner walks: its extent, and its chunks in pages."""

    @property
    def first_seq(self) -> int: ...

    @property
    def last_seq(self) -> int: ...

    def page(self, after_seq: int, count: int) -> Sequence[tuple[int, Chunk]]: ...


class Snapshot:
    """A stored log held in memory (tests, benchmarks): contiguous seqs from any first."""

    def __init__(self, run_id: str, chunks: Sequence[tuple[int, Chunk]]) -> None:
        first = chunks[0][0] if chunks else 1
        for index, (seq, _chunk) in enumerate(chunks):
            if seq != first + index:
                raise AlignmentError(
                    f"the snapshot must hold contiguous seqs; index {index} has seq {seq}",
                    run_id=run_id,
                    reason="incomplete-snapshot",
                    index=index,
                    seq=seq,
                )
        self._chunks = chunks
        self._first = first

    @property
    def first_seq(self) -> int:
        return self._first

    @property
    def last_seq(self) -> int:
        return self._first + len(self._chunks) - 1

    def page(self, after_seq: int, count: int) -> Sequence[tuple[int, Chunk]]:
        start = max(0, after_seq + 1 - self._first)
        return self._chunks[start : start + count]


@dataclass(frozen=True, slots=True)
class AlignmentSummary:
    suppressed: int
    skipped: int
    forwarded: int
    trimmed: int = 0
    """Replayed chunks that stood for chunks trimmed from the log, suppressed uncompared."""


def _show(value: bytes, limit: int = 300) -> str:
    text = value.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."


class Aligner:
    """Feeds replayed chunks one at a time; returns what is still to append."""

    def __init__(
        self,
        run_id: str,
        stored: StoredChunks | Sequence[tuple[int, Chunk]],
        *,
        out_of_band: Collection[str] = OUT_OF_BAND_KINDS,
        max_out_of_band_skip: int = DEFAULT_MAX_OUT_OF_BAND_SKIP,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.run_id = run_id
        self._stored = Snapshot(run_id, stored) if isinstance(stored, Sequence) else stored
        self._out_of_band = frozenset(out_of_band)
        self._max_skip = max_out_of_band_skip
        self._page_size = page_size
        self._end = self._stored.last_seq
        first = min(self._stored.first_seq, self._end + 1)
        self._blind = first - 1  # replayed chunks standing for trimmed ones
        self._cursor = first  # the next stored seq to compare
        self._page: list[tuple[int, Chunk]] = []
        self._page_at = 0
        self._run_of_skips = 0
        self._suppressed = 0
        self._skipped = 0
        self._forwarded = 0
        self._trimmed = self._blind
        self._next_seq = self._end + 1
        self._realigning_from: int | None = None

    @property
    def aligned(self) -> bool:
        """True once every stored chunk was matched or skipped: chunks now pass through."""
        return self._blind == 0 and self._cursor > self._end

    @property
    def next_seq(self) -> int:
        """The seq the next forwarded chunk gets."""
        return self._next_seq

    def feed(self, chunk: Chunk) -> list[tuple[int, Chunk]]:
        """The chunks to append because of ``chunk``: none while still in the stored prefix."""
        if self._blind > 0:
            self._blind -= 1
            return []
        if self.aligned:
            return self._forward(chunk)
        replayed = fingerprint(chunk)
        while self._cursor <= self._end:
            stored_chunk = self._at_cursor()
            if fingerprint(stored_chunk) == replayed:
                self._cursor += 1
                self._run_of_skips = 0
                self._suppressed += 1
                return []
            if chunk_kind(stored_chunk) not in self._out_of_band:
                raise JournalReplayDivergedError(
                    f"journal replay diverged at seq {self._cursor}: stored "
                    f"{_show(fingerprint(stored_chunk))} but replayed {_show(replayed)}",
                    run_id=self.run_id,
                    reason="diverged",
                    index=self._cursor - 1,
                    seq=self._cursor,
                    stored=fingerprint(stored_chunk).decode("utf-8", "replace"),
                    replayed=replayed.decode("utf-8", "replace"),
                )
            self._skip_out_of_band(stored_chunk)
        return self._forward(chunk)

    def realign(self, first_seq: int, stored_end: int, stored: StoredChunks | None = None) -> None:
        """The log holds seqs up to ``stored_end``, past what this aligner forwarded
        from ``first_seq`` on (a rebuild from Postgres wrote them): take back the
        forwards from ``first_seq`` and compare them again, up to the new end, read
        from ``stored`` (the log as it is now) when given.

        A realignment from ``first_seq`` that broke off (the log lost again under its
        read) may be started over from the same seq, against the log as it is then."""
        resumed = not self.aligned and self._realigning_from == first_seq
        if (
            not (self.aligned or resumed)
            or not first_seq <= self._next_seq
            or stored_end < first_seq
        ):
            raise AlignmentError(
                f"cannot realign at seq {first_seq} up to {stored_end}",
                run_id=self.run_id,
                reason="realign",
                seq=first_seq,
            )
        if stored is not None:
            self._stored = stored
        if not resumed:
            self._forwarded -= self._next_seq - first_seq
        self._realigning_from = first_seq
        self._cursor = first_seq
        self._end = stored_end
        self._next_seq = stored_end + 1
        self._page = []

    def finish(self) -> AlignmentSummary:
        """End of the replay: every stored chunk left must be skippable out-of-band."""
        if self._blind > 0 or self._cursor <= self._end:
            start = self._cursor - self._blind
            remaining = self._end - start + 1
            while self._blind == 0 and self._cursor <= self._end:
                stored_chunk = self._at_cursor()
                if chunk_kind(stored_chunk) not in self._out_of_band:
                    break
                self._skip_out_of_band(stored_chunk)
            if self._blind > 0 or self._cursor <= self._end:
                raise JournalReplayShortError(
                    f"journal replay is shorter than the stored log: {remaining} stored "
                    f"chunk(s) from seq {start} were not reproduced",
                    run_id=self.run_id,
                    reason="short",
                    index=start - 1,
                    remaining=remaining,
                )
        summary = AlignmentSummary(
            self._suppressed, self._skipped, self._forwarded, trimmed=self._trimmed
        )
        logger.info(
            "takeover.aligned",
            run_id=self.run_id,
            suppressed=summary.suppressed,
            skipped=summary.skipped,
            forwarded=summary.forwarded,
            trimmed=summary.trimmed,
        )
        return summary

    def _at_cursor(self) -> Chunk:
        offset = self._cursor - self._page_at
        if not self._page or not 0 <= offset < len(self._page):
            page = list(self._stored.page(self._cursor - 1, self._page_size))
            if not page or page[0][0] != self._cursor:
                raise AlignmentError(
                    f"the stored log lost seq {self._cursor} during the alignment",
                    run_id=self.run_id,
                    reason="incomplete-snapshot",
                    seq=self._cursor,
                )
            self._page, self._page_at, offset = page, self._cursor, 0
        return self._page[offset][1]

    def _skip_out_of_band(self, stored_chunk: Chunk) -> None:
        if self._run_of_skips >= self._max_skip:
            raise JournalReplayDivergedError(
                f"more than {self._max_skip} out-of-band chunks in a row at seq "
                f"{self._cursor} were not reproduced by the replay",
                run_id=self.run_id,
                reason="too-many-out-of-band",
                index=self._cursor - 1,
                seq=self._cursor,
                stored=fingerprint(stored_chunk).decode("utf-8", "replace"),
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
