"""A run's chunks from its journal bytes: the one code path of a live drive, of a
takeover's replay and of the rebuild of a log that Redis lost.

The output of a run is a pure function of what Postgres holds: ``RUN_STARTED``;
the fresh-workspace notice when the placement records one; for each agent process
in order its translated lines, followed by its interruption marks when it was given
up; the closing chunks once its journal ended at the exit sentinel; the final chunk
once the run is settled. ``Replay``
mints those chunks, and ``StoredJournal`` reads a journal's lines back from its
segments up to the sentinel, which is never handed out as a line. ``StoredLog`` is
that function read from Postgres alone: what a lost Redis log is rebuilt from.

A line longer than the journal's line cap (``max_line_bytes``, recorded with the
journal in the placement record) reaches the translator in pieces (``LinePiece``),
cut at the same byte offsets live and in a replay; the translator's
``feed_piece`` decides what each becomes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from turnkeeper.agents.formats import translator_for
from turnkeeper.agents.translator import TurnTracker
from turnkeeper.chunks import Chunk
from turnkeeper.driver import lifecycle
from turnkeeper.errors import AgentError, InvalidSentinelError, LogGoneError
from turnkeeper.log.origin import LogOrigin
from turnkeeper.logconfig import get_logger
from turnkeeper.sandbox.journal import SENTINEL_PREFIX, parse_sentinel
from turnkeeper.sandbox.lines import Line, LinePiece, LineSplitter
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.store.store import Store

if TYPE_CHECKING:
    from turnkeeper.driver.placement import Placement

log = get_logger(__name__)

__all__ = [
    "Line",
    "Replay",
    "StoredJournal",
    "StoredLog",
    "batches",
    "stored_exit",
    "with_newlines",
]

_SEGMENT_PAGE = 256
_SEGMENT_PAGE_BYTES = 8 << 20
_REPLAY_BATCH = 512


class Replay:
    """Mints a run's chunks: translated lines, interruption marks, the closing chunks."""

    def __init__(self, run_id: str, session_id: str, output_format: str) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.translator = translator_for(output_format, run_id)
        self.tracker = TurnTracker()

    def started(self) -> list[Chunk]:
        return self._observed([lifecycle.run_started(self.run_id, self.session_id)])

    def fresh_workspace(self, reason: str) -> list[Chunk]:
        """Right after ``RUN_STARTED``, once the placement recorded that the run did not
        find its session's workspace."""
        return self._observed([lifecycle.fresh_workspace(reason)])

    def lines(self, lines: Iterable[bytes]) -> list[Chunk]:
        """Chunks of journal lines, each given as the journal holds it (with its
        newline; a ``LinePiece`` with the newline only when it ends its line)."""
        chunks: list[Chunk] = []
        translator = self.translator
        for line in lines:
            if isinstance(line, LinePiece):
                chunks.extend(translator.feed_piece(line, final=line.final))
            else:
                chunks.extend(translator.feed(line))
        return self._observed(chunks)

    def interrupted(self, journal_index: int) -> list[Chunk]:
        """Where a given-up agent process's output ends: what it left open is closed,
        the interruption is marked, and its unanswered tool calls get an answer."""
        marks = self.translator.finish()
        marks.append(lifecycle.interrupted(journal_index))
        self._observed(marks)
        unanswered = [lifecycle.outcome_unknown(call) for call in sorted(self.tracker.pending)]
        return marks + self._observed(unanswered)

    def closing(self) -> list[Chunk]:
        """What the agent left open when its journal ended at the sentinel."""
        return self._observed(self.translator.finish())

    @property
    def agent_session_id(self) -> str | None:
        """The agent's own conversation id, for a continuation, once it said it."""
        return self.translator.session_id

    @property
    def agent_failure(self) -> str | None:
        return self.translator.failure

    @property
    def turns_completed(self) -> int:
        return self.tracker.turns_completed

    def _observed(self, chunks: list[Chunk]) -> list[Chunk]:
        for chunk in chunks:
            self.tracker.observe(chunk)
        return chunks


def batches(lines: Iterable[Line], size: int) -> Iterator[list[Line]]:
    """``lines`` in lists of at most ``size``, so a long journal is never held whole."""
    source = iter(lines)
    while batch := list(islice(source, size)):
        yield batch


def with_newlines(lines: Iterable[Line]) -> list[bytes]:
    """Lines as the journal (and so the segments and the text translator) holds them:
    a piece of a cut line gets the newline only when it is the line's last."""
    return [
        line.journal_bytes() if isinstance(line, LinePiece) else line + b"\n" for line, _ in lines
    ]


def sentinel_exit(line: bytes, nonce: str) -> int | None:
    """The exit code when ``line`` (without newline) is this journal's sentinel."""
    if not line.startswith(SENTINEL_PREFIX):
        return None
    return parse_sentinel(line, nonce)


