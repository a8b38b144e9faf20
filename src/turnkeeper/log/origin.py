"""Where a lost log comes back from: Postgres is the truth, the Redis log its cache.

The log layer knows nothing of the store. A ``LogSource`` (``driver.replay.StoredLog``
in the fleet) answers, for one run, what its log holds according to Postgres; the
run log (``RunLog.ensure``) writes that back when Redis lost the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from turnkeeper.chunks import Chunk


@dataclass(frozen=True, slots=True)
class LogOrigin:
    """A run's log as Postgres holds it: the epoch that fences it, whether the run is
    settled (the log is then closed after its final chunk), and its chunks from seq 1,
    read lazily (a long log is never held whole)."""

    epoch: int
    closed: bool
    chunks: Iterable[Chunk]


class LogSource(Protocol):
    def origin(self, run_id: str) -> LogOrigin | None:
        """The run's log, or None when the run has none yet (queued, or unknown).

        Raises LogGoneError (``reason="pruned"``) for a run that had a log that can no
        longer be rebuilt: its segments were pruned.
        """
        ...
