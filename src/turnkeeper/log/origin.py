"""Where a lost log comes back from: Postgres is the truth, the Redis log its cache.

The log layer knows nothing of the store. A ``LogSource`` (``driver.replay.StoredLog``
in the fleet) answers, for one run, what its log holds according to Postgres; the
run log (``RunLog.ensure``) writes that back when Redis lost the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from turnkeeper.chunks import Chunk


@dataclass(frozen=True, slots=True)
class LogOrigin:
    """A run's log as Postgres holds it: the epoch that fences it, whether the run is
    settled (the log is then closed after its final chunk), and its chunks from seq 1,
    read lazily (a long log is never held whole). ``holds_output``: whether an agent
    process was ever started for the run; until then its log holds only what its
    record says (its first chunk, its final one). ``settled_at``: when the run settled,
    which tells a closed log that expired after its retention from one Redis lost."""

    epoch: int
    closed: bool
    chunks: Iterable[Chunk]
    holds_output: bool = True
    settled_at: datetime | None = None


RebuildCause = Literal["first", "expired", "lost"]


def rebuild_cause(origin: LogOrigin, retention: timedelta, found_by: str = "read") -> RebuildCause:
    """Why a log missing from Redis was written back from Postgres.

    ``first``: no agent process was started for the run, so its log holds only chunks
    its record makes, and a writer (``found_by`` a fence, an append, a close) is making
    it: a run's first claim, the settling of a run that never started (a cancel while
    queued). Read missing once such a run settled, its closed log was lost all the same.
    ``expired``: a settled run's closed log read again after its retention removed it,
    as designed. ``lost``: Redis dropped a log it should still hold (a flush, a
    restart without persistence, an eviction, a failover): worth an operator's look.
    """
    settled = origin.settled_at
    if origin.closed and settled is not None and datetime.now(UTC) - settled >= retention:
        return "expired"
    if not origin.holds_output and not (origin.closed and found_by == "read"):
        return "first"
    return "lost"


class LogSource(Protocol):
    def origin(self, run_id: str) -> LogOrigin | None:
        """The run's log, or None when the run has none yet (queued, or unknown).

        Raises LogGoneError (``reason="pruned"``) for a run that had a log that can no
        longer be rebuilt: its segments were pruned.
        """
        ...