class StoredJournal:
    """A journal's lines as its segments hold them, read in pages, up to its sentinel.

    Iterate once; afterwards ``exit_code`` and ``end`` describe the sentinel when
    the stored bytes end with one (the agent exited and every byte is stored).
    """

    def __init__(
        self, store: Store, journal_key: str, nonce: str, *, max_line_bytes: int | None = None
    ) -> None:
        self.store = store
        self.journal_key = journal_key
        self.nonce = nonce
        self.max_line_bytes = max_line_bytes
        self.exit_code: int | None = None
        self.end: int | None = None

    def __iter__(self) -> Iterator[Line]:
        splitter = LineSplitter(0, max_line_bytes=self.max_line_bytes)
        from_byte = 0
        while True:
            page = self.store.segments(
                self.journal_key, from_byte, limit=_SEGMENT_PAGE, max_bytes=_SEGMENT_PAGE_BYTES
            )
            for segment in page:
                for line, end in splitter.split(segment.body):
                    if not isinstance(line, LinePiece):
                        code = sentinel_exit(line, self.nonce)
                        if code is not None:
                            self.exit_code, self.end = code, end
                            return
                    yield line, end
            # A page may be short for its bytes: only an empty one is the end.
            if not page:
                return
            from_byte = page[-1].byte_end


def stored_exit(store: Store, journal_key: str, nonce: str) -> int | None:
    """The exit code when a journal's stored bytes end with its sentinel, else None."""
    last = store.last_segment(journal_key)
    if last is None:
        return None
    line = last.body.rstrip(b"\n").rpartition(b"\n")[2]
    try:
        return sentinel_exit(line, nonce)
    except InvalidSentinelError:
        return None  # a forged sentinel: the replay refuses it where it stands


def stored_chunks(store: Store, run: Run) -> Iterator[Chunk]:
    """The run's log as Postgres holds it, from seq 1, read in pages: ``RUN_STARTED``,
    each agent process's lines (with its interruption marks once it was given up, or
    its closing chunks once its journal ended at the sentinel), the final chunk once
    the run is settled. The sentinel is never a chunk."""
    if run.epoch == 0:  # settled before any attempt (a queued run cancelled)
        if run.status.is_terminal:
            yield lifecycle.final_chunk(run)
        return
    # Loaded here, not with this module: the client rebuilds the log of a queued run it
    # cancelled without either (bench/cli_start.py); a worker has both loaded.
    from turnkeeper.agents.spec import AgentSpec  # noqa: PLC0415
    from turnkeeper.driver.placement import nonce_of, process_index  # noqa: PLC0415

    payload = run.payload if isinstance(run.payload, dict) else {}
    try:
        spec = AgentSpec.from_payload(payload.get("agent", "scripted"))
    except AgentError:  # the run failed on its spec before anything was appended
        if run.status.is_terminal:
            yield lifecycle.final_chunk(run)
        return
    replay = Replay(run.run_id, run.session_id, spec.format)
    yield from replay.started()
    placement = _placement(run)
    if placement.fresh_workspace is not None:
        yield from replay.fresh_workspace(placement.fresh_workspace)
    journals = placement.journals
    for index, journal in enumerate(journals):
        stored = StoredJournal(
            store, journal.journal_key, nonce_of(journal), max_line_bytes=journal.max_line_bytes
        )
        try:
            for batch in batches(stored, _REPLAY_BATCH):
                yield from replay.lines(with_newlines(batch))
        except InvalidSentinelError:
            # The run failed there (invalid-sentinel); the line is never published.
            log.warning("log.rebuild_stopped_at_invalid_sentinel", run_id=run.run_id)
        if journal.given_up:  # a journal that never started ran nothing: no marks
            yield from replay.interrupted(process_index(journals, index))
        elif stored.exit_code is not None:
            yield from replay.closing()
    if run.status.is_terminal:
        yield lifecycle.final_chunk(run)


class StoredLog:
    """The ``LogSource`` of the fleet: a lost run log comes back from Postgres."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def origin(self, run_id: str) -> LogOrigin | None:
        run = self.store.get_run(run_id)
        if run is None or (run.status is RunStatus.QUEUED and run.epoch == 0):
            return None
        if run.pruned_at is not None:
            raise LogGoneError(
                "the run's log was lost and its stored output was pruned: it cannot be rebuilt",
                run_id=run_id,
                reason="pruned",
            )
        return LogOrigin(
            epoch=max(run.epoch, 1),
            closed=run.status.is_terminal,
            chunks=stored_chunks(self.store, run),
            holds_output=run.epoch > 0 and bool(_placement(run).journals),
            settled_at=run.finished_at if run.status.is_terminal else None,
        )


def _placement(run: Run) -> Placement:
    from turnkeeper.driver.placement import Placement  # noqa: PLC0415 - see stored_chunks

    return Placement.of(run)
