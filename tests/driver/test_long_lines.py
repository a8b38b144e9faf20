"""A line over TURNKEEPER_MAX_LINE_BYTES streams through real workers in pieces.

The agent is a real process printing a 5 MiB line; the cap is 1 MiB. The whole log is
compared element by element with the chunks the cut rule defines (docs/architecture.md,
"Long lines"), live, and after the worker is SIGKILLed while the agent is in the middle
of the line: the successor replays the journal from byte 0, cuts it at the same byte
offsets (the cap recorded with the journal, whatever the successor's own setting), and
the aligner finds exactly what clients already saw.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.driver.fleet import Fleet
from tests.driver.test_log_loss import lose_logs
from turnkeeper.chunks import Chunk
from turnkeeper.driver.placement import Placement
from turnkeeper.store.records import RunStatus

CAP = 1 << 20
# x...x, then a euro sign across the first piece boundary, y...y, z...z: 5 MiB + 125 bytes.
LONG = b"x" * (CAP - 1) + "\N{EURO SIGN}".encode() + b"y" * (4 * CAP) + b"z" * 123
# Prints a line, then the long line in two halves; before the second half it waits for
# a file named "release" in its workspace, so a test can kill the worker mid-line.
AGENT_CODE = f"""
import os, sys, time
out = sys.stdout.buffer
line = b"x" * ({CAP} - 1) + "\\N{{EURO SIGN}}".encode() + b"y" * (4 * {CAP}) + b"z" * 123
out.write(b"before\\n" + line[: 3 * {CAP} + 17])
out.flush()
while os.environ.get("WAIT") == "1" and not os.path.exists("release"):
    time.sleep(0.05)
out.write(line[3 * {CAP} + 17 :] + b"\\nafter\\n")
out.flush()
"""


def _agent(*, wait: bool) -> dict[str, Any]:
    return {
        "command": [sys.executable, "-c", AGENT_CODE],
        "format": "text",
        "env": {"WAIT": "1" if wait else "0"},
    }


def _expected(run_id: str, session_id: str) -> list[Chunk]:
    """The log the cut rule gives: pieces of 1 MiB of the line, each a content chunk;
    the euro sign cut by the first boundary is carried whole into the second piece."""
    message = f"{run_id}-m0"
    deltas = [
        "before\n",
        "x" * (CAP - 1),
        "\N{EURO SIGN}" + "y" * (CAP - 2),
        "y" * CAP,
        "y" * CAP,
        "y" * CAP,
        "yy" + "z" * 123 + "\n",
        "after\n",
    ]
    return [
        {"type": "RUN_STARTED", "threadId": session_id, "runId": run_id},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": d} for d in deltas),
        {"type": "TEXT_MESSAGE_END", "messageId": message},
        {"type": "RUN_FINISHED", "threadId": session_id, "runId": run_id},
    ]


def _assert_log(fleet: Fleet, run_id: str, session_id: str) -> None:
    stored = fleet.log_of(run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    chunks = [chunk for _, chunk in stored]
    expected = _expected(run_id, session_id)
    # Compared by shape first, so that a failure does not print megabytes.
    shape = [(c["type"], len(c.get("delta", ""))) for c in chunks]
    assert shape == [(c["type"], len(c.get("delta", ""))) for c in expected]
    assert chunks == expected
    assert "".join(c.get("delta", "") for c in chunks).encode() == (
        b"before\n" + LONG + b"\nafter\n"
    )


def _segments(fleet: Fleet, run_id: str) -> list[tuple[int, int]]:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        return [
            (row[0], row[1])
            for row in conn.execute(
                "SELECT byte_start, byte_end FROM segments WHERE run_id = %s ORDER BY byte_start",
                (run_id,),
            )
        ]


def _assert_segments(fleet: Fleet, run_id: str) -> None:
    """Contiguous from byte 0 to the sentinel, and no segment holds the whole line."""
    ranges = _segments(fleet, run_id)
    assert [start for start, _ in ranges] == [0, *(end for _, end in ranges[:-1])]
    assert ranges[-1][1] > len(b"before\n" + LONG + b"\nafter\n")
    assert max(end - start for start, end in ranges) < len(LONG)


def test_a_long_line_streams_in_pieces(fleet: Fleet) -> None:
    fleet.env["TURNKEEPER_MAX_LINE_BYTES"] = str(CAP)
    fleet.start_worker()
    run = fleet.client.submit(_agent(wait=False), "p")
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    _assert_log(fleet, run.run_id, run.session_id)
    _assert_segments(fleet, run.run_id)
    journals = Placement.of(done).journals
    assert [journal.max_line_bytes for journal in journals] == [CAP]
    # A lost log comes back from Postgres cut at the journal's recorded cap.
    assert lose_logs(fleet) > 0
    _assert_log(fleet, run.run_id, run.session_id)


def test_a_takeover_mid_line_replays_the_same_pieces(fleet: Fleet) -> None:
    """The successor's own setting is another cap: the journal's recorded one wins."""
    fleet.env["TURNKEEPER_MAX_LINE_BYTES"] = str(CAP)
    fleet.start_worker()
    fleet.start_beat()
    run = fleet.client.submit(_agent(wait=True), "p")
    # Clients have seen the first three pieces of the line: the agent waits mid-line.
    fleet.wait_chunks(run.run_id, 6)
    owned = fleet.client.require(run.run_id)
    assert [c["type"] for _, c in fleet.log_of(run.run_id)] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        *["TEXT_MESSAGE_CONTENT"] * 4,
    ]
    # The successor, started once the run is owned, so that it only takes it over.
    fleet.env["TURNKEEPER_MAX_LINE_BYTES"] = str(CAP // 16)
    fleet.start_worker()
    fleet.wait_ready()
    fleet.signal_worker_of(owned, signal.SIGKILL)
    placement = Placement.of(owned)
    assert placement.sandbox is not None
    Path(placement.sandbox.workspace, "release").touch()
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (2, 2)
    _assert_log(fleet, run.run_id, run.session_id)
    _assert_segments(fleet, run.run_id)
