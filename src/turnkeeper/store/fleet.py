"""The fleet page's reads: worker processes and the runs they own, and the fleet's
activity minute by minute, each one statement on the database clock."""

from __future__ import annotations

from turnkeeper.errors import InvalidInputError
from turnkeeper.store import sql
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import (
    FleetMinute,
    LatencyHistogram,
    Sweep,
    WorkerSlot,
    check_id,
    check_limit,
    check_seconds,
)

MAX_MINUTES = 1440
"""The longest window the activity reads cover: a day, minute by minute."""
LATENCY_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""The takeover latency histogram's bucket bounds, in seconds."""


def check_minutes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MINUTES:
        raise InvalidInputError(
            f"minutes must be an integer from 1 to {MAX_MINUTES}, got {value!r}",
            reason="invalid-minutes",
        )
    return value


class FleetMixin(StoreBase):
    """What the fleet page shows of the store."""

    def worker_slots(
        self, dead_after: float, beat_every: float, shown_for: float, limit: int = 1000
    ) -> list[WorkerSlot]:
        """Worker processes seen within ``shown_for`` seconds, by host and Celery worker,
        each with the running runs it owns. Alive: seen within ``dead_after``, and either
        beating (one beat every ``beat_every`` seconds) or connected to the database; a
        process killed a moment ago is not counted as a slot that can take a run."""
        params = {
            "dead_after": check_seconds(dead_after, "dead_after"),
            "beat_every": check_seconds(beat_every, "beat_every"),
            "shown_for": check_seconds(shown_for, "shown_for"),
            "limit": check_limit(limit),
        }
        rows = self._db.rows("worker_slots", sql.fleet_page.FLEET_WORKERS, params)
        return [WorkerSlot.from_row(r) for r in rows]

    def awaiting_adoption(self, limit: int = 1000) -> list[tuple[str, int, float]]:
        """Runs handed over and not adopted yet: (run_id, epoch, seconds waited), the
        longest waiting first."""
        rows = self._db.rows(
            "awaiting_adoption", sql.fleet_page.AWAITING_ADOPTION, {"limit": check_limit(limit)}
        )
        return [(r["run_id"], r["epoch"], r["waiting_seconds"]) for r in rows]

    def fleet_activity(self, minutes: int) -> list[FleetMinute]:
        """The last ``minutes`` minutes (this one included), one each, oldest first."""
        params = {"minutes": check_minutes(minutes)}
        return [
            FleetMinute.from_row(r)
            for r in self._db.rows("fleet_activity", sql.fleet_page.FLEET_ACTIVITY, params)
        ]

    def takeover_latency(self, minutes: int) -> LatencyHistogram:
        """The pauses of the takeovers adopted in the last ``minutes`` minutes, each the
        one the run page shows (``LatencyHistogram``)."""
        params = {"minutes": check_minutes(minutes), "bounds": list(LATENCY_BOUNDS)}
        row = self._db.one("takeover_latency", sql.fleet_page.TAKEOVER_LATENCY, params)
        assert row is not None  # noqa: S101 - a SELECT of aggregates always returns a row
        buckets = {int(k): int(v) for k, v in row["buckets"].items()}
        return LatencyHistogram(
            bounds=LATENCY_BOUNDS,
            counts=tuple(buckets.get(i, 0) for i in range(len(LATENCY_BOUNDS) + 1)),
            count=int(row["count"]),
            p50=row["p50"],
            p95=row["p95"],
            max=row["max"],
        )

    def record_sweep(self, name: str) -> None:
        """One of beat's periodic sweeps (``reconcile``, ``reap``, ``prune``) finished now:
        an operator can tell when beat last swept, and see it overdue once beat stops."""
        self._db.one("record_sweep", sql.sweeps.RECORD_SWEEP, {"name": check_id(name, "name")})

    def sweeps(self) -> list[Sweep]:
        """When each sweep last finished, by name; a sweep that never ran is absent."""
        return [Sweep.from_row(r) for r in self._db.rows("sweeps", sql.sweeps.SWEEPS, {})]
