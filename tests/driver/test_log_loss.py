"""Postgres is the truth, Redis its cache: real workers whose run logs Redis loses.

Redis is shared with other tests, so a loss is the deletion of this test's log keys
(``lose_logs``), which is what FLUSHDB, a restart without persistence or a failover
does to them. Every comparison is of whole logs, element by element, from seq 1.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_sandbox_loss import _lose_owner_and_sandbox
from tests.driver.test_takeover import (
    AGENT,
    PROMPT,
    _assert_log_is_oracle,
    _assert_segments_whole,
    _assert_transcript_once,
    _attempts,
    _oracle,
)
from turnkeeper.chunks import Chunk
from turnkeeper.driver.placement import Placement
from turnkeeper.log import RunLog
from turnkeeper.store.records import RunStatus
from turnkeeper.workers.failpoints import marker


def lose_logs(fleet: Fleet) -> int:
    """Drop every run log of this test's namespace from Redis, as a flush would."""
    client = fleet.client.log.client
    keys = list(client.scan_iter(match=f"{fleet.settings.namespace}:log:*", count=1000))
    return int(client.delete(*keys)) if keys else 0


def _redis_holds_log(fleet: Fleet, run_id: str) -> bool:
    return bool(fleet.client.log.client.exists(fleet.client.log.keys(run_id).meta))


def test_a_log_lost_mid_run_and_after_settle_reads_back_identical(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.start_worker()
    run = fleet.client.submit(AGENT, PROMPT)
    fleet.wait_chunks(run.run_id, 8)
    followed: list[tuple[int, Chunk]] = []
    follower = threading.Thread(target=lambda: followed.extend(fleet.client.events(run.run_id)))
    follower.start()  # parked on the log when it is lost: it reads on from its cursor
    before = fleet.log_of(run.run_id)
    assert lose_logs(fleet) == 2  # the stream and its meta
    assert not _redis_holds_log(fleet, run.run_id)
    # The next read rebuilds it: the same seqs and chunks, at least as far as before.
    after = fleet.log_of(run.run_id)
    assert after[: len(before)] == before
    assert fleet.client.log.state(run.run_id).epoch == 1

    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (1, 1)
    _assert_log_is_oracle(fleet, done, tmp_path)  # the owner carried on, nothing doubled
    _assert_transcript_once(fleet, done)

    settled = fleet.log_of(run.run_id)
    follower.join()
    assert followed == settled  # each chunk once, in order, across the loss
    assert lose_logs(fleet) == 2
    rebuilt = fleet.log_of(run.run_id)
    assert rebuilt == settled  # element by element, final chunk included
    state = fleet.client.log.state(run.run_id)
    assert (state.closed, state.first_seq, state.last_seq) == (True, 1, len(settled))
    assert list(fleet.client.events(run.run_id)) == settled  # a follower ends at once


def test_a_zombie_after_the_loss_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_pair()
    run = fleet.client.submit(AGENT, PROMPT)
    fleet.wait_chunks(run.run_id, 8)
    frozen = fleet.client.require(run.run_id)
    pgid = fleet.signal_worker_of(frozen, signal.SIGSTOP)
    try:
        fleet.wait(run.run_id, lambda r: r.epoch == 2, what="a takeover")
        lose_logs(fleet)  # the successor's fence is rebuilt from Postgres's epoch
        done = fleet.wait_settled(run.run_id)
        lose_logs(fleet)
        settled = fleet.log_of(run.run_id)  # rebuilt, closed, at epoch 2
    finally:
        os.killpg(pgid, signal.SIGCONT)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert fleet.client.log.state(run.run_id).epoch == 2
    (event,) = fleet.wait_events(
        "attempt.stopped", needle=frozen.attempt_id or "", files="worker-*.log"
    )
    assert event["epoch"] == 1
    assert fleet.log_of(run.run_id) == settled
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)


def _nonce_of(placement: Placement) -> str:
    (journal,) = placement.journals
    return journal.handle.nonce


