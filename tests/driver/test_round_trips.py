"""What one short run costs the database: every statement its worker task sends, named.

A real worker drives one scripted run (a turn with a tool call, then a last turn) on
a fresh database; its task logs the statements it sent (``store.database.tally``, at
debug), and the test compares the whole list. The lease heartbeat and the owner lock
live on threads of their own and are not the task's (docs/architecture.md, "Store
round trips").

The one thing timing decides is how many pieces the agent's output arrives in: each
piece is one segment, stored in one statement before its chunks are shown. The test
counts them in the store, and holds the rest of the list exact around them.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.driver.fleet import Fleet
from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.queues import RUN_TURN
from turnkeeper.store.records import RunStatus

AGENT = {"preset": "scripted", "turns": 1, "pace": 0.0, "seed": 5}

BEFORE_OUTPUT = [
    "get_run",  # hosts.run_host: whose queue the run belongs on
    "claim_and_begin",  # the claim, the run as claimed, its input, turn 0 begun
    "get_run",  # the run log's first fence: the log made at Postgres's epoch
    "record_sandbox",  # the placement: the sandbox and the journal, before the spawn
    "renew_lease",  # the store asked, right before the spawn, whether the run is ours
    "update_turn_phase",  # provider_started, after the spawn
]
PER_TURN = [
    # The turn's entries, committed, the next turn begun and started; its tool request
    # went with the segment after it, or with this when no byte came in between.
    "commit_turn",
]
AFTER_OUTPUT = [
    "append_segment",  # the sentinel, and the journal marked consumed
    "commit_turn",  # the last turn's entries, committed
    "settle_run",
    "next_in_session",  # tasks.start_next_in_session
]
GOAL = 12
"""At most this many statements for a short run whose output arrives in one piece."""


def _segments_of(settings: Settings, run_id: str) -> int:
    with psycopg.connect(plain_postgres_url(settings.require_database_url())) as conn:
        row = conn.execute("SELECT count(*) FROM segments WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_short_run_costs_few_statements(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", log_level="DEBUG", lease_ttl=600.0)
    try:
        fleet.start_worker()
        fleet.wait_ready()
        run = fleet.client.submit(AGENT, "count my statements")
        assert fleet.wait_settled(run.run_id).status is RunStatus.COMPLETED
        (tally,) = fleet.wait_events("store.statements", run_id=run.run_id)
        pieces = _segments_of(settings, run.run_id) - 1  # all but the sentinel's
    finally:
        fleet.stop()
    statements = tally["statements"]
    print(f"{tally['count']} statements, output in {pieces} piece(s):", *statements, sep="\n  ")
    assert tally["task"] == RUN_TURN
    assert tally["count"] == len(statements)
    head, tail = len(BEFORE_OUTPUT), len(AFTER_OUTPUT)
    assert statements[:head] == BEFORE_OUTPUT
    assert statements[-tail:] == AFTER_OUTPUT
    # Between them, in an order the pieces decide: a segment first (bytes before their
    # chunks, and before what those chunks decide), then the turn's writes in order.
    during = statements[head:-tail]
    assert during[0] == "append_segment"
    assert during.count("append_segment") == pieces
    assert [s for s in during if s != "append_segment"] == PER_TURN
    assert len(statements) == len(BEFORE_OUTPUT) + pieces + len(PER_TURN) + len(AFTER_OUTPUT)
    assert len(statements) - (pieces - 1) <= GOAL
