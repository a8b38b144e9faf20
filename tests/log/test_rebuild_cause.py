"""Why a missing log was written back (``log.origin.rebuild_cause``): only a log Redis
dropped is ``lost``; a log first made, or a closed one past its retention, is not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from turnkeeper.log.origin import LogOrigin, RebuildCause, rebuild_cause

DAY = timedelta(days=1)
NOW = datetime.now(UTC)


@pytest.mark.parametrize(
    ("origin", "cause"),
    [
        (LogOrigin(epoch=1, closed=False, chunks=(), holds_output=False), "first"),
        (LogOrigin(epoch=2, closed=True, chunks=(), holds_output=False, settled_at=NOW), "first"),
        (LogOrigin(epoch=1, closed=False, chunks=()), "lost"),
        (LogOrigin(epoch=3, closed=True, chunks=(), settled_at=NOW - DAY / 2), "lost"),
        (LogOrigin(epoch=3, closed=True, chunks=(), settled_at=NOW - DAY * 2), "expired"),
        (LogOrigin(epoch=3, closed=True, chunks=(), settled_at=None), "lost"),
    ],
    ids=["claimed", "settled-unstarted", "running", "closed-recently", "past-retention", "no-time"],
)
def test_the_cause_of_a_rebuild(origin: LogOrigin, cause: RebuildCause) -> None:
    assert rebuild_cause(origin, DAY, found_by="fence") == cause


def test_a_closed_log_read_missing_was_lost_even_if_its_run_never_started() -> None:
    """A cancel while queued made it (``first``); a read that finds it missing within
    its retention finds a log Redis dropped."""
    cancelled = LogOrigin(epoch=1, closed=True, chunks=(), holds_output=False, settled_at=NOW)
    assert rebuild_cause(cancelled, DAY, found_by="read") == "lost"
    assert rebuild_cause(cancelled, DAY, found_by="fence") == "first"
    open_unstarted = LogOrigin(epoch=1, closed=False, chunks=(), holds_output=False)
    assert rebuild_cause(open_unstarted, DAY, found_by="read") == "first"  # claim, no fence yet
