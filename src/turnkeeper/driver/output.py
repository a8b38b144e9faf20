"""Where a run's output goes: journal bytes to Postgres segments, chunks to the run log.

Two rules hold every write here:

- the segments are written before the chunks derived from them are appended, so the
  log never shows a client anything the segments could not reproduce after the
  sandbox is lost;
- every chunk passes through an aligner over the stored log as it was when this
  attempt began (empty for a fresh run), read in pages as the replay reaches them, so
  a successor's replay is suppressed where it matches and appended only past the
  stored end. When a rebuild of a lost log from Postgres put chunks past that end (the
  segments already held their bytes), an append is refused for its seq and the batch
  is aligned again against them (``Aligner.realign``): never appended twice.

A refused write (a stale attempt in Postgres, a higher epoch in Redis) means the run
was taken away: ``Ownership`` raises ``OwnershipLostError``, and nothing more is written.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from turnkeeper.chunks import Chunk, fingerprint
from turnkeeper.driver.ownership import Ownership
from turnkeeper.errors import (
    LogClosedError,
    LogFencedError,
    LogUnavailableError,
    SequenceConflictError,
)
from turnkeeper.log import RunLog
from turnkeeper.log.alignment import Aligner
from turnkeeper.log.runlog import REFUSED_APPENDS
from turnkeeper.logconfig import get_logger
from turnkeeper.store.records import Claim
from turnkeeper.store.store import Store
from turnkeeper.store.turns import ToolRequest

log = get_logger(__name__)

_PAGE_TRIES = 50
_PAGE_RETRY_WAIT = 0.01
_REALIGN_TRIES = 8
_LOST_UNDER_READ = "lost-under-read"


class StoredLogPages:
    """The stored log an aligner walks, as it was when the attempt began, in pages.

    A page that comes back short of the known end means the log was lost under the
    read: reading its state rebuilds it (with the same seqs), and the page is read again.
    A log still lost after ``_PAGE_TRIES`` looks is a service failure
    (``LogUnavailableError``, reason ``lost-under-read``), never a short log: Redis keeps
    losing it, which says nothing about the run.
    """

    def __init__(self, run_log: RunLog, run_id: str) -> None:
        self.run_log = run_log
        self.run_id = run_id
        state = run_log.state(run_id)
        self._first = state.first_seq
        self._last = state.last_seq

    @property
    def first_seq(self) -> int:
        return self._first

    @property
    def last_seq(self) -> int:
        return self._last

    def page(self, after_seq: int, count: int) -> Sequence[tuple[int, Chunk]]:
        chunks = self.run_log.page(self.run_id, after_seq, count)
        # Lost again between the rebuild and the read (or being rebuilt by another
        # reader, not yet this far): look again. The aligner refuses a page that
        # still does not start where it must.
        for _ in range(_PAGE_TRIES):
            if chunks or after_seq >= self._last:
                break
            time.sleep(_PAGE_RETRY_WAIT)
            self.run_log.state(self.run_id)
            chunks = self.run_log.page(self.run_id, after_seq, count)
        if not chunks and after_seq < self._last:
            raise LogUnavailableError(
                f"the log kept being lost while seq {after_seq + 1} was read back",
                run_id=self.run_id,
                reason=_LOST_UNDER_READ,
                seq=after_seq + 1,
            )
        return chunks


class RunOutput:
    def __init__(
        self,
        store: Store,
        run_log: RunLog,
        claim: Claim,
        ownership: Ownership,
        snapshot: Sequence[tuple[int, Chunk]] | None = None,
        *,
        first_attempt: bool = False,
    ) -> None:
        """``snapshot``: the stored log, when given whole; by default it is read in pages.
        ``first_attempt``: the run's first (a fresh claim), so no journal of it has stored
        bytes but those this attempt stores: none is read."""
        self.store = store
        self.run_log = run_log
        self.claim = claim
        self.ownership = ownership
        stored = snapshot if snapshot is not None else StoredLogPages(run_log, claim.run_id)
        self.aligner = Aligner(claim.run_id, stored)
        self.appended = 0
        self._stored_ends: dict[str, int] = {}
        self._first_attempt = first_attempt
        self._log = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)

    # --- journal bytes --------------------------------------------------------------

    def stored_end(self, journal_key: str) -> int:
        """Where the journal's stored segments end (read once, then tracked)."""
        if journal_key not in self._stored_ends:
            if self._first_attempt:
                return 0
            last = self.store.last_segment(journal_key)
            self._stored_ends[journal_key] = last.byte_end if last else 0
        return self._stored_ends[journal_key]

    def write_bytes(
        self,
        journal_key: str,
        start: int,
        data: bytes,
        *,
        mark_consumed: bool = False,
        tool_request: ToolRequest | None = None,
    ) -> bool:
        """Store journal bytes ``[start, start + len)``; bytes already stored are skipped.
        True when this call stored them, and so with ``mark_consumed`` (the journal's
        last bytes) marked the journal consumed too, or recorded ``tool_request``
        (``Store.append_segment``)."""
        end = start + len(data)
        stored = self.stored_end(journal_key)
        if end <= stored:
            return False
        if start < stored:
            data, start = data[stored - start :], stored
        self.ownership.check()
        # Refused for its state: a retry whose reply was lost stored these very bytes.
        made = self.ownership.confirm(
            self.store.append_segment(
                self.claim,
                journal_key,
                start,
                data,
                mark_consumed=mark_consumed,
                tool_request=tool_request,
            )
        )
        self._stored_ends[journal_key] = end
        return made

    # --- chunks ---------------------------------------------------------------------

    def emit(self, chunks: Sequence[Chunk]) -> None:
        """Align ``chunks`` against the stored log and append what is new, in one call."""
        fresh: list[tuple[int, Chunk]] = []
        for chunk in chunks:
            fresh.extend(self.aligner.feed(chunk))
        # Bounded: each round takes in chunks the log gained past the end this attempt
        # knew, which only a rebuild (or a retry whose reply was lost) puts there.
        for _ in range(8):
            if not fresh:
                return
            self.ownership.check()
            first, batch = fresh[0][0], [chunk for _, chunk in fresh]
            with self._fenced():
                try:
                    self.run_log.append(self.claim.run_id, self.claim.epoch, first, batch)
                except SequenceConflictError as exc:
                    expected = int(exc.fields.get("expected", 0))
                    if expected <= first:
                        raise  # the log is behind this attempt: it lost chunks it showed
                    fresh = self._realigned(first, expected, batch)
                    continue
                except LogClosedError:
                    # A rebuild closed the log of the run this attempt just settled,
                    # after the very chunks it was appending.
                    if not self._ends_with(first, batch):
                        raise
            self.appended += len(fresh)
            return
        # Not the run's failure: the attempt stops as a service error, a successor goes on.
        raise LogUnavailableError(
            "the log kept moving under its owner", run_id=self.claim.run_id, reason="log-unsteady"
        )

    def _realigned(self, first: int, expected: int, batch: list[Chunk]) -> list[tuple[int, Chunk]]:
        """The log already holds seqs ``first..expected - 1``: a rebuild from Postgres
        (or a retried append whose reply was lost) wrote them. Compare the batch with
        them again; what is left of it goes after them.

        A log lost once more while it is read back is read back again, as rebuilt by
        then, from ``first`` (``Aligner.realign`` takes up a realignment it broke off).
        """
        stored_end = expected - 1
        for _ in range(_REALIGN_TRIES):
            stored = StoredLogPages(self.run_log, self.claim.run_id)
            stored_end = max(stored_end, stored.last_seq)
            self._log.info("log.realigned", first_seq=first, stored_end=stored_end)
            self.aligner.realign(first, stored_end, stored)
            fresh: list[tuple[int, Chunk]] = []
            try:
                for chunk in batch:
                    fresh.extend(self.aligner.feed(chunk))
            except LogUnavailableError as lost:
                if lost.reason != _LOST_UNDER_READ:
                    raise
                continue
            return fresh
        raise LogUnavailableError(
            "the log kept being lost while its owner read it back",
            run_id=self.claim.run_id,
            reason=_LOST_UNDER_READ,
            seq=first,
        )

    def _ends_with(self, first: int, batch: list[Chunk]) -> bool:
        """The (closed) log holds exactly ``batch`` at seqs ``first...`` and nothing after."""
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