def test_a_sentinel_stored_with_the_sandbox_gone_finishes_from_the_segments(
    settings: Any, tmp_path: Path
) -> None:
    """The worker died between storing the sentinel and marking the journal consumed,
    and the sandbox went with it: the run finishes from the segments, the agent is
    not run again, and the nonce reaches no client."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="sentinel-stored")
    try:
        fleet.start_pair()
        run = fleet.client.submit(AGENT, PROMPT)
        reached = marker(fleet.settings, "sentinel-stored")
        while not reached.exists():
            time.sleep(0.05)
        owned = fleet.client.require(run.run_id)
        nonce = _nonce_of(Placement.of(owned))
        _lose_owner_and_sandbox(fleet, owned)
        lose_logs(fleet)  # and Redis lost the log too: rebuilt from the same segments
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert done.epoch == 2
        _assert_log_is_oracle(fleet, done, tmp_path)
        _assert_transcript_once(fleet, done)
        _assert_segments_whole(fleet, done)  # one agent process: nothing ran again
        assert len(Placement.of(done).journals) == 1
        published = b"".join(orjson.dumps(chunk) for _, chunk in fleet.log_of(run.run_id))
        assert nonce.encode() not in published
        transcript = b"".join(orjson.dumps(e.body) for e in fleet.client.transcript(run.session_id))
        assert nonce.encode() not in transcript
        lose_logs(fleet)
        rebuilt = b"".join(orjson.dumps(chunk) for _, chunk in fleet.log_of(run.run_id))
        assert rebuilt == published
    finally:
        fleet.stop()


@pytest.mark.parametrize("max_chunks", [7])
def test_a_trimmed_log_is_taken_over(settings: Any, tmp_path: Path, max_chunks: int) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", log_max_chunks=max_chunks)
    try:
        fleet.start_pair()
        run = fleet.client.submit(AGENT, PROMPT)
        while fleet.client.log.state(run.run_id).first_seq < 5:  # trimmed past seq 4
            time.sleep(0.02)
        fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert done.epoch == 2
        oracle: list[Chunk] = _oracle(done, tmp_path)
        state = fleet.client.log.state(run.run_id)
        kept = fleet.client.log.snapshot(run.run_id, after_seq=state.first_seq - 1)
        assert len(oracle) > max_chunks
        assert kept == list(enumerate(oracle, start=1))[-max_chunks:]
        _assert_transcript_once(fleet, done)
    finally:
        fleet.stop()


def test_a_stored_custom_chunk_the_replay_does_not_make_is_a_divergence(fleet: Fleet) -> None:
    """A CUSTOM chunk in the log that the journal does not produce (here spliced in
    while the owner was frozen) is no longer skipped: the takeover refuses it."""
    fleet.start_pair()
    run = fleet.client.submit(AGENT, PROMPT)
    fleet.wait_chunks(run.run_id, 8)
    owned = fleet.client.require(run.run_id)
    pgid = fleet.signal_worker_of(owned, signal.SIGSTOP)
    stored = [chunk for _, chunk in fleet.log_of(run.run_id)]
    spliced: Chunk = {"type": "CUSTOM", "name": "turnkeeper.note", "value": {"n": 1}}
    tampered = [*stored[:4], spliced, *stored[4:]]
    lose_logs(fleet)
    raw = RunLog.from_settings(fleet.settings)  # no source: writes exactly what it is given
    raw.fence(run.run_id, owned.epoch)
    raw.append(run.run_id, owned.epoch, 1, tampered)
    raw.client.close()
    os.killpg(pgid, signal.SIGKILL)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.FAILED, fleet.dump_logs()
    assert done.error["reason"] == "diverged"
    assert done.epoch == 2
    log = fleet.log_of(run.run_id)
    assert [chunk for _, chunk in log[:-1]] == tampered
    assert (log[-1][1]["type"], log[-1][1]["code"]) == ("RUN_ERROR", "diverged")
    assert "seq 5" in log[-1][1]["message"]


def test_a_zombie_woken_after_a_loss_before_any_adoption_is_refused(
    fleet: Fleet, database_url: str, tmp_path: Path
) -> None:
    """One worker slot, frozen past its lease: the run is handed over (epoch 2) but
    nobody can adopt it. Redis loses the log; a read rebuilds it with the fence at
    Postgres's epoch, the only fence there is now. The zombie wakes: refused, it leaves
    its turn, its slot adopts the takeover, and the log is the oracle."""
    fleet.start_worker()
    fleet.start_beat()
    run = fleet.client.submit(AGENT, PROMPT)
    while len(fleet.log_of(run.run_id)) < 8:
        time.sleep(0.02)
    frozen = fleet.client.require(run.run_id)
    pgid = fleet.signal_worker_of(frozen, signal.SIGSTOP)
    try:
        handed = fleet.wait(run.run_id, lambda r: r.awaiting_adoption, what="a handover")
        assert (handed.epoch, handed.attempt_count) == (2, 1)
        assert lose_logs(fleet) == 2
        before = fleet.log_of(run.run_id)  # rebuilt from Postgres
        state = fleet.client.log.state(run.run_id)
        assert (state.epoch, state.closed, state.last_seq) == (2, False, len(before))
    finally:
        os.killpg(pgid, signal.SIGCONT)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (2, 2)
    assert _attempts(database_url, run.run_id) == [(1, "superseded"), (2, "completed")]
    (event,) = fleet.wait_events(
        "attempt.stopped", needle=frozen.attempt_id or "", files="worker-*.log"
    )
    assert event["epoch"] == 1
    stored = fleet.log_of(run.run_id)
    assert stored[: len(before)] == before
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)
