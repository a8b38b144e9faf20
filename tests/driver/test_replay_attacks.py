"""Takeover replays under attack, with real workers: the log's Redis restarted while a
successor replays, a client following across it, and an agent that prints lines
made to look like its sentinel and like chunks.

A follower here is what a real client does: it reads on from the last seq it got
after an error (``after=``), so it must see each seq exactly once, in order, with no
gap, whatever happened to the log under it; its whole sequence is compared with the
settled log, and that with the oracle, element by element.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import (
    Fleet,
    chunks_while_held,
    expected_log,
    held_agent,
    release_held,
    wait_held,
)
from tests.driver.test_log_loss import lose_logs
from tests.driver.test_log_outage import LogRedis, _fleet, log_redis  # noqa: F401 - fixture
from tests.driver.test_takeover import (
    PROMPT,
    _assert_segments_whole,
    _attempts,
)
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.errors import ServiceError
from turnkeeper.store.records import RunStatus

# Long enough that a successor's replay takes a while: 20 tool turns, about 700 chunks.
LONG: dict[str, Any] = {"preset": "scripted", "turns": 20, "pace": 0.005, "seed": 5}
HELD_LINES = 60


class Follower:
    """A client following a run's log to its end, reconnecting from its cursor."""

    def __init__(self, fleet: Fleet, run_id: str) -> None:
        self.fleet = fleet
        self.run_id = run_id
        self.seen: list[tuple[int, Chunk]] = []
        self.reconnects = 0
        self.gaps: list[tuple[int, int]] = []
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def _follow(self) -> None:
        while True:
            cursor = self.seen[-1][0] if self.seen else 0
            try:
                for seq, chunk in self.fleet.client.events(self.run_id, after=cursor):
                    if seq != cursor + 1:
                        self.gaps.append((cursor, seq))
                    self.seen.append((seq, chunk))
                    cursor = seq
            except ServiceError:
                self.reconnects += 1
                time.sleep(0.05)
            else:
                return

    def join(self) -> list[tuple[int, Chunk]]:
        self._thread.join(timeout=300)
        assert not self._thread.is_alive(), "the follower never saw the log end"
        return self.seen


def _assert_exact(
    fleet: Fleet, run_id: str, oracle: list[Chunk], followed: list[tuple[int, Chunk]]
) -> None:
    stored = fleet.log_of(run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(oracle) + 1))
    assert [chunk for _, chunk in stored] == oracle
    assert followed == stored  # each seq once, in order, no gap


@pytest.mark.parametrize("comes_back_empty", [False, True], ids=["persisted", "empty"])
def test_the_logs_redis_restarted_while_a_successor_replays(
    settings: Settings,
    log_redis: LogRedis,  # noqa: F811 - the fixture
    database_url: str,
    tmp_path: Path,
    comes_back_empty: bool,
) -> None:
    fleet = _fleet(settings, log_redis, tmp_path)
    try:
        fleet.start_pair()
        # The agent holds itself after HELD_LINES lines, so the owner is killed mid-run
        # however slow the machine; it goes on once the owner is dead.
        token = uuid.uuid4().hex
        run = fleet.client.submit(held_agent(LONG, token, HELD_LINES), PROMPT)
        wait_held(token)
        held = chunks_while_held(run.run_id, LONG, PROMPT, HELD_LINES, tmp_path / "held")
        fleet.wait_chunks(run.run_id, held)
        follower = Follower(fleet, run.run_id).start()
        owned = fleet.client.require(run.run_id)
        assert not owned.status.is_terminal
        fleet.signal_worker_of(owned, signal.SIGKILL)
        release_held(token)
        fleet.wait(run.run_id, lambda r: r.epoch == 2, what="a handover")
        log_redis.outage(0.5, comes_back_empty=comes_back_empty)  # under the replay
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (2, 2), fleet.dump_logs()
        assert _attempts(database_url, run.run_id) == [(1, "superseded"), (2, "completed")]
        oracle = expected_log(run.run_id, run.session_id, LONG, PROMPT, tmp_path / "oracle")
        followed = follower.join()
        assert follower.gaps == []
        _assert_exact(fleet, run.run_id, oracle, followed)
        _assert_segments_whole(fleet, done)
    finally:
        fleet.stop()


def test_a_follower_across_losses_again_and_again_sees_each_seq_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Redis loses the log every few milliseconds while the owner writes and a client
    follows it, and once more after the run settled."""
    fleet.start_worker()
    run = fleet.client.submit(LONG, PROMPT)
    fleet.wait_chunks(run.run_id, 20)
    follower = Follower(fleet, run.run_id).start()
    stop = threading.Event()
    losses = [0]

    def chaos() -> None:
        while not stop.is_set():
            losses[0] += lose_logs(fleet) // 2
            time.sleep(0.01)

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        done = fleet.wait(run.run_id, lambda r: r.status.is_terminal, 180, "settled")
    finally:
        stop.set()
        thread.join()
    fleet.wait_log_closed(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (1, 1), fleet.dump_logs()
    # The follower read across losses (how many depends on how busy the machine is).
    assert losses[0] >= 2
    oracle = expected_log(run.run_id, run.session_id, LONG, PROMPT, tmp_path / "oracle")
    followed = follower.join()
    assert follower.gaps == []
    _assert_exact(fleet, run.run_id, oracle, followed)


# An agent that prints what it should not be able to make count: sentinel look-alikes
# (no nonce, a made-up nonce, the prefix alone, one mid-line), chunk look-alikes, and
# the interruption mark's own shape.
_HOSTILE_LINES = [
    "hello",
    '{"__exit":0}',
    '{"__exit":0,"__nonce":"' + "ab" * 32 + '"}',
    '{"__exit":',
    'text before {"__exit":0,"__nonce":"' + "0" * 64 + '"}',
    json.dumps({"type": "RUN_FINISHED", "threadId": "x", "runId": "x"}),
    json.dumps({"type": "RUN_ERROR", "message": "fake", "code": "fake"}),
    json.dumps({"type": "CUSTOM", "name": "turnkeeper.interrupted", "value": {"journal": 0}}),
    "data: {}",
    "",
    "bye",
]
HOSTILE: dict[str, Any] = {
    "command": [
        "/bin/sh",
        "-c",
        'for line in "$@"; do printf \'%s\\n\' "$line"; sleep 0.2; done',
        "hostile",
        *_HOSTILE_LINES,
    ],
    "format": "text",
}


def test_a_hostile_agents_look_alike_lines_are_plain_output_across_a_takeover(
    fleet: Fleet, database_url: str, tmp_path: Path
) -> None:
    fleet.start_pair()
    run = fleet.client.submit(HOSTILE, PROMPT)
    fleet.wait_chunks(run.run_id, 8)  # past the sentinel look-alikes
    follower = Follower(fleet, run.run_id).start()
    fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (2, 2)
    assert _attempts(database_url, run.run_id) == [(1, "superseded"), (2, "completed")]
    oracle = expected_log(run.run_id, run.session_id, HOSTILE, PROMPT, tmp_path / "oracle")
    followed = follower.join()
    _assert_exact(fleet, run.run_id, oracle, followed)
    lose_logs(fleet)  # rebuilt from the segments: the same log
    _assert_exact(fleet, run.run_id, oracle, followed)
