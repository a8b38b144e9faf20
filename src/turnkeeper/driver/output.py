"""Where a run's output goes: journal bytes to Postgres segments, chunks to the run log.

Two rules hold every write here:

- the segments are written before the chunks derived from them are appended, so the
  log never shows a client anything the segments could not reproduce after the
  sandbox is lost;
- every chunk passes through an aligner built from one snapshot of the stored log,
  read once when this attempt began (empty for a fresh run), so a successor's replay
  is suppressed where it matches and appended only past the stored end.

A refused write (a stale attempt in Postgres, a higher epoch in Redis) means the run
was taken away: ``Ownership`` raises ``OwnershipLostError``, and nothing more is written.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import structlog

from turnkeeper.chunks import Chunk, fingerprint
from turnkeeper.driver.ownership import Ownership
from turnkeeper.errors import LogFencedError, SequenceConflictError
from turnkeeper.log import RunLog
from turnkeeper.log.alignment import Aligner
from turnkeeper.store.records import Claim
from turnkeeper.store.store import Store

log = structlog.get_logger(__name__)

# Fleet counters (RunLog.count), exported by the web app's /metrics.
LEASE_RENEWALS = "lease_renewals"
REFUSED_APPENDS = "refused_appends"


def end_log(run_log: RunLog, run_id: str, epoch: int, final: Chunk) -> None:
    """Close a log that may be half-written with ``final`` as its last chunk, at ``epoch``.

    For endings outside the replayed output (cancel, a settled-without-owner run, an
    error): the chunk goes at the log's next seq, unless it is already the last one
    (a retry after a crash) or the log is closed (the first ending wins).
    """
    state = run_log.state(run_id)
    if state.closed:
        return
    tail = run_log.snapshot(run_id, after_seq=max(0, state.next_seq - 2))
    if not tail or tail[-1][1] != final:
        run_log.append(run_id, epoch, state.next_seq, [final])
    run_log.close(run_id, epoch)


class RunOutput:
    def __init__(
        self,
        store: Store,
        run_log: RunLog,
        claim: Claim,
        ownership: Ownership,
        snapshot: Sequence[tuple[int, Chunk]],
    ) -> None:
        self.store = store
        self.run_log = run_log
        self.claim = claim
        self.ownership = ownership
        self.aligner = Aligner(claim.run_id, snapshot)
        self.appended = 0
        self._stored_ends: dict[str, int] = {}
        self._log = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)

    # --- journal bytes --------------------------------------------------------------

    def stored_end(self, journal_key: str) -> int:
        """Where the journal's stored segments end (read once, then tracked)."""
        if journal_key not in self._stored_ends:
            last = self.store.last_segment(journal_key)
            self._stored_ends[journal_key] = last.byte_end if last else 0
        return self._stored_ends[journal_key]

    def write_bytes(self, journal_key: str, start: int, data: bytes) -> None:
        """Store journal bytes ``[start, start + len)``; bytes already stored are skipped."""
        end = start + len(data)
        stored = self.stored_end(journal_key)
        if end <= stored:
            return
        if start < stored:
            data, start = data[stored - start :], stored
        self.ownership.check()
        # Refused for its state: a retry whose reply was lost stored these very bytes.
        self.ownership.confirm(self.store.append_segment(self.claim, journal_key, start, data))
        self._stored_ends[journal_key] = end

    # --- chunks ---------------------------------------------------------------------

    def emit(self, chunks: Sequence[Chunk]) -> None:
        """Align ``chunks`` against the stored log and append what is new, in one call."""
        fresh: list[tuple[int, Chunk]] = []
        for chunk in chunks:
            fresh.extend(self.aligner.feed(chunk))
        if not fresh:
            return
        self.ownership.check()
        first, batch = fresh[0][0], [chunk for _, chunk in fresh]
        with self._fenced():
            try:
                self.run_log.append(self.claim.run_id, self.claim.epoch, first, batch)
            except SequenceConflictError as exc:
                if not self._already_appended(first, batch, exc):
                    raise
        self.appended += len(fresh)

    def _already_appended(
        self, first: int, batch: list[Chunk], conflict: SequenceConflictError
    ) -> bool:
        """A retried append whose first try landed (its reply was lost): the log holds
        exactly this batch at exactly these seqs."""
        if conflict.fields.get("expected") != first + len(batch):
            return False
        stored = self.run_log.snapshot(self.claim.run_id, after_seq=first - 1)
        return [fingerprint(chunk) for _, chunk in stored] == [fingerprint(c) for c in batch]

    def check_aligned(self) -> None:
        """At the end of the output: the replay must have reproduced every stored chunk."""
        self.aligner.finish()

    def close(self) -> None:
        """Close the log for good (after ``check_aligned`` and the final chunk)."""
        self.ownership.check()
        with self._fenced():
            self.run_log.close(self.claim.run_id, self.claim.epoch)

    @contextmanager
    def _fenced(self) -> Iterator[None]:
        """A log write refused for its epoch: the run belongs to a later attempt now."""
        try:
            yield
        except LogFencedError as exc:
            self.run_log.count(REFUSED_APPENDS)
            self.ownership.lose("log-fenced", exc)
