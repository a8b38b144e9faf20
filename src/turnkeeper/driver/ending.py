"""How a settled run's log ends: one way, whoever ends it.

A run is settled first, in the store (the first terminal status wins), and its log
ended after: by its owner (a cancel, a deadline, a failure), by the successor that
finds a cancel at its takeover, by the reconciler (a run out of attempts, or cancelled
or past its deadline with nobody driving it), by a client's cancel of a run nobody
drives, by the reaper (a log a crash left open). The ender may not be the attempt
that wrote the log, and the log may hold less than the store: an owner killed after
its segment committed and before its append, or after it stored the exit sentinel and
before it appended the closing chunks. Appending only the final chunk at the log's
next seq would then put it where a rebuild from Postgres has output, and a client that
resumes after it would read a second ending from the rebuilt log.

So every ender does the same (docs/architecture.md, "How a log ends"): it aligns the
log Postgres defines for the settled run (``replay.stored_chunks``: its output, its
interruption marks and closing chunks, then the final chunk its status and error call
for) against the live log, appends what the live log lacks, and closes it. The ended
log is the one a rebuild makes, element by element.

Enders may meet: two sweeps of the reaper, an owner and a cancel. An append refused
because another ender's chunks now hold its seqs, or because the log was closed, is
looked at again: a log someone else ended is done, and so is one whose ending an ender
at a higher epoch took over (the fence it raised refuses this one's writes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkeeper.chunks import Chunk, fingerprint
from turnkeeper.driver import lifecycle
from turnkeeper.driver.output import StoredLogPages
from turnkeeper.driver.replay import stored_chunks
from turnkeeper.errors import (
    AlignmentError,
    DriverError,
    JournalReplayDivergedError,
    LogClosedError,
    LogFencedError,
    LogNotFencedError,
    LogUnavailableError,
    SequenceConflictError,
)
from turnkeeper.log.alignment import Aligner
from turnkeeper.logconfig import get_logger

if TYPE_CHECKING:
    from turnkeeper.log import RunLog
    from turnkeeper.store.records import Run
    from turnkeeper.store.store import Store

log = get_logger(__name__)

_END_TRIES = 8
_APPEND_PAGE = 1_000


def end_log(run_log: RunLog, store: Store, run_id: str, epoch: int) -> None:
    """End the log of the settled run ``run_id``, writing at ``epoch``: what the store
    holds and the log lacks, then the final chunk, and close it.

    A log closed meanwhile is done (the first ending wins, and every ender ends it
    alike); a log fenced above ``epoch`` is left to the ender that fenced it. A log lost
    between the look and the write comes back from Postgres, settled and so closed.
    """
    run = store.get_run(run_id)
    if run is None or not run.status.is_terminal:
        raise DriverError(
            "only a settled run's log is ended", run_id=run_id, epoch=epoch, reason="unsettled"
        )
    for _ in range(_END_TRIES):
        if run_log.state(run_id).closed:
            return
        try:
            missing = _missing(run_log, store, run)
            for start in range(0, len(missing), _APPEND_PAGE):
                page = missing[start : start + _APPEND_PAGE]
                run_log.append(run_id, epoch, page[0][0], [chunk for _, chunk in page])
            run_log.close(run_id, epoch)
        except (LogClosedError, SequenceConflictError) as exc:
            # Another ender appended or closed first: look again at what it left.
            log.info("log.end_raced", run_id=run_id, epoch=epoch, error=str(exc))
            continue
        except AlignmentError as exc:  # the log moved under the read (not a divergence)
            log.info("log.end_raced", run_id=run_id, epoch=epoch, error=str(exc))
            continue
        except LogFencedError:
            log.info("log.end_left", run_id=run_id, epoch=epoch)
            return
        except LogNotFencedError:
            # Rebuilt from Postgres at the run's own epoch, below the one this ender
            # fenced it at: closed if it was settled by then, else fenced again.
            if not run_log.state(run_id).closed:
                run_log.fence(run_id, epoch)
            continue
        log.info(
            "log.ended",
            run_id=run_id,
            epoch=epoch,
            appended=len(missing),
            final=missing[-1][1]["type"] if missing else None,
        )
        return
    raise LogUnavailableError(
        "the log kept moving while it was ended",
        run_id=run_id,
        epoch=epoch,
        reason="log-unsteady",
    )


def end_unowned_log(run_log: RunLog, store: Store, run: Run) -> None:
    """End the log of a run settled with nobody driving it (the reconciler, a cancel, the
    reaper), fenced at the epoch above the run's first: whatever its last owner might
    still try to append is refused. A log someone else ended stays as they ended it."""
    epoch = run.epoch + 1
    try:
        run_log.fence(run.run_id, epoch)
        end_log(run_log, store, run.run_id, epoch)
    except (LogClosedError, LogFencedError):
        pass


def _missing(run_log: RunLog, store: Store, run: Run) -> list[tuple[int, Chunk]]:
    """What the log lacks of the settled run's stored log, with the seqs it goes at."""
    live = StoredLogPages(run_log, run.run_id)
    aligner = Aligner(run.run_id, live)
    missing: list[tuple[int, Chunk]] = []
    try:
        for chunk in stored_chunks(store, run):
            missing.extend(aligner.feed(chunk))
    except JournalReplayDivergedError as exc:
        # The log is not what Postgres makes of the run: a run that failed for exactly
        # that (a replay that diverged). What it shows stays; its final chunk follows.
        log.warning("log.end_diverged", run_id=run.run_id, error=str(exc))
        return _final_after(run_log, run, live.last_seq)
    if not aligner.aligned:  # the log holds more than the store makes of the run
        log.warning("log.end_diverged", run_id=run.run_id, reason="short")
        return _final_after(run_log, run, live.last_seq)
    return missing


def _final_after(run_log: RunLog, run: Run, last_seq: int) -> list[tuple[int, Chunk]]:
    """The run's final chunk after ``last_seq``, unless the log ends with it already."""
    final = lifecycle.final_chunk(run)
    tail = run_log.snapshot(run.run_id, after_seq=max(0, last_seq - 1))
    if tail and fingerprint(tail[-1][1]) == fingerprint(final):
        return []
    return [(last_seq + 1, final)]
